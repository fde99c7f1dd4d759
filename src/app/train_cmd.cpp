// SPDX-License-Identifier: MIT
// `atlas train DECK [key=value ...]`: the SPMD training job. Phases as in HPCG: setup,
// pre-flight validation, train loop, teardown. Wiring only; the algorithms live in their rooms.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/app/train_output.hpp"
#include "atlas/app/training_job.hpp"
#include "atlas/bubbletea/service.hpp"
#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/signals.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/io/dir_lock.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/shards.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/mpi/tags.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/runtime/costing.hpp"
#include "atlas/runtime/fault.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sched/mfu.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::app {

namespace fs = std::filesystem;

namespace {

/// Pre-flight: a verifiable payload round-trips with every WAN peer before training starts, so a
/// broken link fails now with a clear message instead of mid-step.
void preflight_wan(wan::PeerTransport& t, const std::vector<int>& peers, int me) {
  constexpr std::size_t kWords = 4096;
  constexpr int kTag = mpi::tags::kWanPreflight;
  std::vector<std::vector<std::uint32_t>> out(peers.size()), in(peers.size());
  std::vector<wan::Handle> handles;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    out[i].resize(kWords);
    in[i].resize(kWords);
    for (std::size_t w = 0; w < kWords; ++w) out[i][w] = static_cast<std::uint32_t>(me * 2654435761u + w * 40503u + static_cast<std::uint32_t>(peers[i]));
    handles.push_back(t.irecv(peers[i], kTag, in[i].data(), kWords * 4));
    handles.push_back(t.isend(peers[i], kTag, out[i].data(), kWords * 4));
  }
  wan::wait_all(t, handles);
  for (std::size_t i = 0; i < peers.size(); ++i)
    for (std::size_t w = 0; w < kWords; ++w) {
      const auto expect = static_cast<std::uint32_t>(peers[i] * 2654435761u + w * 40503u + static_cast<std::uint32_t>(me));
      if (in[i][w] != expect)
        ATLAS_THROW(Comm, "pre-flight payload from rank " << peers[i] << " is corrupt at word " << w);
    }
}

/// A diverged model ends the run before any checkpoint of the step is written, on every rank with
/// the same error (ExitCode::Diverged). Every rank knows the gradient norm: a sum over its
/// pipeline of DP-summed gradients, so a non-finite one is non-finite everywhere. Only rank 0
/// knows the losses: it remembers the first non-finite one (`first_bad_loss`, -1: none). On the
/// steps that are evaluated or checkpointed (`share`) its view is shared at once (one small
/// all-reduce, waited for: before that step's checkpoint); on the other logged steps it travels
/// with the progress row's job-wide sum, which nobody waits for (TrainOutput::step), and stops the
/// run at the next logged step, when that sum is in everywhere (TrainOutput::lagged_bad_loss).
/// So a logged step never makes the job wait for its slowest rank, and no checkpoint of a
/// diverged step is written.
void check_finite(const runtime::StepReport& rep, std::optional<double> val, bool share, bool logged,
                  const mpi::Comm& world, TrainOutput& out, int& first_bad_loss) {
  const bool norm_bad = !std::isfinite(rep.grad_norm);
  if (world.rank() == 0 && first_bad_loss < 0 && (!std::isfinite(rep.loss) || (val && !std::isfinite(*val))))
    first_bad_loss = rep.step;
  int bad = norm_bad || first_bad_loss >= 0 ? 1 : 0;
  if (share) {
    out.flush_row();  // this step's row first: the check waits for every rank anyway
    bad = world.allreduce(bad, MPI_MAX);
  } else if (logged && out.lagged_bad_loss()) {
    out.flush_row();
    bad = 1;
  } else if (!norm_bad) {
    return;
  } else {
    // The norm is the job's (every rank is here): the progress row's job-wide sum that this step
    // may have started completes before the throw unwinds its buffer (TrainOutput::m_job).
    out.flush_row();
  }
  if (bad == 0) return;
  const std::string earlier = first_bad_loss >= 0 && first_bad_loss < rep.step
                                  ? fmt::format(" (the first non-finite loss was at step {})", first_bad_loss)
                                  : std::string();
  // A NaN's sign bit is noise (inf - inf gives -nan): every one reads "nan".
  const auto num = [](double x) { return std::isnan(x) ? std::string("nan") : fmt::format("{:.4g}", x); };
  const std::string what = fmt::format(
      "training diverged at step {}: loss {}{}, gradient norm {}{} (not finite); the run stops before writing "
      "any checkpoint of this step, and the checkpoints and metrics written before it are kept\n"
      "  hint: lower train.lr or model.init_std, lengthen train.warmup_steps or set train.grad_clip; resume from "
      "the last good checkpoint with run.resume = latest",
      rep.step, num(rep.loss), val ? ", validation loss " + num(*val) : std::string(), num(rep.grad_norm), earlier);
  out.diverged(rep.step, what);
  throw CollectiveError(ExitCode::Diverged, {what});
}

/// True on every rank when the directories `a` and `b` both exist and are one directory (through
/// symbolic links too). Rank 0 decides and broadcasts, so every rank takes the same branch into
/// the collectives that follow. Collective over `world`.
bool same_directory(const mpi::Comm& world, const std::string& a, const std::string& b) {
  int same = 0;
  if (world.rank() == 0) {
    std::error_code ec;
    same = fs::equivalent(a, b, ec) && !ec ? 1 : 0;
  }
  world.bcast(std::span<int>(&same, 1), 0);
  return same != 0;
}

JobResult train(const Config& cfg, const mpi::Comm& world, const JobOptions& opt, TrainOutput& out);

}  // namespace

JobResult run_training_job(const Config& cfg, const mpi::Comm& world, const JobOptions& opt) {
  const bool root = world.rank() == 0;
  // Data residency (cluster.may_hold_data) is a constraint, not advice: a run that puts the
  // stages that read the data or hold the embedding in a DC marked 0 does not start (simulate
  // only warned; train started silently). An emulated run holds no data: it is told.
  if (const std::vector<std::string> v = plan::residency_violations(cfg); !v.empty()) {
    if (cfg.device.backend != Backend::Emulated) throw ConfigError(v);
    if (root)
      for (const auto& w : v) log::warn("{} (device.backend = emulated holds no data: the rehearsal runs)", w);
  }
  // The training data is found before anything starts or is written (the run directory, the WAN
  // transport): a shard pattern that matches nothing, overlapping shard lists or a corpus
  // directory without text fail at once. Rank 0 looks (it holds the first stage, which reads the
  // data); the loaders check the files themselves again when they open them.
  if (cfg.device.backend != Backend::Emulated) {
    (void)mpi::agree_on_root(world, 0, [&] {
      if (cfg.data.format == DataFormat::Shards)
        model::check_shard_lists(model::expand_shard_globs(cfg.data.train_shards, "data.train_shards"),
                                 model::expand_shard_globs(cfg.data.val_shards, "data.val_shards"));
      else
        (void)model::Corpus::text_files(cfg.data.corpus_dir);
      return std::string();
    });
  }
  // ---- one job per run directory, before anything is written there (collective) ----
  const io::DirLock run_lock = io::DirLock::acquire(
      world, cfg.run_dir(), "run directory",
      fmt::format("give this job its own run.name (e.g. run.name={}_2) or run.out_dir, or wait "
                  "until that job has ended",
                  cfg.run.name));
  // The checkpoint directory is locked too, wherever it lies: a job's own default one (inside
  // its run directory) must stop another job whose ckpt.dir points there, which the run
  // directory's lock does not (that job locks its own run directory). ckpt_dir/.lock is another
  // file than run_dir/.lock, so a job never meets its own lock, unless ckpt.dir is the run
  // directory itself, which the run lock already covers.
  io::DirLock ckpt_lock;
  const bool may_checkpoint = cfg.ckpt.every_steps > 0 || cfg.ckpt.final ||
                              (opt.stop_on_request && cfg.device.backend != Backend::Emulated);
  if (may_checkpoint &&
      !same_directory(world, cfg.ckpt_dir(), cfg.run_dir())) {
    ckpt_lock = io::DirLock::acquire(world, cfg.ckpt_dir(), "checkpoint directory",
                                     "give this job its own ckpt.dir, or wait until that job "
                                     "has ended");
  }
  // run.resume = PATH is looked at before anything is moved aside (a fresh timeline's files, or
  // a roll-back's later steps): a PATH with a typo must not cost the run its checkpoints' place.
  if (!cfg.run.resume.empty() && cfg.run.resume != "latest")
    mpi::agree(world, "checking run.resume", [&] {
      if (world.rank() != 0) return;
      std::error_code ec;
      const fs::file_status st = fs::status(cfg.run.resume, ec);
      if (!fs::exists(st) || fs::is_directory(st))
        (void)io::inspect_checkpoint(cfg.run.resume);  // its message: missing, or a directory's newest file
      if (!fs::is_regular_file(st))
        throw ConfigError("run.resume = " + cfg.run.resume + " is not a regular file\n  hint: name a checkpoint "
                          "file (CKPT_DIR/step-NNNNNN.h5), or run.resume = latest");
    });
  TrainOutput out(cfg, root, opt.quiet, /*sets_aside=*/opt.stop_on_request, /*owns_ckpt_dir=*/may_checkpoint);
  try {
    return train(cfg, world, opt, out);
  } catch (const CollectiveError& e) {
    out.failed(e.problems(), static_cast<int>(e.code()));
    throw;
  } catch (const Error& e) {
    out.failed({e.what()}, static_cast<int>(e.code()));
    throw;
  } catch (const std::exception& e) {
    out.failed({e.what()}, static_cast<int>(ExitCode::Internal));
    throw;
  }
}

namespace {

/// The job after its locks and run directory (run_training_job): errors go on to the caller,
/// which writes them into log.txt too.
JobResult train(const Config& cfg, const mpi::Comm& world, const JobOptions& opt, TrainOutput& out) {
  const bool root = world.rank() == 0;
  // ---- setup: layout -> communicators -> backend -> schedule -> transport -> model ----
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  const topo::Coord me = layout.coord(comms.world.rank());

  out.header(opt.deck_path, layout);
  out.text(device::autogroup_note(world.allgather_strings(device::scheduling_group()), world.rank()));
  const std::string map = topo::rank_map(comms.world, layout, cfg.cluster.dcs);
  out.text(map);

  std::unique_ptr<device::Backend> backend = device::make_backend(cfg.device);
  // The table is costed for the device and the host the run is on (rank 0's, so every rank builds
  // one table).
  const runtime::CostedRun costed = runtime::costed_run(comms.world, cfg, backend->describe());
  out.text(costed.note);
  const sched::ScheduleTable table = sched::build_schedule(costed.cfg, layout);
  // The memory model atlas schedule and simulate check (which refuses a misfit): a run it says
  // does not fit is told before it allocates (it met the allocator's failure, or the OOM killer,
  // with no key named). A warning: the model is an estimate, and a run may still fit.
  if (world.rank() == 0 && cfg.device.backend != Backend::Emulated) {
    const sched::ScheduleMemory mem = sched::memory_per_gpu(costed.cfg, layout, table);
    if (!mem.fits())
      log::warn("{}", sched::memory_misfit(mem, table, costed.cfg, sched::device_profile(costed.cfg).name));
  }

  // ---- pre-flight validation ----
  const auto hash = static_cast<unsigned long long>(table.structure_hash());
  {
    // Gathered, so every rank names the same culprits and raises the same config error: the
    // resolved deck (other transports or timeouts would hang, not fail) and the table.
    const std::size_t n = static_cast<std::size_t>(comms.world.size());
    std::vector<std::uint64_t> hashes(2 * n);
    const std::array<std::uint64_t, 2> mine{sched::text_hash(deck::resolved_deck(cfg)), hash};
    ATLAS_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_UINT64_T, hashes.data(), 2, MPI_UINT64_T, comms.world.get()));
    std::vector<std::uint64_t> decks(n), tables(n);
    for (std::size_t r = 0; r < n; ++r) {
      decks[r] = hashes[2 * r];
      tables[r] = hashes[2 * r + 1];
    }
    if (const std::string why = sched::deck_mismatch(decks); !why.empty()) throw ConfigError(why);
    if (const std::string why = sched::table_mismatch(tables); !why.empty()) throw ConfigError(why);
  }
  out.schedule(table);

  const std::vector<int> peers = layout.wan_peers(me);
  std::unique_ptr<wan::PeerTransport> transport =
      wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, peers);
  if (!peers.empty()) preflight_wan(*transport, peers, comms.world.rank());
  comms.world.barrier();
  out.text(fmt::format("# pre-flight: schedule hash {:016x} agreed by {} ranks; {} WAN transport up ({} rails per peer)\n",
                       hash, world.size(), transport->name(), cfg.wan.rails));

  const std::size_t reserve = cfg.profile.enabled
                                  ? static_cast<std::size_t>(cfg.run.steps) * (table.row(me.stage, me.dp).size() + 8) *
                                            (cfg.bubbletea.enabled ? 3 : 1) + 64
                                  : 0;
  runtime::Profiler profiler(cfg.profile.enabled, comms.world.rank(), reserve);
  runtime::Trainer trainer(cfg, layout, comms, table, transport.get(), *backend, profiler);
  const int start_step = out.resume(trainer, comms);
  if (start_step >= cfg.run.steps) {
    // A finished run resumed again (a Slurm requeue, the same command twice): nothing to train,
    // and the run's results (run.json, profile.h5, trace.json) stay the ones its steps wrote.
    out.text(fmt::format("# nothing to train: the checkpoint is at step {}, {} run.steps = {}; run.json, "
                         "profile.h5 and trace.json are left as they were\n#   hint: raise run.steps to "
                         "train on from step {} (the cosine decay then stretches to the new length: the learning "
                         "rate rises again; set train.min_lr = train.lr to keep it at the floor)\n",
                         start_step, start_step == cfg.run.steps ? "which is" : "past", cfg.run.steps, start_step));
    out.nothing_to_train(start_step);
    return JobResult{};
  }
  out.started(start_step);

  // ---- BubbleTea: inference prefill in the bubbles (bubbletea.enabled; collective set-up) ----
  std::unique_ptr<bubbletea::Service> bubbletea;
  if (cfg.bubbletea.enabled) {
    bubbletea = std::make_unique<bubbletea::Service>(costed.cfg, layout, comms, table, *backend, profiler);
    trainer.set_bubble_filler(bubbletea.get());
    out.text(bubbletea->setup_summary());
  }

  // ---- train loop ----
  JobResult result;
  result.predicted_step_ms = table.step_ms;
  result.predicted_bubble = table.mean_bubble_fraction();
  RankTime timed_time;  // this rank's timed steps (the per-rank table's sums)
  double allreduce = 0.0;
  long long buckets = 0, buckets_early = 0;
  int timed = 0;
  profiler.sync_epoch(comms.world);
  if (bubbletea) bubbletea->start();
  if (cfg.device.backend == Backend::Cuda) {  // MFU on a GPU (docs/gpu.md)
    const Precision precision = effective_precision(cfg.device);
    out.mfu_basis(sched::model_flops_per_token(cfg.model),
                  sched::peak_flops(sched::device_profile(costed.cfg), precision), world.size(),
                  fmt::format("the {} profile's dense {} peak", to_string(costed.cfg.plan.gpu), to_string(precision)));
  }
  out.columns();
  // A collective error raised inside the loop by some ranks only (the others wait for them in a
  // receive) is settled here, while the transport they wait on still stands: otherwise its
  // goodbye would make them fail first, with another error and exit code.
  const mpi::Comm verdict = comms.world.dup();
  int first_bad_loss = -1;  // rank 0: the first step whose loss was not finite
  try {
    for (int step = start_step; step < cfg.run.steps; ++step) {
      out.begin_step(step);
      runtime::maybe_inject_kill("ATLAS_FAULT_KILL", comms.world.rank(), step, !cfg.run.resume.empty());
      runtime::maybe_inject_hang("ATLAS_FAULT_HANG", comms.world.rank(), step, !cfg.run.resume.empty());
      runtime::maybe_inject_config_error("ATLAS_FAULT_CONFIG_ERROR", comms.world.rank(), step, !cfg.run.resume.empty());
      if (runtime::fault_requested("ATLAS_FAULT_NAN", comms.world.rank(), step, !cfg.run.resume.empty()) &&
          !trainer.emulated())
        trainer.model().poison_first_parameter();
      runtime::StepReport rep = trainer.train_step(step);
      if (runtime::fault_requested("ATLAS_FAULT_NAN_LOSS", comms.world.rank(), step, !cfg.run.resume.empty()))
        rep.loss = std::numeric_limits<double>::quiet_NaN();
      if (bubbletea) bubbletea->after_step(rep);
      const bool last = step + 1 == cfg.run.steps;
      std::optional<double> val;
      // An emulated run computes no loss: no evaluation (the deck refuses train.eval_every_steps).
      if (!trainer.emulated() && (last || (cfg.train.eval_every_steps > 0 && (step + 1) % cfg.train.eval_every_steps == 0))) {
        runtime::maybe_inject_hang("ATLAS_FAULT_HANG_EVAL", comms.world.rank(), step, !cfg.run.resume.empty());
        val = trainer.evaluate();
      }
      out.step(rep, val, trainer.tokens_per_step(), comms);
      if (!trainer.emulated())  // no loss, no gradient norm to check
        // A step that is checkpointed (by the deck, or because the job stops on request after it)
        // is checked at once: no checkpoint of a diverged step is written.
        check_finite(rep, val, val.has_value() || out.checkpoint_due(step + 1, last) || (!last && out.stop_agreed()),
                     out.logged(step, val.has_value()), comms.world, out, first_bad_loss);
      out.maybe_checkpoint(trainer, comms, step + 1, last);
      result.losses.push_back(rep.loss);
      if (val) result.final_val_loss = *val;
      result.prefill_tokens += rep.prefill_tokens;
      // The first step pays one-time costs (allocation, first touch, TCP slow start): skip it in
      // the timing when there is more than one.
      if (step > start_step || cfg.run.steps - start_step == 1) {
        timed_time.add(rep);
        allreduce += rep.allreduce_s;
        buckets += rep.dp_buckets;
        buckets_early += rep.dp_buckets_early;
        ++timed;
      }
      // A stop request (SIGUSR1, core/signals.hpp) that every rank has heard of by now: the same
      // step everywhere (TrainOutput::stop_agreed).
      if (!last && out.stop_agreed()) {
        out.stop(trainer, comms, step + 1);
        result.stopped_at_step = step + 1;
        break;
      }
    }
  } catch (const CollectiveError& e) {
    mpi::settle_collective_error(e, verdict.get());
    throw;
  }
  result.steps_run = (result.stopped_at_step >= 0 ? result.stopped_at_step : cfg.run.steps) - start_step;

  // ---- teardown ----
  if (bubbletea) {
    trainer.set_bubble_filler(nullptr);
    const bubbletea::Report report = bubbletea->finish();
    out.text(bubbletea::format_report(report, cfg.cluster.dcs));
    out.set_job_prefill_tokens(report.prefill_tokens());
    if (root) bubbletea::write_json(report, (fs::path(cfg.run_dir()) / "bubbletea.json").string());
  }
  result.events = out.finish(trainer, comms, layout, table, profiler, *transport, *backend);
  const double util = timed_time.utilization();
  result.measured_utilization = comms.world.allreduce(util, MPI_SUM) / world.size();
  result.measured_bubble = 1.0 - result.measured_utilization;
  const double prefill_share = timed_time.wall > 0 ? timed_time.prefill / timed_time.wall : 0.0;
  result.measured_prefill = comms.world.allreduce(prefill_share, MPI_SUM) / world.size();
  result.prefill_tokens = comms.world.allreduce(static_cast<long long>(result.prefill_tokens), MPI_SUM);
  if (timed > 0) {
    result.mean_allreduce_s = comms.world.allreduce(allreduce / timed, MPI_SUM) / world.size();
    result.mean_compute_s = comms.world.allreduce(timed_time.compute / timed, MPI_SUM) / world.size();
  }
  const long long all_buckets = comms.world.allreduce(buckets, MPI_SUM);
  result.dp_buckets_early =
      all_buckets > 0 ? static_cast<double>(comms.world.allreduce(buckets_early, MPI_SUM)) / static_cast<double>(all_buckets) : 0.0;
  result.mean_step_s = timed > 0 ? timed_time.wall / timed : 0.0;
  result.timed_steps = timed;
  comms.world.bcast(std::span<double>(&result.mean_step_s, 1), 0);
  result.tokens_per_s = result.mean_step_s > 0 ? static_cast<double>(trainer.tokens_per_step()) / result.mean_step_s : 0.0;
  return result;
}

}  // namespace

int cmd_train(Context& ctx) {
  // SIGUSR1 from here on asks for a checkpoint and a clean stop instead of ending the process.
  const signals::StopRequests stop_requests;
  const Args args = parse_args(ctx.args, {}, {});
  const std::string path = deck_path(args, "train");
  const mpi::Comm world = mpi::Comm::world();
  deck::JobShape shape;
  shape.world_size = world.size();
  shape.cuda_built = cuda_built();
  const Config cfg = deck::load(world, path, args.overrides, shape);
  JobOptions opt;
  opt.deck_path = path;
  opt.stop_on_request = true;
  const JobResult r = run_training_job(cfg, world, opt);
  return r.stopped_at_step >= 0 ? static_cast<int>(ExitCode::Stopped) : 0;
}

}  // namespace atlas::app
