// SPDX-License-Identifier: MIT
// Interleaved 1F1B (Megatron-LM's virtual pipeline stages, Narayanan et al. SC'21 §2.2.2): each
// physical stage runs `virtual_stages` model chunks; chunk c of stage s is virtual stage
// c * pp + s, so a micro-batch crosses every stage v times (the last stage hands it back to the
// first for the next chunk). Here: the compute order of a stage and the engine program. The
// plain (one chunk) program stays in program.cpp; see program.hpp and schedule.hpp.
#include <algorithm>

#include "atlas/core/check.hpp"
#include "program.hpp"

namespace atlas::sched {

// ---- compute order ----

std::vector<ChunkStep> compute_order(ScheduleKind kind, int stage, int pp, int m, int v) {
  std::vector<ChunkStep> out;
  if (v <= 1) {
    for (const auto& [k, i] : compute_order(kind, stage, pp, m)) out.push_back({k, i, 0});
    return out;
  }
  ATLAS_ASSERT(kind != ScheduleKind::GPipe && pp > 1 && m % pp == 0,
               "interleaved 1F1B needs a 1F1B-based schedule, pp > 1 and micro-batches a multiple of pp (pp "
                   << pp << ", micro-batches " << m << ", virtual stages " << v << ")");
  // Megatron-LM's (pp - stage - 1) * 2 + (v - 1) * pp warm-up chunk forwards (all of them when
  // m == pp): the depth of its first steady forward (detail::classic_depth).
  return detail::interleaved_depth_order(
      detail::classic_depth(kind, pp, m, v)[static_cast<std::size_t>(stage)], pp, m, v);
}

int virtual_boundary(const Slot& slot, int stage, int pp) {
  // The lower virtual stage of the boundary sends the activation and receives the gradient.
  const bool lower = is_send(slot.kind) == (slot.flow == Flow::Activation);
  return slot.chunk * pp + stage - (lower ? 0 : 1);
}

int virtual_boundary(const LinkTransfer& x, int pp) {
  return x.chunk * pp + x.src_stage - (x.flow == Flow::Activation ? 0 : 1);
}

namespace detail {

std::vector<ChunkStep> interleaved_depth_order(int depth, int pp, int m, int v) {
  // Megatron-LM's forward_backward_pipelining_with_interleaving: the k-th forward (backward) of
  // the stage, 0 <= k < v*m, runs micro-batch (k / pv) * p + k % p through chunk (k % pv) / p
  // (backwards: the chunks in reverse order); depth - 1 warm-up forwards (depth v m: every
  // forward first, the same order as v m - 1), then one forward and one backward alternately.
  std::vector<ChunkStep> out;
  const int total = v * m;
  const int pv = pp * v;
  auto step = [&](int k, bool forward) {
    const int in_group = k % pv;
    const int chunk = in_group / pp;
    return ChunkStep{forward ? SlotKind::Forward : SlotKind::Backward, (k / pv) * pp + k % pp,
                     forward ? chunk : v - 1 - chunk};
  };
  const int warmup = std::clamp(depth - 1, 0, total);
  out.reserve(static_cast<std::size_t>(2 * total));
  for (int k = 0; k < warmup; ++k) out.push_back(step(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(step(warmup + k, true));
    out.push_back(step(k, false));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(step(k, false));
  return out;
}

EngineProgram make_interleaved_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map,
                                       const std::vector<int>& depth) {
  EngineProgram p;
  const int pp = c.pp;
  const int dp = c.dp;
  const int v = c.virtual_stages;
  const int vstages = pp * v;
  // The wake-ups, WAN channels and the boundaries of the pp x v virtual stages as make_program's.
  add_boundaries(c, v, m, p, map);
  auto dc_of = [&](int vs) { return c.stage_dc[static_cast<std::size_t>(vs % pp)]; };

  // Shared hosts, sync groups, all-reduce and optimizer: as make_program (per physical stage).
  add_shared_hosts(c, p);
  p.sync_groups.resize(static_cast<std::size_t>(pp + dp));
  auto group_of = [pp](int s) { return (pp > 1 && s == pp - 1) ? 0 : s; };
  p.workers.resize(static_cast<std::size_t>(pp * dp));
  for (int s = 0; s < pp; ++s) {
    const auto order = depth.empty() ? compute_order(kind, s, pp, m, v)
                                     : interleaved_depth_order(depth[static_cast<std::size_t>(s)], pp, m, v);
    // One chunk's compute: the stage's divided evenly (the deck's layers split evenly over chunks;
    // a modelled deck's uneven split is charged its average, docs/schedules.md).
    const double fwd = c.fwd_ms[static_cast<std::size_t>(s)] / v;
    const double bwd = c.bwd_ms[static_cast<std::size_t>(s)] / v;
    for (int d = 0; d < dp; ++d) {
      const int w = s * dp + d;
      p.sync_groups[static_cast<std::size_t>(group_of(s))].push_back(w);
      auto& ops = p.workers[static_cast<std::size_t>(w)];
      auto comm_kind = [&](int peer_vs, bool send) {
        const bool wan = c.stage_dc[static_cast<std::size_t>(s)] != dc_of(peer_vs);
        if (send) return wan ? SlotKind::WanSend : SlotKind::LocalSend;
        return wan ? SlotKind::WanRecv : SlotKind::LocalRecv;
      };
      auto op = [&](EngineOp::Type type, SlotKind k, int micro, double ms, int msg, int chunk) {
        EngineOp o{type, k, micro, ms, msg, -1};
        o.chunk = chunk;
        ops.push_back(o);
      };
      for (const ChunkStep& st : order) {
        const int vs = st.chunk * pp + s;
        const int i = st.micro;
        if (st.kind == SlotKind::Forward) {
          if (vs > 0)
            op(EngineOp::Type::Recv, comm_kind(vs - 1, false), i, 0.0,
               message_id(vs - 1, d, i, Flow::Activation, dp, m), st.chunk);
          op(EngineOp::Type::Compute, SlotKind::Forward, i, fwd, -1, st.chunk);
          if (vs + 1 < vstages)
            op(EngineOp::Type::Send, comm_kind(vs + 1, true), i, 0.0, message_id(vs, d, i, Flow::Activation, dp, m),
               st.chunk);
        } else {
          if (vs + 1 < vstages)
            op(EngineOp::Type::Recv, comm_kind(vs + 1, false), i, 0.0, message_id(vs, d, i, Flow::Gradient, dp, m),
               st.chunk);
          op(EngineOp::Type::Compute, SlotKind::Backward, i, bwd, -1, st.chunk);
          if (vs > 0)
            op(EngineOp::Type::Send, comm_kind(vs - 1, true), i, 0.0,
               message_id(vs - 1, d, i, Flow::Gradient, dp, m), st.chunk);
        }
      }
      ops.push_back({EngineOp::Type::Sync, SlotKind::AllReduce, -1, c.allreduce_ms[static_cast<std::size_t>(s)], -1,
                     group_of(s)});
      p.sync_groups[static_cast<std::size_t>(pp + d)].push_back(w);
      ops.push_back({EngineOp::Type::Sync, SlotKind::Optimizer, -1, c.optimizer_ms[static_cast<std::size_t>(s)], -1,
                     pp + d});
    }
  }
  add_sync_delays(c, p);
  return p;
}

}  // namespace detail

}  // namespace atlas::sched
