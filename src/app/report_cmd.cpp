// SPDX-License-Identifier: MIT
// `atlas report RUN_DIR [--step N] [--out PNG] [--json FILE] [--skip-steps K] [--no-png]
// [--against PROFILE]`: runs
// scripts/report/atlas_report.py (the summary and the Gantt chart live there, in Python, next to
// h5py and matplotlib). This file only finds the script and the Python, and passes the options.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "atlas/app/commands.hpp"
#include "atlas/app/report_script.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/paths.hpp"

extern char** environ;

namespace atlas::app {

namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& def) {
  return env::get(name).value_or(def);
}

}  // namespace

std::string find_report_script(const std::string& name) {
  std::vector<fs::path> tried;
  if (const auto root = env::get("ATLAS_ROOT"))
    tried.push_back(fs::path(*root) / "scripts" / "report" / name);
  for (const fs::path& dir : core::data_dirs()) tried.push_back(dir / "scripts" / "report" / name);
  std::error_code ec;
  std::string list;
  for (const auto& p : tried) {
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
    list += "\n  " + p.string();
  }
  ATLAS_THROW(Io, "cannot find scripts/report/" << name << "; looked in:" << list
                  << "\n  hint: install atlas (cmake --install), or set ATLAS_ROOT to the atlas checkout");
}

std::string report_python() {
  const std::string py = env_or("ATLAS_PYTHON", "/usr/bin/python3");
  // Run by path, never looked up in PATH: a bare name would be this directory's file.
  if (py.find('/') == std::string::npos)
    ATLAS_THROW(Io, "cannot run the report: ATLAS_PYTHON = " << py << " is not a path\n  hint: set ATLAS_PYTHON to a "
                    "python3's path, e.g. ATLAS_PYTHON=$(command -v " << py << ")");
  if (::access(py.c_str(), X_OK) != 0)
    ATLAS_THROW(Io, "cannot run the report: " << py << " is not an executable ("
                    << std::strerror(errno) << ")\n  hint: apt-get install python3 python3-h5py "
                    "python3-matplotlib, or set ATLAS_PYTHON to a python3 that has h5py and matplotlib");
  return py;
}

int run_report_script(const std::string& script, const std::vector<std::string>& args) {
  const std::string py = report_python();
  std::vector<std::string> words{py, script};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = -1;
  if (const int rc = ::posix_spawn(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ); rc != 0)
    ATLAS_THROW(Io, "cannot start " << py << " " << script << ": " << std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) ATLAS_THROW(Io, "waitpid for " << script << ": " << std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return static_cast<int>(ExitCode::Internal);
}

int cmd_report(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  const Args args = parse_args(ctx.args, {"step", "out", "json", "skip-steps", "against"}, {"no-png"},
                               {{"step", "N: the step drawn in the Gantt chart (the last)"},
                                {"out", "PNG: the chart's file (RUN_DIR/gantt.png)"},
                                {"json", "FILE: also the summary's numbers as JSON"},
                                {"skip-steps", "K: leave the first K recorded steps (warm-up) out (0)"},
                                {"against", "PROFILE: compare with another profile.h5 or run, step by step"},
                                {"no-png", "the summary only"}});
  if (args.positional.size() != 1)
    throw UsageError("atlas report needs one run directory: atlas report runs/NAME [--step N] "
                     "[--out PNG] [--json FILE] [--skip-steps K] [--no-png] [--against PROFILE]");
  if (!args.overrides.empty())
    throw UsageError("atlas report takes no key=value overrides (got '" + args.overrides.front() + "')");
  std::vector<std::string> script_args{args.positional.front()};
  for (const char* opt : {"step", "skip-steps"})
    if (args.flag(opt)) script_args.insert(script_args.end(), {std::string("--") + opt,
                                                               std::to_string(args.int_option(opt, 0))});
  for (const char* opt : {"out", "json", "against"})
    if (args.flag(opt)) script_args.insert(script_args.end(), {std::string("--") + opt, args.option(opt)});
  if (args.flag("no-png")) script_args.emplace_back("--no-png");
  return run_report_script(find_report_script("atlas_report.py"), script_args);
}

}  // namespace atlas::app
