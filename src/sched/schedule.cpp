// SPDX-License-Identifier: MIT
// Schedule tables: program generation per schedule kind, timing through the engine, the atlas
// search (temporal WAN sharing), and the table's text and JSON forms.
//
// atlas policy (documented in docs/schedules.md): every WAN link serves transfers one at a time
// (or `slots` at a time when one transfer's rail bundle cannot fill the link) at full rate, in
// earliest-posted-first order with a tie-break rule; the first stage of pipeline d starts
// d * stagger later. The search tries stagger in {0, 0.5, ..., max} WAN transfer times, the three
// tie-break rules and the slot counts {1, ceil(capacity / per-transfer cap)}, times each
// candidate with the engine, and keeps the fastest. The decided link orders are then frozen into
// the table (LinkMode::Ordered) and re-timed; the runtime enforces exactly those orders.
#include "atlas/sched/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "atlas/core/check.hpp"

namespace atlas::sched {

// ---- compute order ----

std::vector<std::pair<SlotKind, int>> compute_order(ScheduleKind kind, int stage, int pp, int m) {
  std::vector<std::pair<SlotKind, int>> out;
  out.reserve(static_cast<std::size_t>(2 * m));
  if (kind == ScheduleKind::GPipe) {
    for (int i = 0; i < m; ++i) out.emplace_back(SlotKind::Forward, i);
    for (int i = 0; i < m; ++i) out.emplace_back(SlotKind::Backward, i);
    return out;
  }
  // 1F1B (and atlas, which starts from it): warm-up forwards, steady 1F1B, cool-down backwards.
  // Backwards run in micro-batch order in every schedule, so gradient accumulation order (and
  // hence the loss curve) is the same for gpipe, 1f1b and atlas.
  const int warmup = std::min(pp - stage - 1, m);
  for (int i = 0; i < warmup; ++i) out.emplace_back(SlotKind::Forward, i);
  for (int i = 0; i < m - warmup; ++i) {
    out.emplace_back(SlotKind::Forward, warmup + i);
    out.emplace_back(SlotKind::Backward, i);
  }
  for (int i = m - warmup; i < m; ++i) out.emplace_back(SlotKind::Backward, i);
  return out;
}

namespace {

/// Where the table's pieces sit inside the engine program.
struct ProgramMap {
  // message id -> (link index in table, or -1)
  std::vector<int> msg_link;
  std::vector<int> msg_src_stage;
  std::vector<int> msg_dst_stage;
  std::vector<int> link_src_dc, link_dst_dc;
  // channel per (src_dc, dst_dc)
  std::map<std::pair<int, int>, int> channel_of;
};

int message_id(int boundary, int dp_index, int micro, Flow flow, int dp, int m) {
  // Two messages (activation, gradient) per (boundary, dp, micro).
  return ((boundary * dp + dp_index) * m + micro) * 2 + (flow == Flow::Gradient ? 1 : 0);
}

/// Who waits for whom in the two collectives that cross DCs (EngineProgram::sync_delay_ms), as
/// the runtime runs them:
///  - group 0 with pp > 1, the tied embedding: the first and last stage each send their half as
///    they reach the AllReduce slot and wait for the other's (one way, CostModel::embed_sync_ms,
///    and a WAN wake-up), besides their own stage's DP ring (the slot's duration, a barrier of
///    the stage's replicas);
///  - group pp + d, the gradient norm of pipeline d: an MPI all-reduce over the pipeline's ranks
///    (replica rank = stage * tp + lane), which Open MPI's non-blocking collectives (libnbc) run
///    as a binomial reduce to rank 0 (a rank sends to itself with its lowest set bit cleared, once
///    it has its children's parts) and a binomial broadcast back (a rank receives from itself
///    with its highest set bit cleared). Member j's part reaches member i after the hops up
///    from j to rank 0 and down from rank 0 to i, each hop a one-way latency and a wake-up.
void add_sync_delays(const CostModel& c, EngineProgram& p) {
  const int pp = c.pp, dp = c.dp, tp = c.tp;
  p.sync_delay_ms.assign(p.sync_groups.size(), {});
  auto dc_of = [&](int v) { return c.stage_dc[static_cast<std::size_t>(v / tp)]; };
  // One hop between replica ranks a and b: TP lanes of a stage share a node; stages in one DC
  // talk over the DC's network.
  auto hop = [&](int a, int b) {
    const bool wan = dc_of(a) != dc_of(b);
    return (wan ? c.link(dc_of(a), dc_of(b)).latency_ms : c.intra_latency_ms) + c.wake_ms;
  };
  const int ranks = pp * tp;
  std::vector<double> up(static_cast<std::size_t>(ranks), 0.0), down(static_cast<std::size_t>(ranks), 0.0);
  for (int v = 1; v < ranks; ++v) {
    for (int x = v; x != 0; x &= x - 1) up[static_cast<std::size_t>(v)] += hop(x, x & (x - 1));
    int high = 1;
    while (high * 2 <= v) high *= 2;
    down[static_cast<std::size_t>(v)] = down[static_cast<std::size_t>(v - high)] + hop(v - high, v);
  }
  // A worker is a stage's tp lanes: its part leaves when its last lane's does, and it has the sum
  // when its last lane does.
  auto lanes_max = [&](const std::vector<double>& per_rank, int stage) {
    double m = 0.0;
    for (int t = 0; t < tp; ++t) m = std::max(m, per_rank[static_cast<std::size_t>(stage * tp + t)]);
    return m;
  };
  for (int d = 0; d < dp; ++d) {
    auto& delay = p.sync_delay_ms[static_cast<std::size_t>(pp + d)];
    delay.assign(static_cast<std::size_t>(pp * pp), 0.0);
    for (int j = 0; j < pp; ++j)
      for (int i = 0; i < pp; ++i)
        delay[static_cast<std::size_t>(j * pp + i)] = lanes_max(up, j) + lanes_max(down, i);
  }
  if (pp > 1) {
    // Group 0 holds stage 0's dp workers, then stage pp-1's (make_program pushes them so).
    const int n = 2 * dp;
    const bool wan = c.stage_dc.front() != c.stage_dc.back();
    // A cost model without the exchange (embed_sync_ms = 0: hand-built ones) keeps the barrier.
    const double one_way = c.embed_sync_ms > 0 ? c.embed_sync_ms + (wan ? p.wan_wake_ms : p.wake_ms) : 0.0;
    auto& delay = p.sync_delay_ms[0];
    delay.assign(static_cast<std::size_t>(n * n), 0.0);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < n; ++i) {
        if ((j < dp) == (i < dp)) continue;  // same stage: the DP ring's barrier
        const double ring = c.allreduce_ms[static_cast<std::size_t>(i < dp ? 0 : pp - 1)];
        delay[static_cast<std::size_t>(j * n + i)] = std::max(0.0, one_way - ring);
      }
  }
}

EngineProgram make_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map) {
  EngineProgram p;
  const int pp = c.pp;
  const int dp = c.dp;
  p.intra_latency_ms = c.intra_latency_ms;
  p.intra_bytes_per_ms = c.intra_bytes_per_ms;
  // A waiting receiver runs wake_ms after its data is in. An intra-DC message (MPI) wakes one
  // thread, the receiver; a WAN message three in turn: the sender's progress thread (to write
  // it), the receiver's (to read it) and the receiver.
  p.wake_ms = c.wake_ms;
  p.wan_wake_ms = 3.0 * c.wake_ms;
  // With a core free a waiting thread runs at its next poll: the runtime's back-off sleeps at
  // most 0.2 ms (runtime/boundary.cpp kMainMaxPollUs), 0.1 ms on average.
  p.idle_wake_ms = std::min(c.wake_ms, 0.1);
  p.net_ns_per_byte = c.net_ns_per_byte;
  const std::int64_t bytes = c.act_bytes * c.tp;

  // Channels: one per DC pair direction that some boundary crosses.
  for (int s = 0; s + 1 < pp; ++s) {
    const int a = c.stage_dc[static_cast<std::size_t>(s)];
    const int b = c.stage_dc[static_cast<std::size_t>(s + 1)];
    if (a == b) continue;
    for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
      if (map.channel_of.count({x, y})) continue;
      map.channel_of[{x, y}] = static_cast<int>(p.channels.size());
      const LinkCost& l = c.link(x, y);
      EngineChannel ch;
      ch.latency_ms = l.latency_ms;
      ch.capacity_bytes_per_ms = l.capacity_bytes_per_ms;
      ch.flow_cap_bytes_per_ms = l.flow_cap_bytes_per_ms;
      ch.handover_ms = 2.0 * l.latency_ms;  // ordered links: hand-over after the sender's ack
      p.channels.push_back(ch);
      map.link_src_dc.push_back(x);
      map.link_dst_dc.push_back(y);
    }
  }

  const int boundaries = std::max(pp - 1, 0);
  p.messages.resize(static_cast<std::size_t>(boundaries * dp * m * 2));
  map.msg_link.assign(p.messages.size(), -1);
  map.msg_src_stage.assign(p.messages.size(), 0);
  map.msg_dst_stage.assign(p.messages.size(), 0);
  for (int s = 0; s < boundaries; ++s)
    for (int d = 0; d < dp; ++d)
      for (int i = 0; i < m; ++i)
        for (Flow f : {Flow::Activation, Flow::Gradient}) {
          const int id = message_id(s, d, i, f, dp, m);
          auto& msg = p.messages[static_cast<std::size_t>(id)];
          const int src = f == Flow::Activation ? s : s + 1;
          const int dst = f == Flow::Activation ? s + 1 : s;
          const int a = c.stage_dc[static_cast<std::size_t>(src)];
          const int b = c.stage_dc[static_cast<std::size_t>(dst)];
          msg.channel = a == b ? -1 : map.channel_of.at({a, b});
          msg.bytes = bytes;
          msg.pipeline = d;
          msg.micro = i;
          msg.flow = f;
          map.msg_link[static_cast<std::size_t>(id)] = msg.channel;
          map.msg_src_stage[static_cast<std::size_t>(id)] = src;
          map.msg_dst_stage[static_cast<std::size_t>(id)] = dst;
        }

  // All-reduce sync groups: the DP replicas of a stage. With pp > 1 the first and last stage
  // also sum their tied embedding gradients there, so they meet in one group.
  // Shared hosts: row (stage, d) holds world ranks (stage*dp + d)*tp .. +tp-1 (tp fastest), all on
  // one host when ranks_per_host is a multiple of tp; its compute op uses tp cores at full speed.
  if (c.ranks_per_host > 0) {
    const int hosts = (pp * dp * c.tp + c.ranks_per_host - 1) / c.ranks_per_host;
    p.host_cores.assign(static_cast<std::size_t>(hosts), c.cores_per_host);
    p.worker_host.resize(static_cast<std::size_t>(pp * dp));
    p.worker_cores.assign(static_cast<std::size_t>(pp * dp), static_cast<double>(c.tp));
    for (int w = 0; w < pp * dp; ++w) p.worker_host[static_cast<std::size_t>(w)] = (w * c.tp) / c.ranks_per_host;
  }
  p.sync_groups.resize(static_cast<std::size_t>(pp + dp));
  auto group_of = [pp](int s) { return (pp > 1 && s == pp - 1) ? 0 : s; };
  p.workers.resize(static_cast<std::size_t>(pp * dp));
  for (int s = 0; s < pp; ++s) {
    const auto order = compute_order(kind, s, pp, m);
    for (int d = 0; d < dp; ++d) {
      const int w = s * dp + d;
      p.sync_groups[static_cast<std::size_t>(group_of(s))].push_back(w);
      auto& ops = p.workers[static_cast<std::size_t>(w)];
      auto comm_kind = [&](int peer, bool send) {
        const bool wan = c.stage_dc[static_cast<std::size_t>(s)] != c.stage_dc[static_cast<std::size_t>(peer)];
        if (send) return wan ? SlotKind::WanSend : SlotKind::LocalSend;
        return wan ? SlotKind::WanRecv : SlotKind::LocalRecv;
      };
      for (const auto& [k, i] : order) {
        if (k == SlotKind::Forward) {
          if (s > 0)
            ops.push_back({EngineOp::Type::Recv, comm_kind(s - 1, false), i, 0.0,
                           message_id(s - 1, d, i, Flow::Activation, dp, m), -1});
          ops.push_back({EngineOp::Type::Compute, SlotKind::Forward, i, c.fwd_ms[static_cast<std::size_t>(s)], -1, -1});
          if (s + 1 < pp)
            ops.push_back({EngineOp::Type::Send, comm_kind(s + 1, true), i, 0.0,
                           message_id(s, d, i, Flow::Activation, dp, m), -1});
        } else {
          if (s + 1 < pp)
            ops.push_back({EngineOp::Type::Recv, comm_kind(s + 1, false), i, 0.0,
                           message_id(s, d, i, Flow::Gradient, dp, m), -1});
          ops.push_back({EngineOp::Type::Compute, SlotKind::Backward, i, c.bwd_ms[static_cast<std::size_t>(s)], -1, -1});
          if (s > 0)
            ops.push_back({EngineOp::Type::Send, comm_kind(s - 1, true), i, 0.0,
                           message_id(s - 1, d, i, Flow::Gradient, dp, m), -1});
        }
      }
      ops.push_back({EngineOp::Type::Sync, SlotKind::AllReduce, -1, c.allreduce_ms[static_cast<std::size_t>(s)], -1, group_of(s)});
      p.sync_groups[static_cast<std::size_t>(pp + d)].push_back(w);
      ops.push_back({EngineOp::Type::Sync, SlotKind::Optimizer, -1, c.optimizer_ms[static_cast<std::size_t>(s)], -1,
                     pp + d});
    }
  }
  add_sync_delays(c, p);
  return p;
}

/// Turns engine times into the table's rows and links.
ScheduleTable to_table(const CostModel& c, ScheduleKind kind, int m, const EngineProgram& p,
                       const EngineResult& r, const ProgramMap& map) {
  ScheduleTable t;
  t.kind = kind;
  t.pp = c.pp;
  t.dp = c.dp;
  t.tp = c.tp;
  t.micro_batches = m;
  t.stage_dc = c.stage_dc;
  t.step_ms = r.makespan_ms;

  // Links and each message's position in its link's order.
  std::vector<int> pos(p.messages.size(), -1);
  for (std::size_t ch = 0; ch < p.channels.size(); ++ch) {
    WanLink link;
    link.src_dc = map.link_src_dc[ch];
    link.dst_dc = map.link_dst_dc[ch];
    link.mode = p.channels[ch].mode == LinkMode::Shared ? LinkMode::Shared : LinkMode::Ordered;
    link.slots = p.channels[ch].slots;
    for (int msg : p.channels[ch].served) {
      const auto& e = p.messages[static_cast<std::size_t>(msg)];
      pos[static_cast<std::size_t>(msg)] = static_cast<int>(link.order.size());
      link.order.push_back({map.msg_src_stage[static_cast<std::size_t>(msg)],
                            map.msg_dst_stage[static_cast<std::size_t>(msg)], e.pipeline, e.micro,
                            e.flow, e.bytes, e.post_ms, e.start_ms, e.end_ms, e.arrive_ms});
    }
    t.links.push_back(std::move(link));
  }

  constexpr double kEps = 1e-9;
  t.rows.resize(p.workers.size());
  for (std::size_t w = 0; w < p.workers.size(); ++w) {
    auto& row = t.rows[w];
    double cursor = 0.0;
    auto idle_until = [&](double until) {
      if (until > cursor + kEps) row.push_back(Slot{SlotKind::Idle, -1, cursor, until - cursor});
      cursor = std::max(cursor, until);
    };
    for (std::size_t i = 0; i < p.workers[w].size(); ++i) {
      const EngineOp& op = p.workers[w][i];
      const OpTime& ot = r.ops[w][i];
      idle_until(ot.start_ms);
      Slot s;
      s.kind = op.kind;
      s.micro = op.micro;
      s.start_ms = ot.start_ms;
      s.duration_ms = ot.end_ms - ot.start_ms;
      if (op.type == EngineOp::Type::Send || op.type == EngineOp::Type::Recv) {
        const auto msg = static_cast<std::size_t>(op.message);
        s.peer_stage = op.type == EngineOp::Type::Send ? map.msg_dst_stage[msg] : map.msg_src_stage[msg];
        s.flow = p.messages[msg].flow;
        s.bytes = c.act_bytes;
        s.link = map.msg_link[msg];
        s.link_pos = pos[msg];
      }
      row.push_back(s);
      cursor = std::max(cursor, ot.end_ms);
    }
    idle_until(t.step_ms);
  }
  mark_slots(t);  // the stagger and the waits BubbleTea may fill (src/sched/slot_marks.cpp)
  return t;
}

ScheduleTable time_program(const CostModel& c, ScheduleKind kind, int m, EngineProgram& p,
                           const ProgramMap& map) {
  const EngineResult r = run_engine(p);
  if (r.deadlock)
    ATLAS_THROW(Internal, "schedule program for " << to_string(kind) << " deadlocks: " << r.deadlock_reason);
  return to_table(c, kind, m, p, r, map);
}

}  // namespace

// ---- building ----

ScheduleTable build_schedule(const CostModel& c, const ScheduleOptions& opt) {
  ATLAS_ASSERT(c.pp >= 1 && c.dp >= 1 && opt.micro_batches >= 1, "empty schedule shape");
  const int m = opt.micro_batches;
  if (opt.kind != ScheduleKind::Atlas) {
    ProgramMap map;
    EngineProgram p = make_program(c, opt.kind, m, map);
    return time_program(c, opt.kind, m, p, map);
  }

  // Baseline: 1F1B with concurrent sharing under the same cost model.
  ProgramMap base_map;
  EngineProgram base = make_program(c, ScheduleKind::OneFOneB, m, base_map);
  const double baseline = time_program(c, ScheduleKind::OneFOneB, m, base, base_map).step_ms;

  // Candidate parameters. One WAN transfer's time at full rate sets the stagger unit.
  double transfer_ms = 0.0;
  int max_slots = 1;
  for (const auto& [pair, ch] : base_map.channel_of) {
    const auto& l = base.channels[static_cast<std::size_t>(ch)];
    const double rate = std::min(l.capacity_bytes_per_ms, l.flow_cap_bytes_per_ms);
    transfer_ms = std::max(transfer_ms, static_cast<double>(c.act_bytes * c.tp) / rate);
    max_slots = std::max(max_slots, static_cast<int>(std::ceil(l.capacity_bytes_per_ms / l.flow_cap_bytes_per_ms - 1e-9)));
  }
  // Slots: 1 (pure temporal sharing), powers of two, enough to fill the link when one transfer's
  // rails cannot, and "all" (every transfer of a step at once: the concurrent-sharing timing,
  // which keeps the result no slower than 1F1B when hand-over round trips dominate).
  const int all_slots = c.dp * m;
  std::vector<double> staggers{0.0};
  std::vector<TieBreak> ties{TieBreak::PipelineOrder};
  std::vector<int> slot_choices{max_slots};
  if (opt.full_search) {
    for (double k = 0.5; k <= opt.max_stagger_transfers + 1e-9; k += 0.5) staggers.push_back(k * transfer_ms);
    ties = {TieBreak::PipelineOrder, TieBreak::GradientsFirst, TieBreak::ActivationsFirst};
    slot_choices.clear();
    for (int k = 1; k < all_slots && k <= 8; k *= 2) slot_choices.push_back(k);
    slot_choices.push_back(max_slots);
  }
  slot_choices.push_back(all_slots);
  if (opt.fixed_slots > 0) slot_choices = {opt.fixed_slots};
  std::sort(slot_choices.begin(), slot_choices.end());
  slot_choices.erase(std::unique(slot_choices.begin(), slot_choices.end()), slot_choices.end());

  AtlasChoice best;
  double best_ms = std::numeric_limits<double>::infinity();
  int tried = 0;
  for (int slots : slot_choices)
    for (TieBreak tie : ties)
      for (double stagger : staggers) {
        if (c.dp == 1 && stagger > 0) continue;  // one pipeline: nothing to stagger against
        ProgramMap map;
        EngineProgram p = make_program(c, ScheduleKind::Atlas, m, map);
        for (auto& ch : p.channels) {
          ch.mode = LinkMode::OrderedFifo;
          ch.slots = slots;
          ch.tie_break = tie;
        }
        p.worker_start_ms.assign(p.workers.size(), 0.0);
        for (int d = 0; d < c.dp; ++d) p.worker_start_ms[static_cast<std::size_t>(d)] = d * stagger;
        const EngineResult r = run_engine(p);
        ++tried;
        if (r.deadlock) continue;
        if (r.makespan_ms < best_ms - 1e-9) {
          best_ms = r.makespan_ms;
          best.stagger_ms = stagger;
          best.tie_break = tie;
          best.slots = slots;
        }
      }
  ATLAS_ASSERT(std::isfinite(best_ms), "no atlas candidate finished");

  // Freeze the chosen candidate's link orders and time the table with them.
  ProgramMap map;
  EngineProgram p = make_program(c, ScheduleKind::Atlas, m, map);
  for (auto& ch : p.channels) {
    ch.mode = LinkMode::OrderedFifo;
    ch.slots = best.slots;
    ch.tie_break = best.tie_break;
  }
  p.worker_start_ms.assign(p.workers.size(), 0.0);
  for (int d = 0; d < c.dp; ++d) p.worker_start_ms[static_cast<std::size_t>(d)] = d * best.stagger_ms;
  (void)run_engine(p);
  for (auto& ch : p.channels) {
    ch.order = ch.served;
    ch.mode = LinkMode::Ordered;
  }
  ScheduleTable t = time_program(c, ScheduleKind::Atlas, m, p, map);
  best.candidates_tried = tried;
  best.baseline_1f1b_ms = baseline;
  t.atlas = best;
  return t;
}

ScheduleTable retime(const ScheduleTable& table, const CostModel& c) {
  ATLAS_ASSERT(c.pp == table.pp && c.dp == table.dp && c.stage_dc == table.stage_dc,
               "retime: the cost model's shape (pp " << c.pp << ", dp " << c.dp
                                                     << ") differs from the table's (pp " << table.pp
                                                     << ", dp " << table.dp << ")");
  const int m = table.micro_batches;
  ProgramMap map;
  EngineProgram p = make_program(c, table.kind, m, map);
  if (table.kind == ScheduleKind::Atlas) {
    // Freeze the table's link orders, exactly as build_schedule froze them.
    for (std::size_t ch = 0; ch < p.channels.size(); ++ch) {
      const int li = table.link_index(map.link_src_dc[ch], map.link_dst_dc[ch]);
      ATLAS_ASSERT(li >= 0, "retime: the table has no link " << map.link_src_dc[ch] << "->" << map.link_dst_dc[ch]);
      const WanLink& link = table.links[static_cast<std::size_t>(li)];
      auto& chan = p.channels[ch];
      chan.mode = LinkMode::Ordered;
      chan.slots = link.slots;
      chan.order.clear();
      for (const auto& x : link.order)
        chan.order.push_back(message_id(std::min(x.src_stage, x.dst_stage), x.dp, x.micro, x.flow, c.dp, m));
    }
    p.worker_start_ms.assign(p.workers.size(), 0.0);
    for (int d = 0; d < c.dp; ++d) p.worker_start_ms[static_cast<std::size_t>(d)] = d * table.atlas.stagger_ms;
  }
  ScheduleTable t = time_program(c, table.kind, m, p, map);
  t.atlas = table.atlas;
  return t;
}

ScheduleOptions schedule_options(const Config& cfg, ScheduleKind kind) {
  ScheduleOptions opt;
  opt.kind = kind;
  opt.micro_batches = cfg.train.micro_batches;
  if (cfg.schedule.atlas_max_stagger > 0) opt.max_stagger_transfers = cfg.schedule.atlas_max_stagger;
  opt.fixed_slots = cfg.schedule.atlas_slots;
  return opt;
}

ScheduleTable build_schedule(const Config& cfg, const topo::Layout& layout) {
  return build_schedule(cost_model(cfg, layout), schedule_options(cfg, cfg.schedule.kind));
}

// ---- BubbleTea: predicted Prefill slots in the bubbles ----

ScheduleTable place_prefill(const ScheduleTable& table, const PrefillPlan& plan) {
  ATLAS_ASSERT(plan.chunk_ms.size() == table.rows.size(), "place_prefill: one chunk time per row expected");
  ScheduleTable out = table;
  if (plan.chunk_tokens <= 0) return out;
  for (std::size_t r = 0; r < out.rows.size(); ++r) {
    const double chunk = plan.chunk_ms[r];
    if (!(chunk > 0)) continue;
    std::vector<Slot> row;
    double tokens = 0;
    int chunk_id = 0;
    for (const Slot& s : table.rows[r]) {
      if (s.kind != SlotKind::Idle) {
        row.push_back(s);
        continue;
      }
      double at = s.start_ms;
      while (at + chunk + plan.guard_ms <= s.end_ms() + 1e-12 &&
             tokens + plan.chunk_tokens <= plan.max_tokens_per_row + 1e-9) {
        Slot p{SlotKind::Prefill, -1, at, chunk};
        p.request = chunk_id++;
        p.tokens = plan.chunk_tokens;
        row.push_back(p);
        at += chunk;
        tokens += plan.chunk_tokens;
      }
      if (s.end_ms() > at + 1e-12) row.push_back(Slot{SlotKind::Idle, -1, at, s.end_ms() - at});
    }
    out.rows[r] = std::move(row);
  }
  return out;
}

// ---- queries ----

double ScheduleTable::busy_ms(int stage, int dp_index) const {
  double busy = 0.0;
  for (const auto& s : row(stage, dp_index))
    if (s.kind != SlotKind::Idle) busy += s.duration_ms;
  return busy;
}

double ScheduleTable::bubble_fraction(int stage, int dp_index) const {
  if (step_ms <= 0) return 0.0;
  double idle = 0.0;
  for (const auto& s : row(stage, dp_index))
    if (s.kind == SlotKind::Idle) idle += s.duration_ms;
  return idle / step_ms;
}

double ScheduleTable::mean_bubble_fraction() const {
  double sum = 0.0;
  for (int s = 0; s < pp; ++s)
    for (int d = 0; d < dp; ++d) sum += bubble_fraction(s, d);
  return sum / (pp * dp);
}

int ScheduleTable::link_index(int src_dc, int dst_dc) const {
  for (std::size_t i = 0; i < links.size(); ++i)
    if (links[i].src_dc == src_dc && links[i].dst_dc == dst_dc) return static_cast<int>(i);
  return -1;
}

std::string table_mismatch(const std::vector<std::uint64_t>& hash_of_rank) {
  std::vector<std::uint64_t> distinct;
  for (const std::uint64_t h : hash_of_rank)
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  if (distinct.size() <= 1) return {};
  std::string groups;
  for (const std::uint64_t h : distinct) {
    // The ranks that built `h`, as ranges: "0-3, 6".
    std::string ranks;
    int n = 0;
    const int size = static_cast<int>(hash_of_rank.size());
    for (int r = 0; r < size; ++r) {
      if (hash_of_rank[static_cast<std::size_t>(r)] != h) continue;
      int last = r;
      while (last + 1 < size && hash_of_rank[static_cast<std::size_t>(last + 1)] == h) ++last;
      ranks += (ranks.empty() ? "" : ", ") + (last > r ? fmt::format("{}-{}", r, last) : std::to_string(r));
      n += last - r + 1;
      r = last;
    }
    groups += fmt::format("{}hash {:016x} on {} {}", groups.empty() ? "" : "; ", h, n == 1 ? "rank" : "ranks", ranks);
  }
  return fmt::format("the ranks built {} different schedule tables ({})\n"
                     "  hint: every rank must run the same binary and deck and find the same device profile "
                     "(plan.profiles, or profiles/device/ under each rank's working directory)",
                     distinct.size(), groups);
}

std::uint64_t ScheduleTable::structure_hash() const {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  auto mix = [&h](std::int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<std::uint64_t>((v >> (8 * i)) & 0xff);
      h *= 1099511628211ULL;
    }
  };
  mix(static_cast<int>(kind));
  mix(pp);
  mix(dp);
  mix(tp);
  mix(micro_batches);
  for (const auto& row : rows) {
    for (const auto& s : row) {
      if (s.kind == SlotKind::Idle) continue;  // bubbles depend on timing only
      mix(static_cast<int>(s.kind));
      mix(s.micro);
      mix(s.peer_stage);
      mix(s.link);
      mix(s.link_pos);
      mix(s.bytes);
    }
    mix(-1);
  }
  for (const auto& l : links) {
    mix(l.src_dc);
    mix(l.dst_dc);
    mix(l.slots);
    for (const auto& x : l.order) {
      mix(x.src_stage);
      mix(x.dp);
      mix(x.micro);
      mix(static_cast<int>(x.flow));
    }
  }
  return h;
}

// ---- output ----

namespace {

std::string dc_name(const std::vector<std::string>& names, int dc) {
  return static_cast<std::size_t>(dc) < names.size() ? names[static_cast<std::size_t>(dc)] : "dc" + std::to_string(dc);
}

char slot_char(const Slot& s) {
  switch (s.kind) {
    case SlotKind::Forward: return static_cast<char>('a' + s.micro % 26);
    case SlotKind::Backward: return static_cast<char>('A' + s.micro % 26);
    case SlotKind::AllReduce: return '=';
    case SlotKind::Optimizer: return '+';
    case SlotKind::Prefill: return '~';
    default: return '.';
  }
}

const char* link_mode_name(LinkMode m) {
  switch (m) {
    case LinkMode::Shared: return "shared";
    case LinkMode::Ordered: return "ordered";
    case LinkMode::OrderedFifo: return "ordered-fifo";
  }
  return "?";
}

const char* tie_name(TieBreak t) {
  switch (t) {
    case TieBreak::PipelineOrder: return "pipeline-order";
    case TieBreak::GradientsFirst: return "gradients-first";
    case TieBreak::ActivationsFirst: return "activations-first";
  }
  return "?";
}

}  // namespace

std::string gantt(const ScheduleTable& t, const std::vector<std::string>& dc_names, int width) {
  const double per_col = t.step_ms > 0 ? t.step_ms / width : 1.0;
  std::string out;
  out += fmt::format("# {} schedule, {} stages x dp {} (tp {}), {} micro-batches; step {:.3f} ms; "
                     "one column = {:.3f} ms\n",
                     to_string(t.kind), t.pp, t.dp, t.tp, t.micro_batches, t.step_ms, per_col);
  out += "# legend: a-z forward of micro-batch 0-25, A-Z backward, = DP all-reduce, + optimizer, "
         "~ prefill, . idle; WAN rows: digit = pipeline (dp) using the link, * = several at once\n";
  std::size_t label_w = 0;
  std::vector<std::string> labels;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d)
      labels.push_back(fmt::format("{} s{} d{}", dc_name(dc_names, t.stage_dc[static_cast<std::size_t>(s)]), s, d));
  for (const auto& l : t.links)
    labels.push_back(fmt::format("WAN {}>{}", dc_name(dc_names, l.src_dc), dc_name(dc_names, l.dst_dc)));
  for (const auto& l : labels) label_w = std::max(label_w, l.size());

  std::size_t li = 0;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      std::string line(static_cast<std::size_t>(width), '.');
      std::vector<double> cover(static_cast<std::size_t>(width), 0.0);
      for (const auto& slot : t.row(s, d)) {
        if (slot.kind == SlotKind::Idle || slot.duration_ms <= 0) continue;
        const int c0 = std::max(0, static_cast<int>(slot.start_ms / per_col));
        const int c1 = std::min(width - 1, static_cast<int>((slot.end_ms() - 1e-12) / per_col));
        for (int col = c0; col <= c1; ++col) {
          const double lo = std::max(slot.start_ms, col * per_col);
          const double hi = std::min(slot.end_ms(), (col + 1) * per_col);
          if (hi - lo > cover[static_cast<std::size_t>(col)]) {
            cover[static_cast<std::size_t>(col)] = hi - lo;
            line[static_cast<std::size_t>(col)] = slot_char(slot);
          }
        }
      }
      out += fmt::format("{:<{}} |{}| bubble {:5.1f}%\n", labels[li++], label_w, line,
                         100.0 * t.bubble_fraction(s, d));
    }
  for (const auto& l : t.links) {
    std::string line(static_cast<std::size_t>(width), ' ');
    for (int col = 0; col < width; ++col) {
      const double lo = col * per_col;
      const double hi = lo + per_col;
      // Transfers active in this column; '*' only if two of them overlap in time.
      std::vector<const LinkTransfer*> here;
      for (const auto& x : l.order)
        if (x.start_ms < hi && x.end_ms > lo && x.end_ms > x.start_ms) here.push_back(&x);
      if (here.empty()) continue;
      bool concurrent = false;
      for (std::size_t i = 0; i < here.size() && !concurrent; ++i)
        for (std::size_t j = i + 1; j < here.size(); ++j)
          if (std::max(here[i]->start_ms, here[j]->start_ms) <
              std::min(here[i]->end_ms, here[j]->end_ms) - 1e-9) {
            concurrent = true;
            break;
          }
      const LinkTransfer* most = here.front();
      double most_cover = 0.0;
      for (const auto* x : here) {
        const double cover = std::min(x->end_ms, hi) - std::max(x->start_ms, lo);
        if (cover > most_cover) {
          most_cover = cover;
          most = x;
        }
      }
      line[static_cast<std::size_t>(col)] = concurrent ? '*' : static_cast<char>('0' + most->dp % 10);
    }
    out += fmt::format("{:<{}} |{}| {} {} transfers\n", labels[li++], label_w, line,
                       link_mode_name(l.mode), l.order.size());
  }
  if (t.kind == ScheduleKind::Atlas)
    out += fmt::format("# atlas choice: stagger {:.3f} ms, tie-break {}, {} transfer(s) at a time "
                       "per link; {} candidates; 1f1b with concurrent sharing: {:.3f} ms\n",
                       t.atlas.stagger_ms, tie_name(t.atlas.tie_break), t.atlas.slots,
                       t.atlas.candidates_tried, t.atlas.baseline_1f1b_ms);
  return out;
}

std::string summary(const ScheduleTable& t, const std::vector<std::string>& dc_names) {
  std::string out = fmt::format("# {:<10} {:>5} {:>3} {:>10} {:>10} {:>8}\n", "dc", "stage", "dp",
                                "busy_ms", "idle_ms", "bubble%");
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      const double busy = t.busy_ms(s, d);
      out += fmt::format("  {:<10} {:>5} {:>3} {:>10.3f} {:>10.3f} {:>7.1f}%\n",
                         dc_name(dc_names, t.stage_dc[static_cast<std::size_t>(s)]), s, d, busy,
                         t.step_ms - busy, 100.0 * t.bubble_fraction(s, d));
    }
  out += fmt::format("# step {:.3f} ms, mean bubble {:.1f}%\n", t.step_ms, 100.0 * t.mean_bubble_fraction());
  return out;
}

std::string to_json(const ScheduleTable& t, const std::vector<std::string>& dc_names) {
  std::string out;
  out += fmt::format("{{\"kind\":\"{}\",\"pp\":{},\"dp\":{},\"tp\":{},\"micro_batches\":{},"
                     "\"step_ms\":{:.6f},\"mean_bubble_fraction\":{:.6f},\"structure_hash\":\"{:016x}\",",
                     to_string(t.kind), t.pp, t.dp, t.tp, t.micro_batches, t.step_ms,
                     t.mean_bubble_fraction(), t.structure_hash());
  out += "\"dcs\":[";
  for (std::size_t i = 0; i < dc_names.size(); ++i) out += fmt::format("{}\"{}\"", i ? "," : "", dc_names[i]);
  out += "],\"rows\":[";
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      if (s || d) out += ",";
      out += fmt::format("{{\"stage\":{},\"dp\":{},\"dc\":{},\"bubble_fraction\":{:.6f},\"slots\":[", s, d,
                         t.stage_dc[static_cast<std::size_t>(s)], t.bubble_fraction(s, d));
      bool first = true;
      for (const auto& sl : t.row(s, d)) {
        out += fmt::format("{}{{\"kind\":\"{}\",\"micro\":{},\"start_ms\":{:.6f},\"duration_ms\":{:.6f}",
                           first ? "" : ",", to_string(sl.kind), sl.micro, sl.start_ms, sl.duration_ms);
        if (sl.peer_stage >= 0)
          out += fmt::format(",\"peer_stage\":{},\"flow\":\"{}\",\"bytes\":{},\"link\":{},\"link_pos\":{}",
                             sl.peer_stage, sl.flow == Flow::Activation ? "activation" : "gradient",
                             sl.bytes, sl.link, sl.link_pos);
        if (sl.request >= 0) out += fmt::format(",\"request\":{},\"tokens\":{}", sl.request, sl.tokens);
        out += "}";
        first = false;
      }
      out += "]}";
    }
  out += "],\"links\":[";
  for (std::size_t i = 0; i < t.links.size(); ++i) {
    const auto& l = t.links[i];
    out += fmt::format("{}{{\"src_dc\":{},\"dst_dc\":{},\"mode\":\"{}\",\"slots\":{},\"transfers\":[", i ? "," : "",
                       l.src_dc, l.dst_dc, link_mode_name(l.mode), l.slots);
    for (std::size_t k = 0; k < l.order.size(); ++k) {
      const auto& x = l.order[k];
      out += fmt::format("{}{{\"src_stage\":{},\"dst_stage\":{},\"dp\":{},\"micro\":{},\"flow\":\"{}\","
                         "\"bytes\":{},\"post_ms\":{:.6f},\"start_ms\":{:.6f},\"end_ms\":{:.6f},\"arrive_ms\":{:.6f}}}",
                         k ? "," : "", x.src_stage, x.dst_stage, x.dp, x.micro,
                         x.flow == Flow::Activation ? "activation" : "gradient", x.bytes, x.post_ms,
                         x.start_ms, x.end_ms, x.arrive_ms);
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

}  // namespace atlas::sched
