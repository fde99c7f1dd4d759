// SPDX-License-Identifier: MIT
// Schedule programs: the compute order of each schedule kind, and the engine program (workers,
// messages, WAN channels, collectives' wake-ups) that build_schedule and retime time with the
// engine, turned back into a table. See program.hpp (internal) and schedule.hpp.
#include "program.hpp"

#include <algorithm>
#include <cmath>
#include <map>

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


namespace detail {

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
  // Every pipeline's norm group has the same delays: one matrix (group pp's), the others refer
  // to it (they each had a copy: dp x pp^2 doubles).
  std::vector<double> up_stage(static_cast<std::size_t>(pp)), down_stage(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    up_stage[static_cast<std::size_t>(s)] = lanes_max(up, s);
    down_stage[static_cast<std::size_t>(s)] = lanes_max(down, s);
  }
  if (dp > 0) {
    auto& delay = p.sync_delay_ms[static_cast<std::size_t>(pp)];
    delay.assign(static_cast<std::size_t>(pp) * static_cast<std::size_t>(pp), 0.0);
    for (int j = 0; j < pp; ++j)
      for (int i = 0; i < pp; ++i)
        delay[static_cast<std::size_t>(j) * static_cast<std::size_t>(pp) + static_cast<std::size_t>(i)] =
            up_stage[static_cast<std::size_t>(j)] + down_stage[static_cast<std::size_t>(i)];
    p.sync_delay_of.assign(p.sync_groups.size(), -1);
    for (int d = 1; d < dp; ++d) p.sync_delay_of[static_cast<std::size_t>(pp + d)] = pp;
  }
  if (pp > 1) {
    // Group 0 holds stage 0's dp workers, then stage pp-1's (make_program pushes them so).
    const int n = 2 * dp;
    const bool wan = c.stage_dc.front() != c.stage_dc.back();
    // A cost model without the exchange (embed_sync_ms = 0: hand-built ones) keeps the barrier.
    const double one_way = c.embed_sync_ms > 0 ? c.embed_sync_ms + (wan ? p.wan_wake_ms : p.wake_ms) : 0.0;
    // In block form (EngineProgram::sync_delay_block): block 0 = stage 0's members, 1 = the last
    // stage's. Within a block the DP ring's barrier (0); across, the other half's part arrives
    // one way after it left, less the receiving stage's own ring.
    auto& block = p.sync_delay_block;
    block.assign(p.sync_groups.size(), {});
    block[0].assign(static_cast<std::size_t>(n), 0);
    for (int i = dp; i < n; ++i) block[0][static_cast<std::size_t>(i)] = 1;
    auto& delay = p.sync_delay_ms[0];
    delay.assign(4, 0.0);
    for (int bj = 0; bj < 2; ++bj)
      for (int bi = 0; bi < 2; ++bi) {
        if (bj == bi) continue;
        const double ring = c.allreduce_ms[static_cast<std::size_t>(bi == 0 ? 0 : pp - 1)];
        delay[static_cast<std::size_t>(bj * 2 + bi)] = std::max(0.0, one_way - ring);
      }
  }
}

/// What every engine program shares: the wake-ups, one WAN channel per DC pair direction that a
/// boundary crosses, and the boundary messages of `pp x v` virtual stages (v = 1: the stages),
/// virtual stage vs on physical stage vs % pp, model chunk vs / pp.
void add_boundaries(const CostModel& c, int v, int m, EngineProgram& p, ProgramMap& map) {
  const int pp = c.pp;
  const int dp = c.dp;
  const int vstages = pp * v;
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
  auto dc_of = [&](int vs) { return c.stage_dc[static_cast<std::size_t>(vs % pp)]; };

  // Channels: one per DC pair direction that some boundary crosses (with chunks, the last
  // stage's hand-back to the first included), in boundary order.
  for (int s = 0; s + 1 < vstages; ++s) {
    const int a = dc_of(s);
    const int b = dc_of(s + 1);
    if (a == b) continue;
    for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
      if (map.channel_of.count({x, y})) continue;
      map.channel_of[{x, y}] = static_cast<int>(p.channels.size());
      const LinkCost& l = c.link(x, y);
      EngineChannel ch;
      ch.latency_ms = l.latency_ms;
      ch.capacity_bytes_per_ms = l.capacity_bytes_per_ms;
      ch.flow_cap_bytes_per_ms = l.flow_cap_bytes_per_ms;
      ch.window_bytes = l.window_bytes;
      ch.handover_ms = 2.0 * l.latency_ms;  // ordered links: hand-over after the sender's ack
      p.channels.push_back(ch);
      map.link_src_dc.push_back(x);
      map.link_dst_dc.push_back(y);
    }
  }

  const int boundaries = std::max(vstages - 1, 0);
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
          const int src = f == Flow::Activation ? s : s + 1;  // virtual stages
          const int dst = f == Flow::Activation ? s + 1 : s;
          const int a = dc_of(src);
          const int b = dc_of(dst);
          msg.channel = a == b ? -1 : map.channel_of.at({a, b});
          msg.bytes = bytes;
          msg.pipeline = d;
          msg.micro = i;
          msg.flow = f;
          msg.chunk = src / pp;
          map.msg_link[static_cast<std::size_t>(id)] = msg.channel;
          map.msg_src_stage[static_cast<std::size_t>(id)] = src % pp;
          map.msg_dst_stage[static_cast<std::size_t>(id)] = dst % pp;
        }
}

/// Shared hosts (CostModel::ranks_per_host > 0): row (stage, d) holds world ranks
/// (stage*dp + d)*tp .. +tp-1 (tp fastest; with the replicas across DCs, CostModel::dp_per_dc,
/// topo::Layout::world_rank's numbering), all on one host when ranks_per_host is a multiple of
/// tp; its compute op uses tp cores at full speed.
void add_shared_hosts(const CostModel& c, EngineProgram& p) {
  if (c.ranks_per_host <= 0) return;
  const int pp = c.pp, dp = c.dp;
  const int hosts = (pp * dp * c.tp + c.ranks_per_host - 1) / c.ranks_per_host;
  p.host_cores.assign(static_cast<std::size_t>(hosts), c.cores_per_host);
  p.worker_host.resize(static_cast<std::size_t>(pp * dp));
  p.worker_cores.assign(static_cast<std::size_t>(pp * dp), static_cast<double>(c.tp));
  const int dpl = c.dp_per_dc;
  for (int s = 0; s < pp; ++s)
    for (int d = 0; d < dp; ++d) {
      const int first = dpl > 0 ? (((d / dpl) * pp + s) * dpl + d % dpl) * c.tp : (s * dp + d) * c.tp;
      p.worker_host[static_cast<std::size_t>(s * dp + d)] = first / c.ranks_per_host;
    }
}

std::vector<std::vector<std::pair<SlotKind, int>>> table_compute_orders(const ScheduleTable& t, int program_dp) {
  std::vector<std::vector<std::pair<SlotKind, int>>> out;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < program_dp; ++d) {
      auto& order = out.emplace_back();
      for (const Slot& sl : t.row(s, program_dp == t.dp ? d : 0))
        if (is_compute(sl.kind)) order.emplace_back(sl.kind, sl.micro);
    }
  return out;
}

EngineProgram make_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map,
                           const std::vector<int>& depth, const SplitSpec* split) {
  if (c.virtual_stages > 1) {
    ATLAS_ASSERT(split == nullptr, "the split backward with model chunks (schedule.virtual_stages > 1)");
    return make_interleaved_program(c, kind, m, map, depth);
  }
  EngineProgram p;
  const int pp = c.pp;
  const int dp = c.dp;
  add_boundaries(c, 1, m, p, map);

  // All-reduce sync groups: the DP replicas of a stage. With pp > 1 the first and last stage
  // also sum their tied embedding gradients there, so they meet in one group.
  add_shared_hosts(c, p);
  p.sync_groups.resize(static_cast<std::size_t>(pp + dp));
  auto group_of = [pp](int s) { return (pp > 1 && s == pp - 1) ? 0 : s; };
  p.workers.resize(static_cast<std::size_t>(pp * dp));
  for (int s = 0; s < pp; ++s) {
    const auto order = depth.empty() ? compute_order(kind, s, pp, m) : depth_order(depth[static_cast<std::size_t>(s)], m);
    for (int d = 0; d < dp; ++d) {
      const int w = s * dp + d;
      p.sync_groups[static_cast<std::size_t>(group_of(s))].push_back(w);
      auto& ops = p.workers[static_cast<std::size_t>(w)];
      auto comm_kind = [&](int peer, bool send) {
        const bool wan = c.stage_dc[static_cast<std::size_t>(s)] != c.stage_dc[static_cast<std::size_t>(peer)];
        if (send) return wan ? SlotKind::WanSend : SlotKind::LocalSend;
        return wan ? SlotKind::WanRecv : SlotKind::LocalRecv;
      };
      // The split backward (SplitSpec): where each micro-batch's B stands, and its W not placed yet.
      std::vector<int> b_op(static_cast<std::size_t>(m), -1);
      int next_w = 0;
      const int hold = split != nullptr && split->fixed.empty() ? split->hold[static_cast<std::size_t>(s)] : m;
      auto add_weight = [&](int i, bool deferred) {
        EngineOp op{EngineOp::Type::Compute, SlotKind::BackwardWeight, i, c.bwd_weight_ms(s), -1, -1};
        op.deferred = deferred;
        op.after = b_op[static_cast<std::size_t>(i)];
        ATLAS_ASSERT(op.after >= 0, "split backward: the W of micro-batch " << i << " of stage " << s << " before its B");
        ops.push_back(op);
      };
      const auto& steps = split != nullptr && !split->fixed.empty() ? split->fixed[static_cast<std::size_t>(w)] : order;
      // At most a receive, the compute and a send per step, each W, and the two syncs: one
      // allocation per worker (12,544 workers at 100k GPUs, each program built per candidate).
      ops.reserve(3 * steps.size() + (split != nullptr ? static_cast<std::size_t>(m) : 0) + 2);
      for (const auto& [k, i] : steps) {
        if (k == SlotKind::BackwardWeight) {  // a table's fixed place (retime)
          add_weight(i, false);
          continue;
        }
        if (k == SlotKind::Forward && split != nullptr && split->fixed.empty())
          for (; next_w <= i - hold; ++next_w) add_weight(next_w, true);  // W's deadline: memory
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
          if (split != nullptr) {
            b_op[static_cast<std::size_t>(i)] = static_cast<int>(ops.size());
            ops.push_back({EngineOp::Type::Compute, SlotKind::BackwardInput, i, c.bwd_input_ms(s), -1, -1});
          } else {
            ops.push_back({EngineOp::Type::Compute, SlotKind::Backward, i, c.bwd_ms[static_cast<std::size_t>(s)], -1, -1});
          }
          if (s > 0)
            ops.push_back({EngineOp::Type::Send, comm_kind(s - 1, true), i, 0.0,
                           message_id(s - 1, d, i, Flow::Gradient, dp, m), -1});
        }
      }
      if (split != nullptr && split->fixed.empty())
        for (; next_w < m; ++next_w) add_weight(next_w, true);  // every W before the AllReduce
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
  t.virtual_stages = c.virtual_stages;
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
      link.order.back().chunk = e.chunk;
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
    // The executed order: a deferred op (the split backward's W) that ran early stands before
    // the op it ran before (OpTime::ran_before), in the order they ran.
    const std::size_t n = p.workers[w].size();
    std::vector<std::size_t> seq;
    seq.reserve(n);
    std::vector<std::vector<std::size_t>> early;
    for (std::size_t i = 0; i < n; ++i)
      if (r.ops[w][i].ran_before >= 0) {
        if (early.empty()) early.resize(n);
        early[static_cast<std::size_t>(r.ops[w][i].ran_before)].push_back(i);
      }
    for (std::size_t i = 0; i < n; ++i) {
      if (!early.empty()) {
        for (std::size_t e : early[i]) seq.push_back(e);
        if (r.ops[w][i].ran_before >= 0) continue;
      }
      seq.push_back(i);
    }
    for (const std::size_t i : seq) {
      const EngineOp& op = p.workers[w][i];
      const OpTime& ot = r.ops[w][i];
      idle_until(ot.start_ms);
      Slot s;
      s.kind = op.kind;
      s.micro = op.micro;
      s.chunk = op.chunk;
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
  mark_slots(t);  // what the runtime does beyond the order (slot.hpp: SlotMark)
  return t;
}

ScheduleTable time_program(const CostModel& c, ScheduleKind kind, int m, EngineProgram& p,
                           const ProgramMap& map) {
  const EngineResult r = run_engine(p);
  if (r.deadlock)
    ATLAS_THROW(Internal, "schedule program for " << to_string(kind) << " deadlocks: " << r.deadlock_reason);
  ScheduleTable t = to_table(c, kind, m, p, r, map);
  t.atlas.engine_events = r.events;  // the run's work (build_schedule sums an atlas search's)
  return t;
}

}  // namespace detail

}  // namespace atlas::sched
