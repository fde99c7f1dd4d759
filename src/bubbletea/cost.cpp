// SPDX-License-Identifier: MIT
// Prefill cost model: start-up calibration (timed forward calls + non-negative least squares),
// online correction, the FLOP estimate and the predicted Prefill slots of a schedule table.
#include "atlas/bubbletea/cost.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "atlas/bubbletea/requests.hpp"
#include "atlas/core/check.hpp"
#include "atlas/sched/cost_model.hpp"

namespace atlas::bubbletea {

void PrefillCost::observe(int n, int pos, double actual_ms) {
  const double raw = raw_ms(n, pos);
  if (!(raw > 0) || !(actual_ms >= 0)) return;
  m_starved = 0;
  m_ratios[m_seen % kWindow] = actual_ms / raw;
  ++m_seen;
  const int have = std::min(m_seen, kWindow);
  if (have < 8) return;
  double sorted[kWindow];
  std::copy(m_ratios, m_ratios + have, sorted);
  std::sort(sorted, sorted + have);
  const auto k = std::min(static_cast<int>(std::ceil(kQuantile * have)) - 1, have - 2);
  scale = std::clamp(sorted[std::clamp(k, 0, have - 1)], 0.1, 100.0);
}

void PrefillCost::nothing_fit() {
  if (++m_starved < kStarvedBubbles) return;
  m_starved = 0;
  if (scale <= calibrated_scale) return;
  scale = std::max(calibrated_scale, 0.8 * scale);
  for (int i = 0; i < std::min(m_seen, kWindow); ++i) m_ratios[i] = std::min(m_ratios[i], scale);
}

namespace {

struct Sample {
  int n;
  int pos;
  double ms;
};

/// Least squares of ms ~ x . features over the samples with the coefficients of `mask` free and
/// the others zero; returns false when a free coefficient comes out negative or the system is
/// singular.
bool fit_subset(const std::vector<Sample>& s, unsigned mask, std::array<double, 3>& coef, double& residual) {
  auto feat = [](const Sample& x, int j) {
    return j == 0 ? 1.0 : j == 1 ? static_cast<double>(x.n) : static_cast<double>(x.n) * (x.pos + x.n);
  };
  std::vector<int> idx;
  for (int j = 0; j < 3; ++j)
    if (mask & (1U << j)) idx.push_back(j);
  const std::size_t k = idx.size();
  double a[3][4] = {};
  for (const auto& x : s)
    for (std::size_t r = 0; r < k; ++r) {
      for (std::size_t c = 0; c < k; ++c) a[r][c] += feat(x, idx[r]) * feat(x, idx[c]);
      a[r][k] += feat(x, idx[r]) * x.ms;
    }
  for (std::size_t c = 0; c < k; ++c) {  // Gauss-Jordan with partial pivoting
    std::size_t piv = c;
    for (std::size_t r = c + 1; r < k; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    if (std::fabs(a[piv][c]) < 1e-300) return false;
    for (std::size_t j = 0; j <= k; ++j) std::swap(a[c][j], a[piv][j]);
    for (std::size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (std::size_t j = c; j <= k; ++j) a[r][j] -= f * a[c][j];
    }
  }
  coef = {0.0, 0.0, 0.0};
  for (std::size_t r = 0; r < k; ++r) {
    const double v = a[r][k] / a[r][r];
    if (v < 0) return false;
    coef[static_cast<std::size_t>(idx[r])] = v;
  }
  residual = 0;
  for (const auto& x : s) {
    const double e = coef[0] + coef[1] * feat(x, 1) + coef[2] * feat(x, 2) - x.ms;
    residual += e * e;
  }
  return true;
}

}  // namespace

PrefillCost calibrate(InferenceModel& model, int repeats) {
  using clock = std::chrono::steady_clock;
  const InferShape& sh = model.shape();
  const int m = model.max_chunk();
  std::vector<int> sizes{1, std::max(1, m / 4), std::max(1, m / 2), m};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  const auto c = static_cast<std::size_t>(sh.hidden);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) tokens[static_cast<std::size_t>(i)] = i % sh.vocab;
  std::vector<float> act_in(static_cast<std::size_t>(m) * c), act_out(static_cast<std::size_t>(m) * c),
      logits(static_cast<std::size_t>(sh.vocab));
  for (std::size_t i = 0; i < act_in.size(); ++i) act_in[i] = 0.01F * static_cast<float>((i * 7919) % 201) - 1.0F;
  KvCache cache = model.make_cache(sh.context);

  std::vector<Sample> samples;
  auto measure = [&](int n, int pos) {
    std::vector<double> t;
    for (int r = 0; r <= repeats; ++r) {  // the first run warms caches and is dropped
      cache.len = pos;
      const auto t0 = clock::now();
      model.forward(cache, n, tokens.data(), act_in.data(), act_out.data(), logits.data());
      model.backend().synchronize();
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      if (r > 0) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    samples.push_back({n, pos, t[t.size() / 2]});
  };
  for (int n : sizes) measure(n, 0);
  const int far = std::max(0, sh.context / 2 - 1);
  for (int n : {1, sizes.back()})
    if (far + n <= sh.context) measure(n, far);

  // Prefill work grows at least linearly with the tokens, so the per-token term stays in the fit;
  // without it one preempted timing (a loaded machine) can leave a model that only the pairs
  // term carries, which predicts almost nothing for short chunks. Only when no such fit is
  // non-negative are the others tried.
  PrefillCost best;
  double best_res = INFINITY;
  for (const bool need_per_token : {true, false}) {
    for (unsigned mask = 1; mask < 8; ++mask) {
      if (need_per_token && (mask & 2U) == 0) continue;
      std::array<double, 3> coef{};
      double res = 0;
      if (fit_subset(samples, mask, coef, res) && res < best_res) {
        best_res = res;
        best.fixed_ms = coef[0];
        best.per_token_ms = coef[1];
        best.per_pair_ms = coef[2];
      }
    }
    if (std::isfinite(best_res)) break;
  }
  ATLAS_ASSERT(std::isfinite(best_res), "prefill cost calibration found no fit");
  // Start conservative: no measured point may be above the prediction.
  double worst = 1.0;
  for (const auto& s : samples) {
    const double raw = best.raw_ms(s.n, s.pos);
    if (raw > 0) worst = std::max(worst, s.ms / raw);
  }
  best.scale = worst;
  best.calibrated_scale = worst;
  return best;
}

PrefillCost estimate_cost(const Config& cfg, int layers, bool head) {
  const auto& bt = cfg.bubbletea;
  // FLOP rate: the training cost model's (a measured block time gives an effective rate).
  double flops_per_ms = sched::device_flops(cfg) / 1e3;
  if (cfg.schedule.fwd_ms_per_layer > 0) {
    const double tokens = static_cast<double>(cfg.train.micro_batch_size) * cfg.model.seq_len;
    flops_per_ms = sched::block_forward_flops(cfg.model, tokens) / cfg.schedule.fwd_ms_per_layer;
  }
  const double h = bt.hidden;
  PrefillCost c;
  c.per_token_ms = layers * 24.0 * h * h / flops_per_ms;
  c.per_pair_ms = layers * 4.0 * h / flops_per_ms;
  c.fixed_ms = head ? 2.0 * h * bt.vocab / flops_per_ms : 0.0;
  return c;
}

EmulatedDecoder::Timing EmulatedDecoder::submit(double first_token_s, int prompt_tokens, int max_new_tokens) {
  Timing t;
  for (int k = 1; k < max_new_tokens; ++k) t.decode_s += m_cost.predict_ms(1, prompt_tokens + k - 1) * 1e-3;
  const double begin = std::max(m_free_s, first_token_s);
  t.wait_s = begin - first_token_s;
  m_free_s = begin + t.decode_s;
  return t;
}

int planned_chunk_tokens(const BubbleTeaCfg& cfg) {
  return cfg.chunk_tokens > 0 ? cfg.chunk_tokens : std::max(1, (cfg.prompt_tokens_min + cfg.prompt_tokens_max) / 2);
}

sched::PrefillPlan prefill_plan(const Config& cfg, const topo::Layout& layout, const sched::ScheduleTable& table) {
  const auto& bt = cfg.bubbletea;
  sched::PrefillPlan plan;
  plan.chunk_tokens = planned_chunk_tokens(bt);
  plan.guard_ms = bt.guard_ms;
  plan.chunk_ms.assign(table.rows.size(), 0.0);
  for (int s = 0; s < layout.pp_size(); ++s)
    for (int d = 0; d < layout.dp_size(); ++d) {
      double worst = 0.0;
      for (int t = 0; t < layout.tp_size(); ++t) {
        const PipelinePlace place = pipeline_place(bt.pipeline, layout, layout.world_rank(s, d, t));
        const LayerRange r = split_layers(bt.layers, place.size, place.index);
        const PrefillCost cost = estimate_cost(cfg, r.count, r.has_head);
        worst = std::max(worst, cost.predict_ms(plan.chunk_tokens, 0));
      }
      plan.chunk_ms[static_cast<std::size_t>(s * layout.dp_size() + d)] = worst;
    }
  // Demand: every rank of an inference pipeline sees all of its pipeline's prompt tokens.
  const std::size_t pipelines = serving_pipelines(bt.pipeline, layout).size();
  if (bt.trace.empty() && bt.rate_per_s > 0 && pipelines > 0) {
    const double mean_prompt = 0.5 * (bt.prompt_tokens_min + bt.prompt_tokens_max);
    plan.max_tokens_per_row = bt.rate_per_s / static_cast<double>(pipelines) * table.step_ms / 1e3 * mean_prompt;
  }
  return plan;
}

namespace {
/// Each inference pipeline's bottleneck row for prefill: the row of its stages and replicas with
/// the fewest prompt tokens in Prefill slots per step (every rank of a pipeline sees every token
/// of its pipeline), by pipeline id, with its tokens.
std::map<int, std::pair<const std::vector<sched::Slot>*, double>> bottleneck_rows(InferPipeline mode,
                                                                                   const sched::ScheduleTable& table,
                                                                                   const topo::Layout& layout) {
  std::map<int, std::pair<const std::vector<sched::Slot>*, double>> out;
  for (int s = 0; s < layout.pp_size(); ++s)
    for (int d = 0; d < layout.dp_size(); ++d) {
      double tokens = 0.0;
      for (const auto& slot : table.row(s, d))
        if (slot.kind == sched::SlotKind::Prefill) tokens += slot.tokens;
      const int pipe = pipeline_place(mode, layout, layout.world_rank(s, d, 0)).pipeline;
      auto [it, fresh] = out.try_emplace(pipe, &table.row(s, d), tokens);
      if (!fresh && tokens < it->second.second) it->second = {&table.row(s, d), tokens};
    }
  return out;
}
}  // namespace

double predicted_prefill_tokens_per_s(InferPipeline mode, const sched::ScheduleTable& table,
                                      const topo::Layout& layout) {
  if (table.step_ms <= 0) return 0.0;
  double total = 0.0;
  for (const auto& [pipe, row] : bottleneck_rows(mode, table, layout)) total += row.second;
  return total / (table.step_ms / 1e3);
}

ServicePrediction predict_service(const Config& cfg, const topo::Layout& layout, const sched::ScheduleTable& table,
                                  int steps) {
  ServicePrediction out;
  if (table.step_ms <= 0 || steps <= 0) return out;
  const int chunk = planned_chunk_tokens(cfg.bubbletea);
  const double run_s = steps * table.step_ms / 1e3;
  const std::vector<Request> reqs = load_requests(cfg, layout.dc_count());
  std::vector<double> ttft_ms;
  double tokens = 0.0;
  const auto rows = bottleneck_rows(cfg.bubbletea.pipeline, table, layout);
  const std::vector<PipelinePlace> serving = serving_pipelines(cfg.bubbletea.pipeline, layout);
  for (std::size_t pipe = 0; pipe < serving.size(); ++pipe) {
    const std::vector<sched::Slot>* row = rows.at(serving[pipe].pipeline).first;
    std::vector<std::pair<double, double>> slots;  // (start, end) ms within a step
    if (row != nullptr)
      for (const auto& sl : *row)
        if (sl.kind == sched::SlotKind::Prefill) slots.emplace_back(sl.start_ms, sl.end_ms());
    std::sort(slots.begin(), slots.end());
    std::vector<const Request*> queue;
    for (const Request& r : reqs)
      if (static_cast<std::size_t>(r.id) % serving.size() == pipe && r.arrival_s < run_s) queue.push_back(&r);
    out.arrived += static_cast<int>(queue.size());
    std::size_t head = 0;
    int left = queue.empty() ? 0 : static_cast<int>((queue[0]->prompt.size() + chunk - 1) / chunk);
    for (int k = 0; k < steps && head < queue.size() && !slots.empty(); ++k)
      for (const auto& [start, end] : slots) {
        if (head >= queue.size()) break;
        const double t0 = k * table.step_ms + start;
        if (queue[head]->arrival_s * 1e3 > t0) continue;  // nothing waiting at this slot
        if (--left > 0) continue;
        ttft_ms.push_back(k * table.step_ms + end - queue[head]->arrival_s * 1e3);
        tokens += static_cast<double>(queue[head]->prompt.size());
        ++out.served;
        if (++head < queue.size()) left = static_cast<int>((queue[head]->prompt.size() + chunk - 1) / chunk);
      }
  }
  out.tokens_per_s = tokens / run_s;
  if (!ttft_ms.empty()) {
    std::sort(ttft_ms.begin(), ttft_ms.end());
    auto q = [&](double p) { return ttft_ms[static_cast<std::size_t>(std::min<double>(ttft_ms.size() - 1, p * ttft_ms.size()))]; };
    out.ttft_p50_ms = q(0.5);
    out.ttft_p99_ms = q(0.99);
  }
  return out;
}

}  // namespace atlas::bubbletea
