// SPDX-License-Identifier: MIT
// Building schedule tables: the timed table of each kind, the atlas search (temporal WAN
// sharing), re-timing under another cost model, the deck's table, BubbleTea's predicted Prefill
// slots, and the table's queries and structure hash.
//
// atlas policy (documented in docs/schedules.md): every WAN link serves transfers one at a time
// (or `slots` at a time when one transfer's rail bundle cannot fill the link) at full rate, in
// earliest-posted-first order with a tie-break rule; the first stage of pipeline d starts
// d * stagger later. The search tries stagger in {0, 0.5, ..., max} WAN transfer times, the three
// tie-break rules and the slot counts {1, ceil(capacity / per-transfer cap)}, times each
// candidate with the engine, and keeps the fastest; then deeper in-flight depths per stage (up to
// GPipe's m, under the device's memory; depth.cpp), GPipe's and 1F1B's own concurrent sharing among
// them, so atlas is never slower than either at equal or lower memory. The decided link orders
// are then frozen into the table (LinkMode::Ordered) and re-timed; the runtime enforces exactly
// those orders.
#include "atlas/sched/schedule.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/sched/memory.hpp"
#include "program.hpp"

namespace atlas::sched {

using detail::make_program;
using detail::message_id;
using detail::ProgramMap;
using detail::time_program;

// ---- building ----

namespace {

/// Engine events of the default atlas candidate above which the search times candidates on the
/// process's threads (search_threads = 0): ~0.1 s of engine work, far more than a thread's start.
constexpr std::uint64_t kSpeculateEvents = 500000;

/// Whether every DP replica of a stage is timed exactly alike, so that one replica per stage
/// stands for all: every stage in one DC (no WAN link: each boundary message a fixed-cost
/// intra-DC transfer, no stagger to try), each worker on its own device (no shared host whose
/// cores replicas would share unevenly), more than one replica. Identical workers that start
/// together then get the same times in the engine: their messages cost the same, and each
/// collective (a stage's DP barrier, the tied-embedding exchange, a pipeline's gradient norm)
/// gives its members the same times whatever the number of replicas, since every replica reaches
/// it at the same instant (a max over copies of one number is that number). The tables are equal
/// to the bit (test_sim_scale compares both paths). Not so with a WAN link (replicas share it and
/// wait for one another) or shared hosts: those are timed replica by replica.
bool replicas_alike(const CostModel& c) {
  if (c.dp <= 1 || c.ranks_per_host > 0) return false;
  return std::all_of(c.stage_dc.begin(), c.stage_dc.end(), [&](int dc) { return dc == c.stage_dc.front(); });
}

/// The cost model the engine programs are built from: `c` with one replica when replicas_alike.
CostModel program_model(const CostModel& c, bool alike) {
  CostModel one = c;
  if (alike) one.dp = 1;
  return one;
}

/// A table of one replica per stage (program_model) with each row copied to all `dp` replicas.
ScheduleTable with_replicas(ScheduleTable t, int dp) {
  if (t.dp == dp) return t;
  ATLAS_ASSERT(t.dp == 1 && t.links.empty(), "with_replicas: a table of " << t.dp << " replicas with " << t.links.size()
                                                                         << " WAN links");
  std::vector<std::vector<Slot>> rows;
  rows.reserve(static_cast<std::size_t>(t.pp) * static_cast<std::size_t>(dp));
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < dp; ++d) rows.push_back(t.rows[static_cast<std::size_t>(s)]);
  t.rows = std::move(rows);
  t.dp = dp;
  return t;  // marks follow from each row's kinds and stage (mark_slots): copied with the rows
}

}  // namespace

bool one_replica_per_stage(const CostModel& c) { return replicas_alike(c); }

namespace {
/// The process's threads for speculative atlas candidates beyond the caller's own: min(hardware
/// threads, 8) - 1 (each concurrent run holds its own engine program: ~150 MB at 100k GPUs).
std::atomic<int>& search_thread_pool() {
  static std::atomic<int> pool{static_cast<int>(std::min(std::max(1U, std::thread::hardware_concurrency()), 8U)) - 1};
  return pool;
}
}  // namespace

int take_search_threads(int most) {
  auto& pool = search_thread_pool();
  int have = pool.load();
  while (have > 0 && most > 0) {
    const int got = std::min(have, most);
    if (pool.compare_exchange_weak(have, have - got)) return got;
  }
  return 0;
}

void give_search_threads(int n) {
  if (n > 0) search_thread_pool() += n;
}

namespace detail {
/// A finished run's times (its result and its messages'): the table of the winner, which a run
/// with its served orders frozen would time again to the bit (at each instant an Ordered link
/// starts the transfers its order names next, all posted: those OrderedFifo started).
struct Timed {
  EngineResult result;
  std::vector<EngineMessage> messages;
};
/// One candidate's engine run under the stop bound stop_ms, as the atlas search uses it.
struct Run {
  double stop_ms = 0.0;
  bool deadlock = false, stopped = false, tie_used = false;
  double makespan_ms = 0.0, tie_first_ms = 0.0, pcs_done_ms = 0.0;
  std::uint64_t events = 0;
  std::vector<std::pair<double, double>> bound_records;          // EngineResult::bound_records
  std::shared_ptr<const std::vector<std::vector<int>>> served;  // finished runs only
  std::shared_ptr<const Timed> timed;                             // finished runs only
  bool earlier = false;  // from an earlier search (SearchRuns): its bound may be the lower one
};
/// A candidate: (depth, slots, tie-break, stagger).
using RunKey = std::tuple<std::vector<int>, int, int, double>;
}  // namespace detail

struct SearchRuns {
  std::uint64_t model = 0;  // model_print of the cost model and micro-batches the runs are of
  std::map<detail::RunKey, detail::Run> runs;  // without their times (Run::timed)
};

namespace {
/// A fingerprint of what an engine program of `c` with m micro-batches depends on (SearchRuns:
/// runs of another model are not taken).
std::uint64_t model_print(const CostModel& c, int m, std::size_t messages, int split) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the values' bytes
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffU;
      h *= 1099511628211ULL;
    }
  };
  auto mixd = [&](double x) { mix(std::bit_cast<std::uint64_t>(x)); };
  for (int v : {c.pp, c.dp, c.tp, c.dc_count, c.virtual_stages, m, c.ranks_per_host}) mix(static_cast<std::uint64_t>(v));
  mix(messages);
  // ScheduleOptions::split: On splits every candidate under its unsplit key; Off and Auto build the
  // same program for a key (Auto's split candidates have keys of their own), so share their runs.
  mix(static_cast<std::uint64_t>(split == static_cast<int>(SplitBackward::On)));
  mix(static_cast<std::uint64_t>(c.act_bytes));
  for (int dc : c.stage_dc) mix(static_cast<std::uint64_t>(dc));
  for (const auto* v : {&c.fwd_ms, &c.bwd_ms, &c.allreduce_ms, &c.optimizer_ms, &c.grad_bytes, &c.state_bytes,
                        &c.act_bytes_per_micro, &c.fixed_act_bytes, &c.weight_grad_share}) {
    mix(v->size());
    for (double x : *v) mixd(x);
  }
  for (const LinkCost& l : c.links) {
    mixd(l.latency_ms);
    mixd(l.capacity_bytes_per_ms);
    mixd(l.flow_cap_bytes_per_ms);
    mixd(l.window_bytes);
  }
  for (double x : {c.embed_sync_ms, c.intra_latency_ms, c.intra_bytes_per_ms, c.cores_per_host, c.wake_ms,
                   c.net_ns_per_byte, c.memory_limit_bytes})
    mixd(x);
  return h;
}
}  // namespace

std::shared_ptr<SearchRuns> new_search_runs() { return std::make_shared<SearchRuns>(); }

ScheduleTable build_schedule(const CostModel& c, const ScheduleOptions& opt) {
  return build_schedule(c, opt, replicas_alike(c));
}

ScheduleTable build_schedule(const CostModel& c, const ScheduleOptions& opt, bool one_replica) {
  ATLAS_ASSERT(!one_replica || replicas_alike(c), "build_schedule: replicas that are not alike timed as one");
  ATLAS_ASSERT(c.pp >= 1 && c.dp >= 1 && opt.micro_batches >= 1, "empty schedule shape");
  const int m = opt.micro_batches;
  if (opt.kind == ScheduleKind::GPipe && c.virtual_stages > 1) {
    // GPipe does not interleave (nor does Megatron-LM): its table, for comparison, is the plain one.
    CostModel plain = c;
    plain.virtual_stages = 1;
    return build_schedule(plain, opt, one_replica);
  }
  if (opt.split == SplitBackward::On && c.virtual_stages > 1)
    ATLAS_THROW(Config, "schedule.split_backward = on cannot run with schedule.virtual_stages = "
                            << c.virtual_stages << " (the split backward is built for one model chunk per stage)\n"
                            << "  hint: set schedule.split_backward = auto or off, or schedule.virtual_stages = 1");
  // The engine programs' model: one replica per stage when they are all alike (replicas_alike).
  const CostModel cp = program_model(c, one_replica);
  if (opt.kind != ScheduleKind::Atlas) {
    ProgramMap map;
    if (opt.split == SplitBackward::On) {
      // Every W before the forward that would hold more than the kind's own depth: its memory.
      detail::SplitSpec spec;
      spec.hold = detail::classic_depth(opt.kind, c.pp, m);
      EngineProgram p = make_program(cp, opt.kind, m, map, {}, &spec);
      return with_replicas(time_program(cp, opt.kind, m, p, map), c.dp);
    }
    EngineProgram p = make_program(cp, opt.kind, m, map);
    p.reference = opt.reference_engine;
    return with_replicas(time_program(cp, opt.kind, m, p, map), c.dp);
  }
  // The split: On splits every candidate (holding each depth's own micro-batches); Auto tries it
  // after the unsplit search (step 4 below); no split with model chunks.
  const bool split_all = opt.split == SplitBackward::On;
  const bool split_try = opt.split == SplitBackward::Auto && c.virtual_stages == 1;

  // Baseline: 1F1B with concurrent sharing under the same cost model.
  ProgramMap base_map;
  EngineProgram base = make_program(cp, ScheduleKind::OneFOneB, m, base_map);
  base.reference = opt.reference_engine;
  // (Its program also tells the search the links: channels, transfers, bytes.)
  std::uint64_t events = 0;
  double baseline = 0.0;
  if (opt.baseline_1f1b) {
    const ScheduleTable base_table = time_program(cp, ScheduleKind::OneFOneB, m, base, base_map);
    baseline = base_table.step_ms;
    events = base_table.atlas.engine_events;
  }
  int timed = 0;

  // Candidate parameters. One WAN transfer's time at full rate sets the stagger unit.
  // Slots: 1 (pure temporal sharing), powers of two, enough to fill the link when one transfer's
  // rails cannot, and "all" (every transfer of a step at once: the concurrent-sharing timing,
  // which keeps the result no slower than 1F1B when hand-over round trips dominate).
  const int all_slots = c.dp * m * c.virtual_stages;
  double transfer_ms = 0.0;
  int max_slots = 1;
  for (const auto& [pair, ch] : base_map.channel_of) {
    const auto& l = base.channels[static_cast<std::size_t>(ch)];
    const double rate = std::min(l.capacity_bytes_per_ms, l.flow_cap_bytes_per_ms);
    transfer_ms = std::max(transfer_ms, static_cast<double>(c.act_bytes * c.tp) / rate);
    // At most all_slots (more never share anything more), before the cast: a tiny flow window
    // on a fast link asks for ~1e14 slots, past an int.
    const double fill = std::ceil(l.capacity_bytes_per_ms / l.flow_cap_bytes_per_ms - 1e-9);
    max_slots = std::max(max_slots, static_cast<int>(std::min(fill, static_cast<double>(all_slots))));
  }
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
  // No WAN link: no transfer to share, every link policy times alike (the search kept the first).
  const bool no_wan = base_map.channel_of.empty();
  if (no_wan) {
    staggers = {0.0};
    ties = {TieBreak::PipelineOrder};
    slot_choices = {opt.fixed_slots > 0 ? opt.fixed_slots : 1};
  }
  std::sort(slot_choices.begin(), slot_choices.end());
  slot_choices.erase(std::unique(slot_choices.begin(), slot_choices.end()), slot_choices.end());

  // One candidate: in-flight depth per stage (depth.cpp), link policy (slots, tie-break), stagger.
  auto program = [&](const AtlasChoice& k, ProgramMap& map) {
    detail::SplitSpec spec;
    if (k.split || split_all) spec.hold = k.hold.empty() ? k.depth : k.hold;
    EngineProgram p = make_program(cp, ScheduleKind::Atlas, m, map, k.depth, spec.hold.empty() ? nullptr : &spec);
    p.reference = opt.reference_engine;
    for (auto& ch : p.channels) {
      // Every transfer at once is the concurrent sharing of gpipe and 1f1b, link model included
      // (LinkMode::Shared: peer pairs' windows, docs/schedules.md "The engine").
      ch.mode = k.slots >= all_slots ? LinkMode::Shared : LinkMode::OrderedFifo;
      ch.slots = k.slots;
      ch.tie_break = k.tie_break;
    }
    p.worker_start_ms.assign(p.workers.size(), 0.0);
    for (int d = 0; d < cp.dp; ++d) p.worker_start_ms[static_cast<std::size_t>(d)] = d * k.stagger_ms;
    return p;
  };
  AtlasChoice best;
  double best_ms = std::numeric_limits<double>::infinity();
  int tried = 0;
  // A bound for the search (set below): the default candidate's makespan. No candidate slower
  // than it, or than the best so far, can win, so each stops once past either (the engine's
  // stop_after_ms); the order of the search, and so the choice, is unchanged.
  double bound = std::numeric_limits<double>::infinity();
  // What the search already knows, so that it runs the engine only where the answer may differ
  // (the choice, the tried count and the table stay exactly those of running every candidate):
  //  - each timed candidate's outcome, by (depth, slots, tie-break, stagger): the engine is
  //    deterministic, so a candidate met again is that outcome. A run that stopped past the
  //    search's bound stops again (the bound only falls); one that finished with makespan M is
  //    stopped iff M > the bound now (exactly the engine's test), else compared as if timed;
  //  - a run in which no tie-break decided anything (EngineResult::tie_break_used false) is the
  //    run of every tie-break rule at that (depth, slots, stagger): stored under tie-break -1;
  //  - a lower bound on the makespan from the WAN links alone (bytes, slots, per-transfer rate,
  //    hand-over): a candidate whose bound already loses is not timed (it would stop or lose).
  using detail::Timed;
  struct Outcome {
    bool finished = false;  // false: deadlocked or stopped past the bound
    double makespan_ms = 0.0;
    // Finished: each channel's served order (the order the table freezes if this one wins).
    std::shared_ptr<const std::vector<std::vector<int>>> served;
    // Finished and still able to win (dropped once the best is faster): the run's times.
    std::shared_ptr<const Timed> timed;
  };
  auto outcome_of = [&](EngineResult&& r, EngineProgram& p, bool finished) {
    Outcome o{finished, r.makespan_ms, nullptr, nullptr};
    if (finished) {
      auto served = std::make_shared<std::vector<std::vector<int>>>();
      for (const auto& ch : p.channels) served->push_back(ch.served);
      o.served = std::move(served);
      if (!opt.reference_engine) o.timed = std::make_shared<const Timed>(Timed{std::move(r), std::move(p.messages)});
    }
    return o;
  };
  std::map<std::tuple<std::vector<int>, int, int, double>, Outcome> outcomes;
  // The depth part of a candidate's key: its depth, and with the split its hold too.
  auto depth_key = [](const AtlasChoice& k) {
    if (!k.split) return k.depth;
    std::vector<int> key = k.depth;
    key.push_back(-1);
    key.insert(key.end(), k.hold.begin(), k.hold.end());
    return key;
  };
  std::shared_ptr<const Timed> best_timed;  // the best candidate's run (null: not kept)
  // Per channel: its transfers' count and bytes (every boundary transfer of a step is one size).
  std::vector<std::pair<double, double>> link_load(base.channels.size(), {0.0, 0.0});
  for (const auto& msg : base.messages)
    if (msg.channel >= 0) {
      auto& [n, bytes] = link_load[static_cast<std::size_t>(msg.channel)];
      n += 1.0;
      bytes = std::max(bytes, static_cast<double>(msg.bytes));
    }
  // The last transfer of a link with `slots` at a time ends, and arrives, no earlier than this:
  // the busiest slot carries ceil(n / slots) transfers, each at most one transfer's top rate (the
  // link's for a window-sized burst, else the per-flow cap: the engine's LinkState::burst) and
  // each but the last followed by a hand-over; and the link carries n x bytes at most at
  // min(capacity, slots x that rate). Every transfer at once (LinkMode::Shared) has no slots.
  auto links_bound = [&](int slots) {
    double lb = 0.0;
    for (std::size_t ch = 0; ch < base.channels.size(); ++ch) {
      const auto& l = base.channels[ch];
      const auto [n, bytes] = link_load[ch];
      if (n <= 0) continue;
      const bool burst = l.window_bytes > 0.0 && bytes <= l.window_bytes;
      const double top = burst ? l.capacity_bytes_per_ms : std::min(l.capacity_bytes_per_ms, l.flow_cap_bytes_per_ms);
      const double one = bytes / top;
      const double q = slots >= all_slots ? 1.0 : std::ceil(n / slots);
      const double serial = q * one + (q - 1.0) * l.handover_ms;
      const double volume = n * bytes / std::min(l.capacity_bytes_per_ms, slots * top);
      lb = std::max(lb, std::max(serial, volume) + l.latency_ms);
    }
    return lb * (1.0 - 1e-9);  // rounding: the engine sums the same times in another order
  };
  // Speculative runs (ScheduleOptions::search_threads): candidates timed ahead, on threads, with
  // the stop bound of that moment, which is >= the one the serial search gives them later (bounds
  // only fall). `consider` takes such a run as the run with its own bound would have been: the
  // engine is deterministic and the bound only acts at the first event past it, so the same run
  // up to there. A run that finished with makespan M (every worker past its last op at P) is that
  // run if M <= S or P <= S, else it would have stopped; a stopped one used a tie-break iff it
  // did at or before S (EngineResult::tie_break_first_ms, pcs_done_ms). So the choice, the tried
  // and timed counts and the table are those of the serial search for any thread count; only
  // engine_events (the work done) grows by the runs the serial search would not have made.
  using detail::Run;
  using Key = detail::RunKey;
  auto key_of = [&](const AtlasChoice& k, int tie) { return std::make_tuple(depth_key(k), k.slots, tie, k.stagger_ms); };
  std::map<Key, Run> ahead;
  int earlier = 0;  // runs taken from an earlier search (AtlasChoice::candidates_earlier)
  // Runs of an earlier search of this cost model (ScheduleOptions::runs: the planner's quick
  // timing of a plan, before its full search): taken as speculative runs are, where their bound is
  // not below the search's (a run under a bound at or above S is the run under S, as below).
  const bool memo = opt.runs != nullptr && !opt.reference_engine;
  if (memo) {
    SearchRuns& sr = *opt.runs;
    const std::uint64_t model = model_print(cp, m, base.messages.size(), static_cast<int>(opt.split));
    if (sr.model != model) sr = SearchRuns{model, {}};  // another model's runs: not these
    for (const auto& [key, run] : sr.runs) {
      Run r = run;
      r.earlier = true;
      ahead.emplace(key, std::move(r));
    }
  }
  auto remember = [&](const Key& key, const Run& run) {
    if (!memo) return;
    Run r = run;
    r.timed = nullptr;  // the served orders only: a table is made from times kept in this search
    r.earlier = false;
    opt.runs->runs[key] = std::move(r);
  };
  auto time_candidate = [&](const AtlasChoice& k, double stop_after) {
    ProgramMap map;
    EngineProgram p = program(k, map);
    p.stop_after_ms = stop_after;
    EngineResult r = run_engine(p);
    Run run{stop_after, r.deadlock, r.stopped, r.tie_break_used, r.makespan_ms, r.tie_break_first_ms, r.pcs_done_ms,
            r.events, std::move(r.bound_records), nullptr, nullptr};
    if (!r.deadlock && !r.stopped) {
      Outcome o = outcome_of(std::move(r), p, true);
      run.served = std::move(o.served);
      run.timed = std::move(o.timed);
    }
    return run;
  };
  // Ties keep the earlier candidate. Another depth (deeper: more memory) must gain more than
  // 1e-4 of the step, else the shallower one stays; GPipe's own program (`classic`) only needs
  // to be faster, so atlas is never slower than GPipe.
  auto margin_of = [&](const AtlasChoice& k, bool classic) {
    if (k.split != best.split) return 1e-4 * best_ms;  // the split must gain as a deeper depth does
    return k.depth == best.depth || classic ? 1e-9 : 1e-4 * best_ms;
  };
  // Whether `consider` would run the engine for k now (not known, not lost on the links' bound).
  auto would_time = [&](const AtlasChoice& k, bool classic) {
    if (c.dp == 1 && k.stagger_ms > 0) return false;
    if (outcomes.count(key_of(k, static_cast<int>(k.tie_break))) > 0 || outcomes.count(key_of(k, -1)) > 0) return false;
    const double stop_after = std::min(best_ms, bound);
    const double lb = links_bound(k.slots);
    return !(lb > stop_after || (std::isfinite(best_ms) && lb >= best_ms - margin_of(k, classic)));
  };
  // A known outcome is taken only if faster than the best (by a margin): the times of the others
  // are dropped (the best's own are kept in best_timed: its table).
  auto drop_losers = [&] {
    for (auto& [key, o] : outcomes)
      if (o.timed && !(o.makespan_ms < best_ms)) o.timed.reset();
  };
  auto consider = [&](const AtlasChoice& k, bool classic = false) {
    if (c.dp == 1 && k.stagger_ms > 0) return;  // one pipeline: nothing to stagger against
    ++tried;
    const double margin = margin_of(k, classic);
    const double stop_after = std::min(best_ms, bound);
    auto take = [&](double makespan_ms, const std::shared_ptr<const Timed>& times) {
      if (!std::isfinite(best_ms) || makespan_ms < best_ms - margin) {
        best_ms = makespan_ms;
        best = k;
        best_timed = times;
      }
    };
    const auto key = key_of(k, static_cast<int>(k.tie_break));
    auto known = outcomes.find(key);
    if (known == outcomes.end()) known = outcomes.find(key_of(k, -1));
    if (known != outcomes.end()) {
      if (known->second.finished && !(known->second.makespan_ms > stop_after))
        take(known->second.makespan_ms, known->second.timed);
      drop_losers();
      return;
    }
    const double lb = links_bound(k.slots);
    if (lb > stop_after || (std::isfinite(best_ms) && lb >= best_ms - margin)) return;  // cannot win
    Run run;
    auto early = ahead.find(key);
    if (early != ahead.end() && early->second.earlier && early->second.stop_ms < stop_after) {
      ahead.erase(early);  // an earlier search's run under a lower bound: not this run
      early = ahead.end();
    }
    if (early != ahead.end()) {
      run = std::move(early->second);
      ahead.erase(early);
      earlier += run.earlier ? 1 : 0;
      ATLAS_ASSERT(run.stop_ms >= stop_after, "atlas search: a speculative run under a lower bound than the search's");
    } else {
      run = time_candidate(k, stop_after);
    }
    remember(key, run);
    events += run.events;
    ++timed;
    // The run with bound stop_after (the same run when run.stop_ms == stop_after). Under it the
    // links' bound stops the run at the first record above it, if any (a record above the bound
    // means the makespan and every worker's last op are past it too: such a run never finishes).
    double links_stop = std::numeric_limits<double>::infinity();
    for (const auto& [over, at] : run.bound_records)
      if (over > stop_after) {
        links_stop = at;
        break;
      }
    const bool finished = !run.deadlock && !run.stopped && std::isinf(links_stop) &&
                          (!(run.makespan_ms > stop_after) || !(run.pcs_done_ms > stop_after));
    const bool tie_used = finished ? run.tie_used : run.tie_first_ms <= stop_after && run.tie_first_ms < links_stop;
    const Outcome o{finished, run.makespan_ms, finished ? run.served : nullptr, finished ? run.timed : nullptr};
    outcomes[key] = o;
    if (!tie_used) outcomes[key_of(k, -1)] = o;
    if (o.finished) take(run.makespan_ms, o.timed);
    drop_losers();
  };
  // Threads for speculation: explicit, or the process's pool where one run is long enough to pay
  // for a thread (set after the default candidate's run below).
  bool speculate = opt.search_threads > 1;
  // Considers list[i] in order; before one the engine must time, times it and the next ones the
  // engine would time (as things stand; one per depth, slots and stagger, since the run of one
  // tie-break may stand for the others) at once on threads.
  struct Cand {
    AtlasChoice k;
    bool classic = false;
  };
  auto search_list = [&](const std::vector<Cand>& list) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Cand& x = list[i];
      if (speculate && ahead.count(key_of(x.k, static_cast<int>(x.k.tie_break))) == 0 && would_time(x.k, x.classic)) {
        const int most = opt.search_threads > 1 ? opt.search_threads : 8;
        std::vector<std::size_t> wave{i};
        std::set<std::tuple<std::vector<int>, int, double>> triples{{depth_key(x.k), x.k.slots, x.k.stagger_ms}};
        for (std::size_t j = i + 1; j < list.size() && static_cast<int>(wave.size()) < most; ++j) {
          const Cand& y = list[j];
          if (ahead.count(key_of(y.k, static_cast<int>(y.k.tie_break))) > 0 || !would_time(y.k, y.classic)) continue;
          if (triples.insert({depth_key(y.k), y.k.slots, y.k.stagger_ms}).second) wave.push_back(j);
        }
        const int extra = opt.search_threads > 1 ? static_cast<int>(wave.size()) - 1
                                                 : take_search_threads(static_cast<int>(wave.size()) - 1);
        wave.resize(static_cast<std::size_t>(1 + extra));
        if (extra > 0) {
          const double stop_after = std::min(best_ms, bound);
          std::vector<Run> runs(wave.size());
          // A run that throws is left out: the serial search times it again only if it comes to
          // it, and fails there as it would without threads.
          std::vector<char> failed(wave.size(), 0);
          std::atomic<std::size_t> next{0};
          auto work = [&] {
            for (std::size_t n = next++; n < wave.size(); n = next++) {
              try {
                runs[n] = time_candidate(list[wave[n]].k, stop_after);
              } catch (...) {
                failed[n] = 1;
              }
            }
          };
          std::vector<std::thread> pool;
          for (int t = 0; t < extra; ++t) pool.emplace_back(work);
          work();
          for (auto& th : pool) th.join();
          if (opt.search_threads <= 1) give_search_threads(extra);
          for (std::size_t n = 0; n < wave.size(); ++n) {
            const AtlasChoice& y = list[wave[n]].k;
            if (failed[n] == 0) ahead[key_of(y, static_cast<int>(y.tie_break))] = std::move(runs[n]);
          }
        }
      }
      consider(x.k, x.classic);
    }
  };
  // The link policies at one depth: every slot count x tie-break x stagger.
  auto search_links = [&](const std::vector<int>& depth) {
    std::vector<Cand> list;
    for (int slots : slot_choices)
      for (TieBreak tie : ties)
        for (double stagger : staggers) {
          AtlasChoice k;
          k.depth = depth;
          k.slots = slots;
          k.tie_break = tie;
          k.stagger_ms = stagger;
          list.push_back({k, false});
        }
    search_list(list);
  };
  // 1. 1F1B's depth (under the memory cap), every link policy.
  const std::vector<int> base_depth = detail::atlas_base_depth(c, m);
  if (!no_wan && opt.full_search && opt.fixed_slots <= 0) {
    AtlasChoice k;
    k.depth = base_depth;
    k.slots = max_slots;
    k.tie_break = TieBreak::PipelineOrder;
    k.stagger_ms = 0.0;
    // Unbounded (an earlier search's run of it, where it made one without a bound).
    const double none = std::numeric_limits<double>::infinity();
    const Key key = key_of(k, static_cast<int>(k.tie_break));
    Run r;
    const auto early = ahead.find(key);
    if (early != ahead.end() && early->second.earlier && !(early->second.stop_ms < none)) {
      r = std::move(early->second);
      ahead.erase(early);
      ++earlier;
    } else {
      r = time_candidate(k, none);
    }
    remember(key, r);
    events += r.events;
    ++timed;
    if (!r.deadlock) bound = r.makespan_ms + 1e-9;
    // One run long enough to pay for threads (work, not time: the same for every machine).
    if (opt.search_threads == 0 && r.events >= kSpeculateEvents) speculate = true;
    // The same candidate comes again in the grid below: this is its outcome (nothing stopped it).
    const bool finished = !r.deadlock;
    const Outcome o{finished, r.makespan_ms, finished ? r.served : nullptr, finished ? r.timed : nullptr};
    outcomes[key] = o;
    if (!r.tie_used) outcomes[key_of(k, -1)] = o;
  }
  search_links(base_depth);
  // 2. Deeper (up to GPipe's m, under the memory cap), each with the policy found in 1 and with
  //    every transfer at once and no stagger (the classic concurrent sharing: GPipe's and 1F1B's
  //    own timing is a candidate, so atlas is never slower than either at the same memory).
  const AtlasChoice first = best;
  {
    std::vector<Cand> list;
    for (const auto& depth : detail::depth_candidates(c, m, opt.full_search)) {
      AtlasChoice k = first;
      k.depth = depth;
      list.push_back({k, false});
      k.slots = opt.fixed_slots > 0 ? opt.fixed_slots : all_slots;
      k.tie_break = TieBreak::PipelineOrder;
      k.stagger_ms = 0.0;
      list.push_back({k, detail::is_gpipe_depth(c, m, depth)});
    }
    search_list(list);
  }
  // 3. A deeper depth won: its link policy again, one coordinate at a time (slot counts, then
  //    tie-break x stagger), not the whole grid: the search stays within ~1.5x of one grid.
  auto refine = [&] {
    const AtlasChoice deep = best;
    std::vector<Cand> list;
    for (int slots : slot_choices) {
      AtlasChoice k = deep;
      k.slots = slots;
      if (slots != deep.slots) list.push_back({k, false});
    }
    search_list(list);
    const AtlasChoice sized = best;
    list.clear();
    for (TieBreak tie : ties)
      for (double stagger : staggers) {
        AtlasChoice k = sized;
        k.tie_break = tie;
        k.stagger_ms = stagger;
        if (tie != sized.tie_break || stagger != sized.stagger_ms) list.push_back({k, false});
      }
    search_list(list);
  };
  if (best.depth != base_depth && std::isfinite(best_ms)) refine();
  // 4. schedule.split_backward = auto: the split backward at each depth tried, holding the depth's
  //    own micro-batches or one more per stage, with the link policy found and with the classic
  //    concurrent sharing; kept only at no more memory than the unsplit choice (its bound: the
  //    held micro-batches) and where it gains more than 1e-4 of the step; then its link policy
  //    again as in 3.
  if (split_try && std::isfinite(best_ms)) {
    const AtlasChoice plain = best;
    const std::vector<int> cap = detail::memory_depth_cap(c, m);
    double plain_bytes = 0.0;
    for (int s = 0; s < c.pp; ++s)
      plain_bytes = std::max(plain_bytes, stage_memory_bytes(c, s, plain.depth[static_cast<std::size_t>(s)]));
    std::vector<std::vector<int>> depths{plain.depth};
    if (base_depth != plain.depth) depths.push_back(base_depth);
    for (const auto& d : detail::depth_candidates(c, m, opt.full_search))
      if (std::find(depths.begin(), depths.end(), d) == depths.end()) depths.push_back(d);
    std::vector<Cand> list;
    for (const auto& depth : depths)
      for (int extra : {0, 1}) {
        AtlasChoice k = plain;
        k.depth = depth;
        k.split = true;
        k.hold = depth;
        double bytes = 0.0;
        for (int s = 0; s < c.pp; ++s) {
          auto& h = k.hold[static_cast<std::size_t>(s)];
          h = std::min({h + extra, m, std::max(h, cap[static_cast<std::size_t>(s)])});
          bytes = std::max(bytes, stage_memory_bytes(c, s, h));
        }
        if (extra > 0 && k.hold == depth) continue;
        if (bytes > plain_bytes * (1 + 1e-12)) continue;  // more memory than the unsplit choice
        list.push_back({k, false});
        if (no_wan) continue;  // every link policy times alike
        k.slots = opt.fixed_slots > 0 ? opt.fixed_slots : all_slots;
        k.tie_break = TieBreak::PipelineOrder;
        k.stagger_ms = 0.0;
        list.push_back({k, false});
      }
    search_list(list);
    if (best.split) refine();
  }
  const AtlasChoice searched = best;  // its key in the search's outcomes
  if (split_all) {
    best.split = true;
    if (best.hold.empty()) best.hold = best.depth;
  }
  ATLAS_ASSERT(std::isfinite(best_ms), "no atlas candidate finished");

  // Freeze the chosen candidate's link orders (as its run served them: the engine is
  // deterministic, so a run again would serve the same) and time the table with them: the
  // winner's own run where it was kept (best_timed; the frozen run would time it again to the
  // bit), else a run of the frozen program.
  ProgramMap map;
  EngineProgram p = program(best, map);
  auto won = outcomes.find(key_of(searched, static_cast<int>(searched.tie_break)));
  if (won == outcomes.end() || !won->second.served) won = outcomes.find(key_of(searched, -1));
  const bool known = won != outcomes.end() && won->second.served && won->second.served->size() == p.channels.size();
  if (known) {
    for (std::size_t ch = 0; ch < p.channels.size(); ++ch) p.channels[ch].served = (*won->second.served)[ch];
  } else {
    events += run_engine(p).events;
  }
  for (auto& ch : p.channels) {
    ch.order = ch.served;
    if (ch.mode != LinkMode::Shared) ch.mode = LinkMode::Ordered;
  }
  ScheduleTable t;
  if (known && best_timed && best_timed->messages.size() == p.messages.size()) {
    p.messages = best_timed->messages;
    t = with_replicas(detail::to_table(cp, ScheduleKind::Atlas, m, p, best_timed->result, map), c.dp);
  } else {
    t = with_replicas(time_program(cp, ScheduleKind::Atlas, m, p, map), c.dp);
  }
  best.candidates_tried = tried;
  best.candidates_timed = timed;
  best.candidates_earlier = earlier;
  best.engine_events = events + t.atlas.engine_events;
  best.baseline_1f1b_ms = baseline;
  t.atlas = best;
  return t;
}

ScheduleTable retime(const ScheduleTable& table, const CostModel& cost) {
  return retime(table, cost, replicas_alike(cost));
}

ScheduleTable retime(const ScheduleTable& table, const CostModel& cost, bool one_replica) {
  ATLAS_ASSERT(!one_replica || replicas_alike(cost), "retime: replicas that are not alike timed as one");
  if (cost.virtual_stages != table.virtual_stages) {
    // The table's model chunks (interleaved 1F1B) under this cost model's per-stage times.
    CostModel chunked = cost;
    chunked.virtual_stages = table.virtual_stages;
    return retime(table, chunked, one_replica);
  }
  const CostModel& c = cost;
  ATLAS_ASSERT(c.pp == table.pp && c.dp == table.dp && c.stage_dc == table.stage_dc,
               "retime: the cost model's shape (pp " << c.pp << ", dp " << c.dp
                                                     << ") differs from the table's (pp " << table.pp
                                                     << ", dp " << table.dp << ")");
  const int m = table.micro_batches;
  ProgramMap map;
  // An atlas table runs its chosen in-flight depth per stage (empty: the kind's compute order).
  const std::vector<int> no_depth;
  const CostModel cp = program_model(c, one_replica);  // one replica per stage (replicas_alike)
  // A split table's compute order, its W included, is fixed: the table's (its runtime's) order.
  detail::SplitSpec spec;
  if (is_split(table)) spec.fixed = detail::table_compute_orders(table, cp.dp);
  EngineProgram p = make_program(cp, table.kind, m, map, table.kind == ScheduleKind::Atlas ? table.atlas.depth : no_depth,
                                 spec.fixed.empty() ? nullptr : &spec);
  if (table.kind == ScheduleKind::Atlas) {
    // Freeze the table's link orders, exactly as build_schedule froze them.
    for (std::size_t ch = 0; ch < p.channels.size(); ++ch) {
      const int li = table.link_index(map.link_src_dc[ch], map.link_dst_dc[ch]);
      ATLAS_ASSERT(li >= 0, "retime: the table has no link " << map.link_src_dc[ch] << "->" << map.link_dst_dc[ch]);
      const WanLink& link = table.links[static_cast<std::size_t>(li)];
      auto& chan = p.channels[ch];
      chan.mode = link.mode == LinkMode::Shared ? LinkMode::Shared : LinkMode::Ordered;
      chan.slots = link.slots;
      chan.order.clear();
      for (const auto& x : link.order)
        chan.order.push_back(message_id(virtual_boundary(x, c.pp), x.dp, x.micro, x.flow, c.dp, m));
    }
    p.worker_start_ms.assign(p.workers.size(), 0.0);
    for (int d = 0; d < cp.dp; ++d) p.worker_start_ms[static_cast<std::size_t>(d)] = d * table.atlas.stagger_ms;
  }
  ScheduleTable t = with_replicas(time_program(cp, table.kind, m, p, map), c.dp);
  t.atlas = table.atlas;
  return t;
}

ScheduleOptions schedule_options(const Config& cfg, ScheduleKind kind) {
  ScheduleOptions opt;
  opt.kind = kind;
  opt.micro_batches = cfg.train.micro_batches;
  if (cfg.schedule.atlas_max_stagger > 0) opt.max_stagger_transfers = cfg.schedule.atlas_max_stagger;
  opt.fixed_slots = cfg.schedule.atlas_slots;
  opt.split = cfg.schedule.split_backward;
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

bool is_split(const ScheduleTable& t) {
  for (const auto& row : t.rows)
    for (const Slot& sl : row)
      if (sl.kind == SlotKind::BackwardInput) return true;
  return false;
}

int ScheduleTable::link_index(int src_dc, int dst_dc) const {
  for (std::size_t i = 0; i < links.size(); ++i)
    if (links[i].src_dc == src_dc && links[i].dst_dc == dst_dc) return static_cast<int>(i);
  return -1;
}

namespace {

/// The distinct hashes of `hash_of_rank`, each with the ranks that hold it ("hash X on ranks 0-3,
/// 6; ..."), and how many there are; empty when every rank agrees.
std::pair<std::size_t, std::string> hash_groups(const std::vector<std::uint64_t>& hash_of_rank) {
  std::vector<std::uint64_t> distinct;
  for (const std::uint64_t h : hash_of_rank)
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  if (distinct.size() <= 1) return {distinct.size(), {}};
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
  return {distinct.size(), groups};
}

}  // namespace

std::string table_mismatch(const std::vector<std::uint64_t>& hash_of_rank) {
  const auto [count, groups] = hash_groups(hash_of_rank);
  if (groups.empty()) return {};
  return fmt::format("the ranks built {} different schedule tables ({})\n"
                     "  hint: every rank must run the same binary and deck and find the same device profile "
                     "(rank 0 reads plan.profiles or profiles/device/ and broadcasts them with the deck: a "
                     "rank that differs runs another binary or was given other key=value overrides)",
                     count, groups);
}

std::string deck_mismatch(const std::vector<std::uint64_t>& hash_of_rank) {
  const auto [count, groups] = hash_groups(hash_of_rank);
  if (groups.empty()) return {};
  return fmt::format("the ranks resolved {} different decks ({}): they would wait for each other in different "
                     "ways (another wan.transport, other rails, other timeouts) and hang\n"
                     "  hint: give every rank the same deck and key=value overrides (an MPMD launch with "
                     "per-rank overrides, `mpirun ... : ...`, is the usual cause)",
                     count, groups);
}

std::uint64_t text_hash(std::string_view text) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
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
  if (virtual_stages > 1) mix(virtual_stages);  // one chunk: the hash as before chunks existed
  for (const auto& row : rows) {
    for (const auto& s : row) {
      if (s.kind == SlotKind::Idle) continue;  // bubbles depend on timing only
      mix(static_cast<int>(s.kind));
      mix(s.micro);
      mix(s.peer_stage);
      mix(s.link);
      mix(s.link_pos);
      mix(s.bytes);
      if (virtual_stages > 1) mix(s.chunk);
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
      if (virtual_stages > 1) mix(x.chunk);
    }
  }
  return h;
}

}  // namespace atlas::sched
