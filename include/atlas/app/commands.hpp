// SPDX-License-Identifier: MIT
// The subcommands of the atlas binary and their shared argument handling. Each cmd_* lives in
// its own src/app/<name>.cpp and holds wiring only (the algorithms live in their rooms).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/sim/measure.hpp"

namespace atlas::app {

/// A bad command line (exit code 1).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Help for a command's options: --NAME -> "ARG: what it does (default)" for value options, "what
/// it does" for flags. Options without an entry are listed by name alone.
using OptionHelp = std::map<std::string, std::string>;

/// `--help` or `-h` after a subcommand: run_app prints the subcommand's options and exits 0.
struct HelpRequested {
  std::vector<std::string> value_options;  ///< --NAME VALUE
  std::vector<std::string> flags;          ///< --NAME
  OptionHelp help;                         ///< what each does, where the command says
};

struct Context {
  mpi::Environment& env;
  std::vector<std::string> args;  ///< argv after the subcommand name
};

/// Command-line words split into: positional words, key=value deck overrides, --options.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> overrides;
  std::map<std::string, std::string> options;  ///< "--json FILE" -> {"json", "FILE"}; flags -> "1"

  [[nodiscard]] bool flag(const std::string& name) const { return options.count(name) > 0; }
  [[nodiscard]] std::string option(const std::string& name, const std::string& def = "") const;
  [[nodiscard]] int int_option(const std::string& name, int def) const;
  /// The option as an integer in [lo, hi] (def when absent); anything else, a word or a number
  /// out of range, is a UsageError naming the option, the range and what was given.
  [[nodiscard]] int int_option(const std::string& name, int def, int lo, int hi) const;
};

/// Splits `words`; `value_options` name the --options that take a value. Throws UsageError on an
/// option not in `value_options` or `flags`, and HelpRequested (with `help`) on --help / -h.
Args parse_args(const std::vector<std::string>& words, const std::vector<std::string>& value_options,
                const std::vector<std::string>& flags, const OptionHelp& help = {});

/// Throws UsageError when `args` holds an option that `mode` (a command's mode, e.g. "simulate
/// --compare") does not read: every option not in `allowed` (flags included).
void only_options(const Args& args, const std::string& mode, const std::vector<std::string>& allowed);
/// The deck path (first positional word) or a UsageError naming the command.
std::string deck_path(const Args& args, const char* command);

/// Parses and validates a deck for a one-process command (plan, schedule, simulate): the
/// world-size check is skipped because the deck describes a job, not this process. Reads the
/// deck's device profile files too (deck::read_device_profiles).
Config load_offline_deck(const std::string& path, const std::vector<std::string>& overrides);

/// The whole model of checkpoint `ckpt` (inspected as `contents`) on `backend`, one stage, no TP,
/// for `micro_batch_size` samples a micro-batch: `mc` with the checkpoint's model.* sizes, then
/// every parameter read (and checked against its CRC32C). Throws as io::read_checkpoint.
std::unique_ptr<model::StageModel> load_whole_model(const std::string& ckpt, const io::CheckpointContents& contents,
                                                    ModelCfg mc, int micro_batch_size, device::Backend& backend);

/// Throws UsageError unless this process is the job's only one (`command`: "export", "sample",
/// ...): the one-process commands read and write whole files with MPI_COMM_SELF.
void require_one_process(const Context& ctx, const char* command);

/// --device host|cuda of a one-process command (`command`: "sample", "eval") as a DeviceCfg, fp32.
/// Throws UsageError for another name, or cuda in a binary built without it.
DeviceCfg device_option(const Args& args, const char* command);

/// The deck stored in a checkpoint (`ckpt`, inspected as `contents`), parsed. std::nullopt when it
/// does not parse (a deck of another atlas version), after a WARNING on stderr naming the file
/// and `assumed`, what the caller takes instead (e.g. "the byte tokenizer (from model.vocab = 256)").
std::optional<Config> checkpoint_deck(const std::string& ckpt, const io::CheckpointContents& contents,
                                      const std::string& assumed);

/// For the simulator's commands (schedule, simulate, plan, bench sim), before their first run:
/// the heap keeps 64 MiB above its top when it grows or trims, so the schedule search's
/// per-candidate programs (hundreds of MB at 100k GPUs) reuse pages instead of faulting them in
/// again (2-4x fewer page faults; the slowest 100k-GPU runs on a shared machine were kernel time).
void keep_heap_for_reuse();

/// Times the real model's transformer block (forward, backward) on the host backend with
/// `threads` threads: the median of `repeats` after a warm-up (atlas profile --timer model).
sim::BlockTimer model_block_timer(int repeats, int threads);

/// True if this binary carries the CUDA backend.
bool cuda_built();

int cmd_train(Context& ctx);
int cmd_schedule(Context& ctx);
int cmd_plan(Context& ctx);
int cmd_simulate(Context& ctx);
int cmd_report(Context& ctx);
int cmd_bench(Context& ctx);
/// Every `atlas bench NAME`, comma-separated (the top-level usage lists them).
std::string bench_names();
int cmd_profile(Context& ctx);
int cmd_export(Context& ctx);
int cmd_import(Context& ctx);
int cmd_tokenize(Context& ctx);
int cmd_sample(Context& ctx);
int cmd_eval(Context& ctx);

}  // namespace atlas::app
