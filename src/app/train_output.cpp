// SPDX-License-Identifier: MIT
// Output of `atlas train` (see the header). Every file a run writes is written whole: to a
// temporary name first, then renamed, so a killed run never leaves half a file.
#include "atlas/app/train_output.hpp"

#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/core/units.hpp"
#include "atlas/io/checkpoint.hpp"

namespace atlas::app {

namespace fs = std::filesystem;

namespace {

void write_whole(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) ATLAS_THROW(Io, "cannot write " << tmp << ": check that the run directory is writable");
    f << text;
    if (!f.flush()) ATLAS_THROW(Io, "writing " << tmp << " failed (disk full?)");
  }
  fs::rename(tmp, p);
}

}  // namespace

TrainOutput::TrainOutput(const Config& cfg, bool root) : m_cfg(cfg), m_root(root), m_dir(cfg.run_dir()) {
  if (!m_root) return;
  std::error_code ec;
  fs::create_directories(m_dir, ec);
  if (ec) ATLAS_THROW(Io, "cannot create run directory " << m_dir << ": " << ec.message());
  write_whole(fs::path(m_dir) / "resolved.deck", deck::resolved_deck(cfg));
  m_log.open(fs::path(m_dir) / "log.txt", std::ios::app);
  const bool fresh = cfg.run.resume.empty() || !fs::exists(fs::path(m_dir) / "metrics.csv");
  m_metrics.open(fs::path(m_dir) / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
  if (fresh)
    m_metrics << "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,bubble_pct,compute_ms,intra_dc_ms,"
                 "wan_wait_ms,wan_mb_s,prefill_tokens\n";
}

void TrainOutput::print(const std::string& s) {
  if (!m_root) return;
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
  if (m_log.is_open()) {
    m_log << s;
    m_log.flush();
  }
}

void TrainOutput::text(const std::string& s) { print(s); }

void TrainOutput::header(const std::string& deck_path, const topo::Layout& layout) {
  std::string h = fmt::format("# atlas {} ({}, {}), {}, HDF5 {}, {}\n", build::kVersion, build::kGitSha,
                              build::kBuildType, mpi::Environment::library_version(), build::kHdf5Version,
                              build::kCompiler);
  h += fmt::format("# deck {} -> {}/resolved.deck\n", deck_path, m_dir);
  for (const auto& line : {std::string("# resolved deck:")}) h += line + "\n";
  std::istringstream in(deck::resolved_deck(m_cfg));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') h += "#   " + line + "\n";
  h += fmt::format("# job: {} ranks = {} stages x dp {} x tp {} over {} DCs; schedule {}; WAN {} ({} rails)\n",
                   layout.world_size(), layout.pp_size(), layout.dp_size(), layout.tp_size(), layout.dc_count(),
                   to_string(m_cfg.schedule.kind), to_string(m_cfg.wan.transport), m_cfg.wan.rails);
  print(h);
}

void TrainOutput::schedule(const sched::ScheduleTable& table) {
  std::string s = sched::gantt(table, m_cfg.cluster.dcs, 100);
  std::string out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out += (line.rfind("#", 0) == 0 ? line : "# " + line) + "\n";
  out += fmt::format("# predicted step {:.1f} ms, mean bubble {:.1f}%\n", table.step_ms, 100.0 * table.mean_bubble_fraction());
  print(out);
}

namespace {

/// Host views of every parameter shard for the checkpoint room (staged through host memory when
/// the backend's memory is not host-accessible).
struct HostShards {
  std::vector<std::vector<float>> value, m, v;  // staging (device backends only)
  std::vector<io::WriteShard> write;
  std::vector<io::ReadShard> read;
};

HostShards host_shards(model::StageModel& model, const topo::Coord& me, bool for_read) {
  HostShards h;
  device::Backend& be = model.backend();
  const bool direct = be.host_accessible();
  for (auto& p : model.params()) {
    // The first stage's "wte" is the one stored; the last stage's tied copy reads it back.
    if (p.tied_copy && !for_read) continue;
    const auto n = static_cast<std::size_t>(p.shard_numel());
    float* val = p.value.f32();
    float* am = p.adam_m.f32();
    float* av = p.adam_v.f32();
    if (!direct) {
      h.value.emplace_back(n);
      h.m.emplace_back(n);
      h.v.emplace_back(n);
      if (!for_read) {
        be.download(h.value.back().data(), p.value.data(), n * 4);
        be.download(h.m.back().data(), p.adam_m.data(), n * 4);
        be.download(h.v.back().data(), p.adam_v.data(), n * 4);
      }
      val = h.value.back().data();
      am = h.m.back().data();
      av = h.v.back().data();
    }
    const bool writer = me.dp == 0 && (me.tp == 0 || !p.replicated_over_tp);
    if (for_read)
      h.read.push_back({p.name, p.full_shape, p.shard_offset, p.shard_shape, writer, val, am, av});
    else
      h.write.push_back({p.name, p.full_shape, p.shard_offset, p.shard_shape, writer, val, am, av});
  }
  return h;
}

io::ModelShape shape_of(const ModelCfg& m) { return {m.layers, m.hidden, m.heads, m.seq_len, m.vocab}; }

}  // namespace

int TrainOutput::resume(runtime::Trainer& trainer, const topo::Communicators& comms) {
  const std::string path = io::resolve_resume(comms.world, m_cfg.run.resume, m_cfg.ckpt_dir());
  if (path.empty()) return 0;
  const topo::Coord me = trainer.layout().coord(comms.world.rank());
  HostShards h = host_shards(trainer.model(), me, true);
  io::ReadOptions opt;
  opt.expect_model = shape_of(m_cfg.model);
  const io::CheckpointMeta meta = io::read_checkpoint(comms.world, path, h.read, opt);
  // Copy back staged shards (device backends).
  device::Backend& be = trainer.model().backend();
  if (!be.host_accessible()) {
    std::size_t k = 0;
    for (auto& p : trainer.model().params()) {
      const auto n = static_cast<std::size_t>(p.shard_numel()) * 4;
      be.upload(p.value.data(), h.value[k].data(), n);
      be.upload(p.adam_m.data(), h.m[k].data(), n);
      be.upload(p.adam_v.data(), h.v[k].data(), n);
      ++k;
    }
  }
  if (auto it = meta.state.find("adam_t"); it != meta.state.end() && !it->second.empty())
    trainer.optimizer().set_step_count(static_cast<std::int64_t>(it->second[0]));
  if (auto it = meta.state.find("loader"); it != meta.state.end() && it->second.size() == 3 && trainer.has_train_loader()) {
    model::DataPosition pos{it->second[0], static_cast<std::int64_t>(it->second[1]), static_cast<std::int64_t>(it->second[2])};
    trainer.train_loader().restore(pos);
  }
  print(fmt::format("# resumed from {} at step {}\n", path, meta.step));
  return static_cast<int>(meta.step);
}

void TrainOutput::columns() {
  print(fmt::format("# {:>5} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "step", "loss",
                    "val", "lr", "tok/s", "step_ms", "bubble%", "comp_ms", "intra_ms", "wan_ms", "wan_MB/s",
                    "prefill"));
}

void TrainOutput::step(const runtime::StepReport& r, double val, std::int64_t tokens_per_step) {
  if (!m_root) return;
  if (m_timed_steps == 0 && m_first_loss == 0.0) m_first_loss = r.loss;
  m_last_loss = r.loss;
  if (!std::isnan(val)) m_last_val = val;
  m_sum_step_s += r.step_s;
  ++m_timed_steps;
  m_prefill_tokens += r.prefill_tokens;
  const double tok_s = static_cast<double>(tokens_per_step) / r.step_s;
  const double bubble = 100.0 * (1.0 - (r.compute_s + r.prefill_s) / r.step_s);
  const double wan_mb_s = r.boundary.wan_send_busy_s > 0 ? r.boundary.wan_bytes_sent / r.boundary.wan_send_busy_s / 1e6 : 0.0;
  const std::string val_s = std::isnan(val) ? std::string("-") : fmt::format("{:.4f}", val);
  if ((r.step + 1) % m_cfg.run.log_every_steps == 0 || r.step + 1 == m_cfg.run.steps || !std::isnan(val))
    print(fmt::format("  {:>5} {:>8.4f} {:>8} {:>9.2e} {:>9.0f} {:>8.1f} {:>7.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8}\n",
                      r.step, r.loss, val_s, r.lr, tok_s, r.step_s * 1e3, bubble, r.compute_s * 1e3, r.intra_s * 1e3,
                      r.wan_s * 1e3, wan_mb_s, r.prefill_tokens));
  m_metrics << fmt::format("{},{:.6f},{},{:.6e},{:.6f},{:.1f},{:.3f},{:.2f},{:.3f},{:.3f},{:.3f},{:.3f},{}\n", r.step, r.loss,
                           std::isnan(val) ? std::string() : fmt::format("{:.6f}", val), r.lr, r.grad_norm, tok_s,
                           r.step_s * 1e3, bubble, r.compute_s * 1e3, r.intra_s * 1e3, r.wan_s * 1e3, wan_mb_s,
                           r.prefill_tokens);
  m_metrics.flush();
}

void TrainOutput::maybe_checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done,
                                   bool last) {
  const bool periodic = m_cfg.ckpt.every_steps > 0 && steps_done % m_cfg.ckpt.every_steps == 0;
  if (!periodic && !(last && m_cfg.ckpt.final)) return;
  const topo::Coord me = trainer.layout().coord(comms.world.rank());
  HostShards h = host_shards(trainer.model(), me, false);
  io::CheckpointMeta meta;
  meta.step = steps_done;
  meta.git_sha = build::kGitSha;
  meta.deck = deck::resolved_deck(m_cfg);
  meta.layout.dc_count = trainer.layout().dc_count();
  meta.layout.pp_size = trainer.layout().pp_size();
  meta.layout.dp_size = trainer.layout().dp_size();
  meta.layout.tp_size = trainer.layout().tp_size();
  for (int s : trainer.layout().stages_per_dc()) meta.layout.stages_per_dc.push_back(s);
  meta.model = shape_of(m_cfg.model);
  meta.state["adam_t"] = {static_cast<std::uint64_t>(trainer.optimizer().step_count())};
  if (trainer.has_train_loader()) {
    const model::DataPosition pos = trainer.train_loader().position();
    meta.state["loader"] = {pos.seed, static_cast<std::uint64_t>(pos.samples_consumed),
                            static_cast<std::uint64_t>(pos.epoch_samples)};
  }
  io::WriteOptions opt;
  opt.keep_last = m_cfg.ckpt.keep_last;
  const io::WriteResult r = io::write_checkpoint(comms.world, m_cfg.ckpt_dir(), meta, h.write, opt);
  print(fmt::format("# checkpoint {} ({}, {:.2f} s)\n", r.path, units::format_bytes_human(static_cast<double>(r.file_bytes)),
                    r.seconds));
}

void TrainOutput::finish(runtime::Trainer& trainer, const topo::Communicators& comms, const topo::Layout& layout,
                         const sched::ScheduleTable& table, runtime::Profiler& profiler, wan::PeerTransport& wan) {
  (void)trainer;
  const auto events = profiler.gather(comms.world, 0);
  const auto stats = wan.stats();
  const unsigned long long wan_bytes = comms.world.allreduce(static_cast<unsigned long long>(stats.total_bytes_sent()), MPI_SUM);
  if (!m_root) return;
  // Per-rank time budget over the recorded steps.
  struct Acc {
    double compute = 0, intra = 0, wan = 0, idle = 0, prefill = 0, first = 1e300, last = 0;
  };
  std::map<int, Acc> acc;
  for (const auto& e : events) {
    Acc& a = acc[e.world_rank];
    const double d = e.end_s - e.start_s;
    a.first = std::min(a.first, e.start_s);
    a.last = std::max(a.last, e.end_s);
    switch (static_cast<sched::SlotKind>(e.kind)) {
      case sched::SlotKind::Forward:
      case sched::SlotKind::Backward:
      case sched::SlotKind::Optimizer: a.compute += d; break;
      case sched::SlotKind::LocalRecv:
      case sched::SlotKind::AllReduce: a.intra += d; break;
      case sched::SlotKind::WanRecv: a.wan += d; break;
      case sched::SlotKind::Prefill: a.prefill += d; break;
      case sched::SlotKind::Idle: a.idle += d; break;
      default: break;
    }
  }
  std::string s = fmt::format("# per-rank time over {} recorded steps (s): compute, intra-DC comm, WAN wait, "
                              "idle, prefill, utilization = (compute + prefill) / wall\n",
                              m_timed_steps);
  s += fmt::format("# {:>5} {:<22} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}\n", "rank", "where", "compute", "intra",
                   "wan", "idle", "prefill", "util%");
  for (const auto& [rank, a] : acc) {
    const double wall = std::max(1e-12, a.last - a.first);
    s += fmt::format("  {:>5} {:<22} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>6.1f}\n", rank,
                     layout.describe(rank, m_cfg.cluster.dcs).substr(0, 22), a.compute, a.intra, a.wan, a.idle,
                     a.prefill, 100.0 * (a.compute + a.prefill) / wall);
  }
  const double mean_step = m_timed_steps ? m_sum_step_s / m_timed_steps : 0.0;
  s += fmt::format("# mean step {:.1f} ms (table predicted {:.1f} ms); WAN bytes sent {}\n", mean_step * 1e3,
                   table.step_ms, wan_bytes);
  if (m_cfg.profile.enabled && m_cfg.profile.trace_json) {
    runtime::TraceLabels labels;
    labels.dc_names = m_cfg.cluster.dcs;
    for (int r = 0; r < layout.world_size(); ++r) {
      labels.rank_names.push_back(fmt::format("rank {}: {}", r, layout.describe(r, m_cfg.cluster.dcs)));
      labels.rank_dc.push_back(layout.coord(r).dc);
    }
    for (const auto& l : table.links)
      labels.link_names.push_back(fmt::format("WAN {}>{}", m_cfg.cluster.dcs[static_cast<std::size_t>(l.src_dc)],
                                              m_cfg.cluster.dcs[static_cast<std::size_t>(l.dst_dc)]));
    write_whole(fs::path(m_dir) / "trace.json", runtime::chrome_trace_json(events, labels));
    s += fmt::format("# wrote {}/trace.json ({} events)\n", m_dir, events.size());
  }
  write_whole(fs::path(m_dir) / "run.json",
              fmt::format("{{\"run\":\"{}\",\"status\":\"OK\",\"steps\":{},\"first_loss\":{:.6f},\"final_loss\":{:.6f},"
                          "\"final_val_loss\":{:.6f},\"mean_step_ms\":{:.3f},\"predicted_step_ms\":{:.3f},"
                          "\"schedule\":\"{}\",\"world_size\":{},\"wan_bytes\":{},\"prefill_tokens\":{}}}\n",
                          m_cfg.run.name, m_cfg.run.steps, m_first_loss, m_last_loss, m_last_val, mean_step * 1e3,
                          table.step_ms, to_string(m_cfg.schedule.kind), layout.world_size(), wan_bytes,
                          m_prefill_tokens));
  s += fmt::format("# OK: {} steps, loss {:.4f} -> {:.4f}, val {:.4f}; results in {}/\n", m_timed_steps, m_first_loss,
                   m_last_loss, m_last_val, m_dir);
  print(s);
}

}  // namespace atlas::app
