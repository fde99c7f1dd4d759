// SPDX-License-Identifier: MIT
// Subcommand table and top-level error handling. The only place that decides how the process
// ends: CollectiveError (ConfigError: exit 2) -> rank 0 prints every problem, all ranks exit with
// its code (or, raised on some ranks only, the job is aborted with it); Error -> the rank that saw
// it prints, the job is aborted with the error's class as exit code.
#include "atlas/app/app.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/app/commands.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/mpi/agree.hpp"

namespace atlas::app {

namespace {

struct CommandEntry {
  const char* name;
  const char* operands;  ///< what follows the name (atlas NAME --help)
  const char* summary;
  int (*run)(Context&);
  /// Runs on one process without MPI (needs_mpi): models, reports, converts; no communicator.
  bool offline = false;
};

// One line per subcommand (a new subcommand = one entry here + one file in src/app/).
const CommandEntry kCommands[] = {
    {"train", "DECK [key=value ...]", "train the deck's model (SPMD: mpirun -np N atlas train DECK)", cmd_train},
    {"schedule", "DECK [key=value ...]", "print the static schedule tables (Gantt, step time, bubbles) for a deck", cmd_schedule, true},
    {"plan", "DECK [key=value ...]", "pick DCs and GPU counts for a deck (what-if table)", cmd_plan, true},
    {"simulate", "DECK [key=value ...]", "simulate the deck's job at scale (discrete events over the schedule table)", cmd_simulate, true},
    {"report", "RUN_DIR", "summarise a run directory (text + PNG Gantt chart)", cmd_report, true},
    {"bench", "NAME [DECK] [key=value ...] (atlas bench NAME --help)", "side-by-side benchmarks:", cmd_bench},
    {"profile", "[options]", "measure per-block compute cost on this machine into profiles/", cmd_profile},
    {"export", "CKPT --format hf --out DIR", "write a checkpoint as a Hugging Face GPT-2 model (--format hf --out DIR)", cmd_export},
    {"import", "--format hf DIR --out CKPT_DIR [--deck DECK] [key=value ...]", "a Hugging Face GPT-2 model directory to a checkpoint to fine-tune from", cmd_import},
    {"tokenize", "TEXT... --out DIR [--tokenizer byte|gpt2] [--val-fraction F] [--shard-tokens N]",
     "text files to llm.c token shards for data.format = shards (train_*.bin, val_*.bin)", cmd_tokenize, true},
    {"sample", "CKPT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--samples N]",
     "text from a checkpoint (greedy, temperature, top-k, top-p sampling)", cmd_sample},
    {"eval", "CKPT [data.KEY=VALUE ... train.eval_batches=N train.micro_batch_size=B] [--batches N] [--device host|cuda] [--json FILE]",
     "a checkpoint's validation loss and perplexity on its own data or on other data", cmd_eval},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: atlas <command> [DECK] [key=value ...] [options]\n\ncommands:\n");
  for (const auto& c : kCommands) {
    // The benchmarks' names from their registry (src/app/bench_cmd.cpp), so none is left out.
    const std::string summary = c.run == cmd_bench ? std::string(c.summary) + " " + bench_names() : c.summary;
    std::fprintf(out, "  %-9s %s\n", c.name, summary.c_str());
  }
  std::fprintf(out,
               "\ncommon options:\n  --help-deck   list every deck key with its default and help\n"
               "  --help        this text\n"
               "\nexit codes: 0 ok, 1 usage, 2 config, 3 comm, 4 device, 5 I/O, 6 internal, 7 diverged,\n"
               "  8 stopped on request (atlas train: SIGUSR1 writes a checkpoint and stops; resume with\n"
               "  run.resume=latest)\n");
}

/// The command line asks for the usage text: no command, --help or -h.
bool asks_usage(int argc, char** argv) {
  return argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
}

/// A word after the command asks for the deck keys' help (text or markdown), whatever the command.
bool asks_deck_help(std::string_view word) { return word == "--help-deck" || word == "--help-deck-markdown"; }

}  // namespace

bool needs_mpi(int argc, char** argv) {
  // Started by a launcher (mpirun, srun): every rank joins MPI, whatever the command.
  if (mpi::Environment::launched()) return true;
  if (asks_usage(argc, argv)) return false;
  // A help text needs no communicator either (atlas train --help started Open MPI's singleton).
  for (int i = 2; i < argc; ++i)
    if (asks_deck_help(argv[i]) || std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0)
      return false;
  for (const auto& c : kCommands)
    if (std::strcmp(argv[1], c.name) == 0) return !c.offline;
  return false;  // an unknown command: the usage text
}

int run_app(mpi::Environment& env, int argc, char** argv) {
  const bool root = env.world_rank() == 0;
  if (asks_usage(argc, argv)) {
    if (root) usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? static_cast<int>(ExitCode::Usage) : 0;
  }
  const std::string name = argv[1];
  Context ctx{env, {}};
  for (int i = 2; i < argc; ++i) ctx.args.emplace_back(argv[i]);
  for (const auto& a : ctx.args) {
    if (!asks_deck_help(a)) continue;
    const deck::Schema& schema = deck::Schema::instance();
    if (root) std::fputs((a == "--help-deck" ? schema.help_text() : schema.markdown()).c_str(), stdout);
    return 0;
  }
  const CommandEntry* cmd = nullptr;
  for (const auto& c : kCommands)
    if (name == c.name) cmd = &c;
  if (!cmd) {
    if (root) {
      std::fprintf(stderr, "ERROR: unknown command '%s'\n", name.c_str());
      usage(stderr);
    }
    return static_cast<int>(ExitCode::Usage);
  }

  try {
    return cmd->run(ctx);
  } catch (const CollectiveError& e) {
    // Collective when every rank raised it: rank 0 speaks for all. A rank that raised it alone
    // (an error no agreement reached) must not return while the others wait for it in their next
    // collective: settle_collective_error reports it and aborts the job after a few seconds.
    mpi::settle_collective_error(e, env.verdict_comm());
    if (root) {
      for (const auto& p : e.problems()) std::fprintf(stderr, "ERROR: %s\n", p.c_str());
      std::fflush(stderr);
    }
    return static_cast<int>(e.code());
  } catch (const HelpRequested& h) {
    if (root) {
      const bool has_options = std::string_view(cmd->operands).find("[options]") != std::string_view::npos;
      std::printf("usage: atlas %s %s%s\n  %s\n", name.c_str(), cmd->operands, has_options ? "" : " [options]",
                  cmd->summary);
      if (!h.value_options.empty() || !h.flags.empty()) std::printf("\noptions:\n");
      // "--NAME ARG" then what it does, from the command's OptionHelp ("ARG: text"), else VALUE.
      for (const auto& o : h.value_options) {
        const auto it = h.help.find(o);
        const std::string text = it == h.help.end() ? std::string("VALUE") : it->second;
        const auto colon = text.find(": ");
        const std::string arg = colon == std::string::npos ? text : text.substr(0, colon);
        if (colon == std::string::npos)
          std::printf("  --%s %s\n", o.c_str(), arg.c_str());
        else
          std::printf("  --%-28s%s\n", (o + " " + arg).c_str(), text.substr(colon + 2).c_str());
      }
      for (const auto& f : h.flags) {
        const auto it = h.help.find(f);
        if (it == h.help.end())
          std::printf("  --%s\n", f.c_str());
        else
          std::printf("  --%-28s%s\n", f.c_str(), it->second.c_str());
      }
      if (std::string_view(cmd->operands).find("key=value") != std::string_view::npos)
        std::printf("\nkey=value overrides a deck key (atlas %s --help-deck lists them); the command's\n"
                    "documentation is in README.md and docs/.\n", name.c_str());
      else
        std::printf("\nThe command's documentation is in README.md and docs/.\n");
    }
    return 0;
  } catch (const UsageError& e) {
    if (root) std::fprintf(stderr, "ERROR: %s\n  hint: atlas %s --help\n", e.what(), name.c_str());
    return static_cast<int>(ExitCode::Usage);
  } catch (const Error& e) {
    log::error("{}", e.what());
    if (env.world_size() > 1) mpi::Environment::abort(static_cast<int>(e.code()));
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    log::error("internal error: {}", e.what());
    if (env.world_size() > 1) mpi::Environment::abort(static_cast<int>(ExitCode::Internal));
    return static_cast<int>(ExitCode::Internal);
  }
}

}  // namespace atlas::app
