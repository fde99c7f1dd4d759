// SPDX-License-Identifier: MIT
// BubbleTea's end-of-run figures (see report.hpp).
#include "atlas/bubbletea/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"

namespace atlas::bubbletea {

int Report::served() const {
  return static_cast<int>(std::count_if(requests.begin(), requests.end(), [](const auto& r) { return r.prefilled(); }));
}
int Report::decoded() const {
  return static_cast<int>(std::count_if(requests.begin(), requests.end(), [](const auto& r) {
    return r.prefilled() && static_cast<int>(r.tokens.size()) == r.max_new_tokens;
  }));
}
int Report::arrived() const {
  return static_cast<int>(
      std::count_if(requests.begin(), requests.end(), [this](const auto& r) { return r.arrival_s <= end_s; }));
}
int Report::queued() const {
  return static_cast<int>(std::count_if(requests.begin(), requests.end(), [this](const auto& r) {
    return !r.started() && r.arrival_s <= end_s;
  }));
}
int Report::in_progress() const {
  return static_cast<int>(
      std::count_if(requests.begin(), requests.end(), [](const auto& r) { return r.started() && !r.prefilled(); }));
}

double Report::utilization() const {
  double busy = 0, wall = 0;
  for (const auto& r : ranks) {
    busy += r.compute_s + r.prefill_s;
    wall += r.wall_s;
  }
  return wall > 0 ? busy / wall : 0.0;
}

double Report::training_utilization() const {
  double busy = 0, wall = 0;
  for (const auto& r : ranks) {
    busy += r.compute_s;
    wall += r.wall_s;
  }
  return wall > 0 ? busy / wall : 0.0;
}

std::int64_t Report::prefill_tokens() const {
  std::int64_t t = 0;
  for (const auto& r : requests)
    if (r.prefilled()) t += r.prompt_tokens;
  return t;
}

double Report::prefill_tokens_per_s() const {
  return wall_s > 0 ? static_cast<double>(prefill_tokens()) / wall_s : 0.0;
}

double Report::ttft_quantile(double q) const {
  std::vector<double> v;
  for (const auto& r : requests)
    if (r.prefilled()) v.push_back(r.ttft_s());
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  const auto k = static_cast<std::size_t>(std::max(1.0, std::ceil(q * static_cast<double>(v.size()))));
  return v[std::min(k, v.size()) - 1];
}

std::string format_report(const Report& r, const std::vector<std::string>& dc_names) {
  auto dc_name = [&](int dc) {
    return static_cast<std::size_t>(dc) < dc_names.size() ? dc_names[static_cast<std::size_t>(dc)]
                                                          : fmt::format("dc{}", dc);
  };
  std::string s;
  s += fmt::format("# BubbleTea: prefill in the bubbles of {} steps ({:.2f} s of training, mean step {:.1f} ms)\n",
                   r.steps, r.wall_s, r.mean_step_s * 1e3);
  s += fmt::format("# {:>5} {:<8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>10} {:>8}\n", "rank",
                   "dc", "blocks", "train_s", "prefill_s", "idle_s", "offered_s", "allowed_s", "wall_s", "util%",
                   "train%", "chunks", "overrun_ms", "ms/token");
  for (const auto& k : r.ranks)
    s += fmt::format("  {:>5} {:<8} {:>7} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>7.1f} {:>7.1f} {:>8} "
                     "{:>10.2f} {:>8.4f}\n",
                     k.world_rank, dc_name(k.dc), fmt::format("{}-{}", k.first_layer, k.first_layer + k.layers - 1),
                     k.compute_s, k.prefill_s, k.idle_s, k.offered_s, k.allowed_s, k.wall_s, 100.0 * k.utilization(),
                     100.0 * k.training_utilization(), k.chunks, k.overrun_s * 1e3, k.cost_per_token_ms);
  s += fmt::format("# utilization (training + prefill busy) / wall: {:.1f}% overall (training alone {:.1f}%)\n",
                   100.0 * r.utilization(), 100.0 * r.training_utilization());
  std::int64_t unplanned = 0;
  double unplanned_budget = 0.0, unplanned_prefill = 0.0, starved = 0.0;
  for (const auto& k : r.ranks) {
    unplanned += k.unplanned_fills;
    unplanned_budget += k.unplanned_budget_s;
    unplanned_prefill += k.unplanned_prefill_s;
    starved += k.starved_s;
  }
  if (unplanned > 0)
    s += fmt::format("# waits outside the table's bubbles (receives: fill_recv_waits; WAN waits inside training slots: "
                     "fill_wan_waits): {} filled, budgets {:.3f} s, prefill in them {:.3f} s (part of prefill_s)\n",
                     unplanned, unplanned_budget, unplanned_prefill);
  if (starved > 0)
    s += fmt::format("# watched bubbles waiting for a chunk (the pipeline's previous rank had not sent one yet): {:.3f} s over "
                     "all ranks\n",
                     starved);
  s += fmt::format("# requests: {} in total, {} arrived before the end ({:.2f} s); prefilled {}, decoded {}, in "
                   "progress {}, still queued {}\n",
                   r.requests.size(), r.arrived(), r.end_s, r.served(), r.decoded(), r.in_progress(), r.queued());
  s += fmt::format("# prefill: {} prompt tokens, {:.0f} tokens/s of training wall time", r.prefill_tokens(),
                   r.prefill_tokens_per_s());
  if (r.served() > 0)
    s += fmt::format("; time to first token p50 {:.1f} ms, p99 {:.1f} ms", r.ttft_quantile(0.5) * 1e3,
                     r.ttft_quantile(0.99) * 1e3);
  s += "\n";
  int qmax = 0, qfinal = 0;
  double qmean = 0;
  std::int64_t overruns = 0, pauses = 0;
  double overrun = 0;
  std::uint64_t peak = 0;
  for (const auto& k : r.ranks) {
    pauses += k.pauses;
    if (k.dc_rank == 0) {
      qmax = std::max(qmax, k.queue_max);
      qfinal += k.queue_final;
      qmean += k.queue_mean;
    }
    overruns += k.overruns;
    overrun += k.overrun_s;
    peak = std::max(peak, k.peak_bytes);
  }
  double dec_tokens = 0, dec_s = 0;
  for (const auto& q : r.requests)
    if (q.tokens.size() > 1) {
      dec_tokens += static_cast<double>(q.tokens.size() - 1);
      dec_s += q.decode_s;
    }
  s += fmt::format("# queue length (per DC dispatcher, at the bubbles): mean {:.1f} (sum over DCs), max {}, at the "
                   "end {}; chunks past their bubble: {} ({:.2f} ms in total); chunks stopped between blocks when "
                   "training's data came: {}; peak BubbleTea memory per rank {:.2f} MiB\n",
                   qmean, qmax, qfinal, overruns, overrun * 1e3, pauses, static_cast<double>(peak) / (1024.0 * 1024.0));
  if (dec_s > 0)
    s += fmt::format("# decode workers: {:.0f} tokens in {:.3f} s of decode compute ({:.0f} tokens/s)\n", dec_tokens,
                     dec_s, dec_tokens / dec_s);
  return s;
}

std::string to_json(const Report& r) {
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : std::string("null"); };
  std::string s = "{";
  s += fmt::format("\"end_s\":{},\"arrived\":{},", num(r.end_s), r.arrived());
  s += fmt::format("\"steps\":{},\"wall_s\":{},\"mean_step_ms\":{},\"utilization\":{},\"training_utilization\":{},",
                   r.steps, num(r.wall_s), num(r.mean_step_s * 1e3), num(r.utilization()), num(r.training_utilization()));
  s += fmt::format("\"requests_total\":{},\"prefilled\":{},\"decoded\":{},\"in_progress\":{},\"queued\":{},"
                   "\"prefill_tokens\":{},\"prefill_tokens_per_s\":{},\"ttft_p50_ms\":{},\"ttft_p99_ms\":{},",
                   r.requests.size(), r.served(), r.decoded(), r.in_progress(), r.queued(), r.prefill_tokens(),
                   num(r.prefill_tokens_per_s()), num(r.ttft_quantile(0.5) * 1e3), num(r.ttft_quantile(0.99) * 1e3));
  s += "\"ranks\":[";
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    const auto& k = r.ranks[i];
    s += fmt::format("{}{{\"world_rank\":{},\"dc\":{},\"dc_rank\":{},\"first_layer\":{},\"layers\":{},\"wall_s\":{},"
                     "\"compute_s\":{},\"comm_s\":{},\"idle_s\":{},\"prefill_s\":{},\"offered_s\":{},\"allowed_s\":{},\"utilization\":{},"
                     "\"overruns\":{},\"overrun_ms\":{},\"fill_calls\":{},\"unplanned_fills\":{},\"unplanned_budget_s\":{},"
                     "\"unplanned_prefill_s\":{},\"starved_s\":{},\"chunks\":{},\"pauses\":{},\"tokens\":{},\"weight_bytes\":{},"
                     "\"peak_bytes\":{},\"cost_ms_per_token\":{},\"cost_fixed_ms\":{},\"cost_scale\":{},"
                     "\"queue_mean\":{},\"queue_max\":{},\"queue_final\":{}}}",
                     i ? "," : "", k.world_rank, k.dc, k.dc_rank, k.first_layer, k.layers, num(k.wall_s),
                     num(k.compute_s), num(k.comm_s), num(k.idle_s), num(k.prefill_s), num(k.offered_s),
                     num(k.allowed_s), num(k.utilization()), k.overruns, num(k.overrun_s * 1e3), k.fill_calls,
                     k.unplanned_fills, num(k.unplanned_budget_s), num(k.unplanned_prefill_s), num(k.starved_s), k.chunks, k.pauses,
                     k.tokens, k.weight_bytes, k.peak_bytes, num(k.cost_per_token_ms), num(k.cost_fixed_ms), num(k.cost_scale),
                     num(k.queue_mean), k.queue_max, k.queue_final);
  }
  s += "],\"request_list\":[";
  for (std::size_t i = 0; i < r.requests.size(); ++i) {
    const auto& q = r.requests[i];
    s += fmt::format("{}{{\"id\":{},\"dc\":{},\"prompt_tokens\":{},\"max_new_tokens\":{},\"arrival_s\":{},"
                     "\"start_s\":{},\"first_token_s\":{},\"ttft_ms\":{},\"chunks\":{},\"decode_wait_s\":{},"
                     "\"decode_s\":{},\"tokens\":[",
                     i ? "," : "", q.id, q.dc, q.prompt_tokens, q.max_new_tokens, num(q.arrival_s),
                     q.started() ? num(q.start_s) : "null", q.prefilled() ? num(q.first_token_s) : "null",
                     q.prefilled() ? num(q.ttft_s() * 1e3) : "null", q.chunks, num(q.decode_wait_s), num(q.decode_s));
    for (std::size_t t = 0; t < q.tokens.size(); ++t) s += fmt::format("{}{}", t ? "," : "", q.tokens[t]);
    s += "]}";
  }
  s += "]}\n";
  return s;
}

void write_json(const Report& r, const std::string& path) {
  write_file_whole(path, to_json(r));
}

}  // namespace atlas::bubbletea
