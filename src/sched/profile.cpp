// SPDX-License-Identifier: MIT
// Device and WAN profile text: a strict `key = value` reader (unknown keys and bad numbers are
// errors naming file:line), the writer, the built-in GPU table and the choice of a deck's device
// profile among the files read with it. No I/O: reading the files is deck/profiles.cpp's job.
#include "atlas/sched/profile.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/sched/cost_model.hpp"

namespace atlas::sched {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "atlas-profile 1";

/// One `key = value` line.
struct Line {
  int number = 0;
  std::string key;
  std::string value;  ///< raw (quotes kept, list splitting left to the caller)
};

/// Splits profile text into lines; syntax problems go to `problems`.
std::vector<Line> read_lines(const std::string& file, const std::string& text,
                             std::vector<std::string>& problems) {
  std::vector<Line> out;
  std::istringstream in(text);
  std::string raw;
  int number = 0;
  while (std::getline(in, raw)) {
    ++number;
    std::string line = deck::strip_comment(raw);
    auto trim = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r");
      if (b == std::string::npos) return std::string();
      const auto e = s.find_last_not_of(" \t\r");
      return s.substr(b, e - b + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    if (std::count(line.begin(), line.end(), '"') % 2 != 0) {  // an unterminated quoted string
      problems.push_back(fmt::format("{}:{}: unterminated quoted string", file, number));
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      problems.push_back(fmt::format("{}:{}: cannot read '{}': expected 'key = value'", file, number, line));
      continue;
    }
    out.push_back({number, trim(line.substr(0, eq)), trim(line.substr(eq + 1))});
  }
  return out;
}

/// The largest number a profile may hold (1e12: a TFLOP/s, a GiB, a ms or a table's shape far
/// beyond any device), so every cost stays finite.
constexpr double kMaxProfileNumber = 1e12;

double number(const std::string& file, const Line& l, std::vector<std::string>& problems, double min = 0.0) {
  const auto v = units::parse_double(l.value);
  // Finite and bounded: an inf or 1e300 would reach the schedule engine as an infinite cost.
  if (!v || !std::isfinite(*v) || *v < min || *v > kMaxProfileNumber) {
    problems.push_back(fmt::format("{}:{}: {} = \"{}\": expected a number in [{}, {:g}]", file, l.number, l.key,
                                   l.value, min, kMaxProfileNumber));
    return 0.0;
  }
  return *v;
}

std::vector<double> numbers(const std::string& file, const Line& l, std::vector<std::string>& problems) {
  std::vector<double> out;
  for (const auto& w : deck::split_list(l.value)) {
    const auto v = units::parse_double(w);
    if (!v || !std::isfinite(*v) || *v < 0 || *v > kMaxProfileNumber) {
      problems.push_back(fmt::format("{}:{}: {} has \"{}\": expected a space-separated list of numbers in [0, 1e+12]",
                                     file, l.number, l.key, w));
      return {};
    }
    out.push_back(*v);
  }
  return out;
}

/// Common header checks: format line and kind.
void check_header(const std::string& file, const std::vector<Line>& lines, const char* kind,
                  std::vector<std::string>& problems) {
  std::string format;
  std::string got_kind;
  for (const auto& l : lines) {
    if (l.key == "format") format = deck::unquote(l.value);
    if (l.key == "kind") got_kind = deck::unquote(l.value);
  }
  if (format != kFormat)
    problems.push_back(fmt::format("{}: first key must be 'format = {}' (got '{}')\n  hint: see profiles/README.md",
                                   file, kFormat, format));
  if (got_kind != kind)
    problems.push_back(fmt::format("{}: kind = '{}', but a {} profile was expected", file, got_kind, kind));
}

double interp(const std::vector<std::pair<double, double>>& pts, double x) {
  if (pts.size() == 1 || x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  for (std::size_t i = 1; i < pts.size(); ++i)
    if (x <= pts[i].first) {
      const auto& [x0, y0] = pts[i - 1];
      const auto& [x1, y1] = pts[i];
      return x1 > x0 ? y0 + (y1 - y0) * (x - x0) / (x1 - x0) : y1;
    }
  return pts.back().second;
}

/// (log FLOPs per rank, value) points of the measured table, sorted; `bwd` picks the ratio.
std::vector<std::pair<double, double>> table_points(const DeviceProfile& p, bool ratio) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& b : p.table) {
    ModelCfg m;
    m.hidden = b.hidden;
    m.heads = b.heads;
    m.seq_len = b.seq_len;
    const double flops = sched::block_forward_flops(m, static_cast<double>(b.micro_batch_size) * b.seq_len) / b.tp;
    pts.emplace_back(std::log(flops), ratio ? b.bwd_ms / b.fwd_ms : flops / (b.fwd_ms * 1e-3));
  }
  std::sort(pts.begin(), pts.end());
  return pts;
}

}  // namespace

// ---- DeviceProfile ----

double DeviceProfile::fwd_flops_per_s(double fwd_flops) const {
  if (table.empty()) return peak_tflops * 1e12 * achievable_fraction;
  return interp(table_points(*this, false), std::log(std::max(fwd_flops, 1.0)));
}

double DeviceProfile::bwd_ratio(double fwd_flops) const {
  if (table.empty()) return bwd_over_fwd;
  return interp(table_points(*this, true), std::log(std::max(fwd_flops, 1.0)));
}

double DeviceProfile::gemm_efficiency(double m, double n, double k) const {
  if (gemm_min_dim.empty() || gemm_min_dim.size() != gemm_fraction.size()) return achievable_fraction;
  std::vector<std::pair<double, double>> pts;
  for (std::size_t i = 0; i < gemm_min_dim.size(); ++i)
    pts.emplace_back(std::log(std::max(gemm_min_dim[i], 1.0)), gemm_fraction[i]);
  std::sort(pts.begin(), pts.end());
  return interp(pts, std::log(std::max(std::min({m, n, k}), 1.0)));
}

double DeviceProfile::gemm_ms(double m, double n, double k, double batch) const {
  const double flops = 2.0 * m * n * k * batch;
  const double compute_s = flops / (peak_tflops * 1e12 * std::max(gemm_efficiency(m, n, k), 1e-6));
  const double bytes = (m * k + k * n + m * n) * batch * activation_bytes;
  return std::max(compute_s, bytes / (mem_bandwidth_gbs * 1e9)) * 1e3;
}

double DeviceProfile::memory_ms(double bytes) const { return bytes / (mem_bandwidth_gbs * 1e9) * 1e3; }

double DeviceProfile::usable_bytes() const {
  return memory_gib * static_cast<double>(units::kGiB) * usable_memory_fraction;
}

double DeviceProfile::state_bytes(double params, int dp) const {
  const double shards = std::max(dp, 1);
  const double weights = activation_bytes;
  const double grads = std::min(grad_bytes, std::max(state_bytes_per_param - weights, 0.0));
  const double optimizer = std::max(state_bytes_per_param - weights - grads, 0.0);
  switch (zero_stage) {
    case 0: return params * state_bytes_per_param;
    case 1: return params * (weights + grads + optimizer / shards);
    default: return params * (weights + (grads + optimizer) / shards);
  }
}

double DeviceProfile::optimizer_share(int dp) const { return zero_stage >= 1 ? 1.0 / std::max(dp, 1) : 1.0; }

// ---- WanProfile ----

int WanProfile::index(const std::string& region) const {
  const auto it = std::find(regions.begin(), regions.end(), region);
  return it == regions.end() ? -1 : static_cast<int>(it - regions.begin());
}

std::vector<std::string> WanProfile::deck_overrides(const std::vector<std::string>& dcs) const {
  std::vector<std::string> problems;
  std::vector<int> idx;
  for (const auto& dc : dcs) {
    const int i = index(dc);
    if (i < 0) {
      std::string known;
      for (const auto& r : regions) known += (known.empty() ? "" : " ") + r;
      problems.push_back(fmt::format("DC '{}' is not a region of WAN profile {} ({})\n  hint: name the DCs "
                                     "after its regions: {}", dc, name, path, known));
    }
    idx.push_back(i);
  }
  if (!problems.empty()) throw ConfigError(problems);
  const auto n = regions.size();
  std::string lat;
  std::string bw;
  for (int a : idx)
    for (int b : idx) {
      const auto ij = static_cast<std::size_t>(a) * n + static_cast<std::size_t>(b);
      lat += fmt::format("{}{:g}", lat.empty() ? "" : " ", a == b ? 0.0 : rtt_ms[ij] / 2.0);
      const double g = bandwidth_gbps.size() == 1 ? bandwidth_gbps[0] : bandwidth_gbps[ij];
      bw += fmt::format("{}{:g}", bw.empty() ? "" : " ", a == b ? 0.0 : g);
    }
  return {"cluster.latency_ms=" + lat, "cluster.bandwidth_gbps=" + bw};
}

// ---- parsing ----

DeviceProfile parse_device_profile(const std::string& file, const std::string& text) {
  std::vector<std::string> problems;
  const auto lines = read_lines(file, text, problems);
  check_header(file, lines, "device", problems);
  DeviceProfile p;
  p.path = file;
  std::map<std::string, int> seen;
  const std::map<std::string, double DeviceProfile::*> nums = {
      {"peak_tflops", &DeviceProfile::peak_tflops},
      {"peak_tflops_tf32", &DeviceProfile::peak_tflops_tf32},
      {"peak_tflops_fp32", &DeviceProfile::peak_tflops_fp32},
      {"achievable_fraction", &DeviceProfile::achievable_fraction},
      {"memory_gib", &DeviceProfile::memory_gib},
      {"usable_memory_fraction", &DeviceProfile::usable_memory_fraction},
      {"mem_bandwidth_gbs", &DeviceProfile::mem_bandwidth_gbs},
      {"nvlink_gbs", &DeviceProfile::nvlink_gbs},
      {"nvlink_latency_us", &DeviceProfile::nvlink_latency_us},
      {"nvlink_efficiency", &DeviceProfile::nvlink_efficiency},
      {"bwd_over_fwd", &DeviceProfile::bwd_over_fwd},
      {"activation_bytes", &DeviceProfile::activation_bytes},
      {"grad_bytes", &DeviceProfile::grad_bytes},
      {"state_bytes_per_param", &DeviceProfile::state_bytes_per_param},
      {"optimizer_bytes_per_param", &DeviceProfile::optimizer_bytes_per_param},
      {"board_power_w", &DeviceProfile::board_power_w},
  };
  const std::map<std::string, bool DeviceProfile::*> bools = {
      {"pipeline_scatter_gather", &DeviceProfile::pipeline_scatter_gather},
      {"sequence_parallel", &DeviceProfile::sequence_parallel},
      {"selective_recompute", &DeviceProfile::selective_recompute},
      {"fused_attention", &DeviceProfile::fused_attention},
  };
  const std::map<std::string, std::vector<double> DeviceProfile::*> lists = {
      {"gemm_min_dim", &DeviceProfile::gemm_min_dim},
      {"gemm_fraction", &DeviceProfile::gemm_fraction},
  };
  std::vector<std::string> columns;
  for (const auto& l : lines) {
    if (l.key != "row" && l.key.rfind("source.", 0) != 0 && seen[l.key]++ > 0) {
      problems.push_back(fmt::format("{}:{}: key '{}' is set twice", file, l.number, l.key));
      continue;
    }
    if (l.key == "format" || l.key == "kind") continue;
    if (l.key == "name") {
      p.name = deck::unquote(l.value);
    } else if (l.key == "description") {
      p.description = deck::unquote(l.value);
    } else if (auto it = nums.find(l.key); it != nums.end()) {
      p.*(it->second) = number(file, l, problems);
    } else if (auto bit = bools.find(l.key); bit != bools.end()) {
      const auto v = units::parse_bool(l.value);
      if (!v) problems.push_back(fmt::format("{}:{}: {} = \"{}\": expected true or false", file, l.number, l.key, l.value));
      p.*(bit->second) = v.value_or(false);
    } else if (auto lit = lists.find(l.key); lit != lists.end()) {
      p.*(lit->second) = numbers(file, l, problems);
    } else if (l.key == "measured_threads") {
      p.measured_threads = static_cast<int>(number(file, l, problems));
    } else if (l.key.rfind("source.", 0) == 0) {
      p.sources.emplace_back(l.key.substr(7), deck::unquote(l.value));
    } else if (l.key == "table") {
      columns = deck::split_list(l.value);
      const std::vector<std::string> want{"hidden", "heads", "seq_len", "micro_batch_size", "tp", "fwd_ms", "bwd_ms"};
      if (columns != want)
        problems.push_back(fmt::format("{}:{}: table columns must be: hidden heads seq_len micro_batch_size tp "
                                       "fwd_ms bwd_ms", file, l.number));
    } else if (l.key == "row") {
      const auto v = numbers(file, l, problems);
      if (columns.empty()) {
        problems.push_back(fmt::format("{}:{}: 'row' before 'table = ...' names the columns", file, l.number));
      } else if (v.size() != 7) {
        problems.push_back(fmt::format("{}:{}: row has {} values; the table has 7 columns", file, l.number, v.size()));
      } else if (v[0] < 1 || v[1] < 1 || v[2] < 1 || v[3] < 1 || v[4] < 1 || !(v[5] > 0) || !(v[6] > 0)) {
        problems.push_back(fmt::format("{}:{}: row needs positive shape and times", file, l.number));
      } else if (std::max({v[0], v[1], v[2], v[3], v[4]}) > 1 << 30) {
        problems.push_back(fmt::format("{}:{}: row's shape values must be at most 2^30", file, l.number));
      } else {
        p.table.push_back({static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]),
                           static_cast<int>(v[3]), static_cast<int>(v[4]), v[5], v[6]});
      }
    } else {
      problems.push_back(fmt::format("{}:{}: unknown device profile key '{}'\n  hint: keys are listed in "
                                     "profiles/README.md", file, l.number, l.key));
    }
  }
  if (p.name.empty()) problems.push_back(fmt::format("{}: missing key 'name'", file));
  if (p.table.empty() && !(p.peak_tflops > 0 && p.achievable_fraction > 0))
    problems.push_back(fmt::format("{}: needs peak_tflops and achievable_fraction > 0, or a measured table", file));
  if (!(p.memory_gib > 0)) problems.push_back(fmt::format("{}: memory_gib must be > 0", file));
  if (!(p.mem_bandwidth_gbs > 0)) problems.push_back(fmt::format("{}: mem_bandwidth_gbs must be > 0", file));
  if (!(p.usable_memory_fraction > 0 && p.usable_memory_fraction <= 1))
    problems.push_back(fmt::format("{}: usable_memory_fraction must be in (0, 1]", file));
  if (!(p.nvlink_gbs > 0))
    problems.push_back(fmt::format("{}: nvlink_gbs must be > 0 (the tensor-parallel all-reduce's bandwidth, GB/s per "
                                   "direction)", file));
  if (!(p.nvlink_efficiency > 0 && p.nvlink_efficiency <= 1))
    problems.push_back(fmt::format("{}: nvlink_efficiency must be in (0, 1]", file));
  if (!(p.activation_bytes > 0) || !(p.grad_bytes > 0))
    problems.push_back(fmt::format("{}: activation_bytes and grad_bytes must be > 0", file));
  if (p.gemm_min_dim.size() != p.gemm_fraction.size())
    problems.push_back(fmt::format("{}: gemm_min_dim has {} values but gemm_fraction has {}: the GEMM efficiency "
                                   "curve needs one fraction per dimension", file, p.gemm_min_dim.size(),
                                   p.gemm_fraction.size()));
  for (double f : p.gemm_fraction)
    if (!(f > 0 && f <= 1)) {
      problems.push_back(fmt::format("{}: gemm_fraction has {:g}: fractions of peak must be in (0, 1]", file, f));
      break;
    }
  if (!problems.empty()) throw ConfigError(problems);
  return p;
}

WanProfile parse_wan_profile(const std::string& file, const std::string& text) {
  std::vector<std::string> problems;
  const auto lines = read_lines(file, text, problems);
  check_header(file, lines, "wan", problems);
  WanProfile w;
  w.path = file;
  for (const auto& l : lines) {
    if (l.key == "format" || l.key == "kind") continue;
    if (l.key == "name") w.name = deck::unquote(l.value);
    else if (l.key == "date") w.date = deck::unquote(l.value);
    else if (l.key == "regions") w.regions = deck::split_list(l.value);
    else if (l.key == "rtt_ms") w.rtt_ms = numbers(file, l, problems);
    else if (l.key == "bandwidth_gbps") w.bandwidth_gbps = numbers(file, l, problems);
    else if (l.key.rfind("source.", 0) == 0) w.sources.emplace_back(l.key.substr(7), deck::unquote(l.value));
    else
      problems.push_back(fmt::format("{}:{}: unknown WAN profile key '{}'\n  hint: keys are listed in "
                                     "profiles/README.md", file, l.number, l.key));
  }
  const auto n = w.regions.size();
  if (n == 0) problems.push_back(fmt::format("{}: 'regions' is empty", file));
  if (w.rtt_ms.size() != n * n)
    problems.push_back(fmt::format("{}: rtt_ms has {} entries, but {} regions need a square {}x{} matrix "
                                   "({} entries, row-major)", file, w.rtt_ms.size(), n, n, n, n * n));
  if (w.bandwidth_gbps.size() != 1 && w.bandwidth_gbps.size() != n * n)
    problems.push_back(fmt::format("{}: bandwidth_gbps has {} entries; give one value or a square {}x{} "
                                   "matrix", file, w.bandwidth_gbps.size(), n, n));
  if (problems.empty()) {
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b) {
        const double r = w.rtt_ms[a * n + b];
        if (a == b && r != 0)
          problems.push_back(fmt::format("{}: rtt_ms diagonal entry ({}, {}) is {:g}, must be 0", file,
                                         w.regions[a], w.regions[b], r));
        const double g = w.bandwidth_gbps.size() == 1 ? w.bandwidth_gbps[0] : w.bandwidth_gbps[a * n + b];
        if (a != b && !(g > 0))
          problems.push_back(fmt::format("{}: bandwidth_gbps ({}, {}) is {:g}: links need a positive bandwidth",
                                         file, w.regions[a], w.regions[b], g));
      }
  }
  if (!problems.empty()) throw ConfigError(problems);
  return w;
}

std::string format_device_profile(const DeviceProfile& p) {
  std::string out;
  out += fmt::format("# atlas device profile ({}). Format: profiles/README.md\n", p.description);
  out += fmt::format("format                    = {}\n", kFormat);
  out += "kind                      = device\n";
  out += fmt::format("name                      = {}\n", p.name);
  out += fmt::format("description               = \"{}\"\n", p.description);
  out += fmt::format("peak_tflops               = {:.6g}\n", p.peak_tflops);
  if (p.peak_tflops_tf32 > 0) out += fmt::format("peak_tflops_tf32          = {:.6g}\n", p.peak_tflops_tf32);
  if (p.peak_tflops_fp32 > 0) out += fmt::format("peak_tflops_fp32          = {:.6g}\n", p.peak_tflops_fp32);
  out += fmt::format("achievable_fraction       = {:.6g}\n", p.achievable_fraction);
  out += fmt::format("memory_gib                = {:.6g}\n", p.memory_gib);
  out += fmt::format("usable_memory_fraction    = {:.6g}\n", p.usable_memory_fraction);
  out += fmt::format("mem_bandwidth_gbs         = {:.6g}\n", p.mem_bandwidth_gbs);
  out += fmt::format("nvlink_gbs                = {:.6g}\n", p.nvlink_gbs);
  out += fmt::format("nvlink_latency_us         = {:.6g}\n", p.nvlink_latency_us);
  if (p.nvlink_efficiency != 1.0) out += fmt::format("nvlink_efficiency         = {:.6g}\n", p.nvlink_efficiency);
  out += fmt::format("bwd_over_fwd              = {:.6g}\n", p.bwd_over_fwd);
  out += fmt::format("activation_bytes          = {:.6g}\n", p.activation_bytes);
  out += fmt::format("grad_bytes                = {:.6g}\n", p.grad_bytes);
  out += fmt::format("state_bytes_per_param     = {:.6g}\n", p.state_bytes_per_param);
  out += fmt::format("optimizer_bytes_per_param = {:.6g}\n", p.optimizer_bytes_per_param);
  if (p.board_power_w > 0) out += fmt::format("board_power_w             = {:.6g}\n", p.board_power_w);
  out += fmt::format("pipeline_scatter_gather   = {}\n", p.pipeline_scatter_gather ? "true" : "false");
  out += fmt::format("sequence_parallel         = {}\n", p.sequence_parallel ? "true" : "false");
  out += fmt::format("selective_recompute       = {}\n", p.selective_recompute ? "true" : "false");
  out += fmt::format("fused_attention           = {}\n", p.fused_attention ? "true" : "false");
  if (!p.gemm_min_dim.empty()) {
    auto join = [](const std::vector<double>& v) {
      std::string t;
      for (double x : v) t += fmt::format("{}{:g}", t.empty() ? "" : " ", x);
      return t;
    };
    out += fmt::format("gemm_min_dim              = {}\n", join(p.gemm_min_dim));
    out += fmt::format("gemm_fraction             = {}\n", join(p.gemm_fraction));
  }
  if (p.measured_threads > 0) out += fmt::format("measured_threads          = {}\n", p.measured_threads);
  for (const auto& [k, v] : p.sources) out += fmt::format("source.{} = \"{}\"\n", k, v);
  if (!p.table.empty()) {
    out += "# measured blocks: one micro-batch through one transformer block on one rank\n";
    out += "table = hidden heads seq_len micro_batch_size tp fwd_ms bwd_ms\n";
    for (const auto& b : p.table)
      out += fmt::format("row   = {} {} {} {} {} {:.6g} {:.6g}\n", b.hidden, b.heads, b.seq_len,
                         b.micro_batch_size, b.tp, b.fwd_ms, b.bwd_ms);
  }
  return out;
}

// ---- built-in profiles and lookup ----

DeviceProfile builtin_device_profile(GpuKind gpu) {
  DeviceProfile p;
  const std::string mfu =
      "0.45: Narayanan et al., SC'21 (Megatron-LM, arXiv:2104.04473) reach 44-52% of A100 peak for "
      "145B-1T GPT models; Jiang et al., NSDI'24 (MegaScale) report 55.2% MFU for 175B on 12,288 GPUs";
  const std::string state =
      "Rajbhandari et al., SC'20 (ZeRO, arXiv:1910.02054): mixed-precision Adam keeps 2+2+12 = 16 bytes per parameter";
  const std::string bwd = "backward = 2x forward FLOPs (Kaplan et al. 2020, arXiv:2001.08361: ~6N FLOPs per token)";
  switch (gpu) {
    case GpuKind::Host:
      p.name = "host";
      p.description = "this machine's host backend (OpenBLAS sgemm, fp32); built-in fallback";
      p.peak_tflops = 0.02;
      p.achievable_fraction = 1.0;
      p.memory_gib = 16;
      p.mem_bandwidth_gbs = 8;
      p.nvlink_gbs = 5;
      p.nvlink_latency_us = 1;
      p.activation_bytes = 4;
      p.grad_bytes = 4;
      p.sources = {{"peak_tflops", "conservative 20 GFLOP/s per rank (sched's estimate); `atlas profile` measures it"}};
      return p;
    case GpuKind::A100:
      p.name = "a100";
      p.peak_tflops_tf32 = 156;
      p.peak_tflops_fp32 = 19.5;
      p.board_power_w = 400;
      p.description = "NVIDIA A100 SXM4 80GB, BF16";
      p.peak_tflops = 312;
      p.memory_gib = 80;
      p.mem_bandwidth_gbs = 2039;
      p.nvlink_gbs = 300;
      p.sources = {{"peak_tflops", "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense (624 sparse)"},
                   {"board_power_w", "same datasheet: A100 SXM4 max TDP 400 W"},
                   {"memory_gib", "same datasheet: 80 GB HBM2e, 2,039 GB/s"},
                   {"peak_tflops_tf32", "NVIDIA A100 datasheet (2021): TF32 156 TFLOPS dense (312 sparse), FP32 19.5 TFLOPS"},
                   {"nvlink_gbs", "same datasheet: NVLink 600 GB/s total = 300 GB/s per direction"}};
      break;
    case GpuKind::H100:
      p.name = "h100";
      p.peak_tflops_tf32 = 494.5;
      p.peak_tflops_fp32 = 67;
      p.board_power_w = 700;
      p.description = "NVIDIA H100 SXM5 80GB, BF16";
      p.peak_tflops = 989;
      p.memory_gib = 80;
      p.mem_bandwidth_gbs = 3350;
      p.nvlink_gbs = 450;
      p.sources = {{"peak_tflops", "NVIDIA H100 Tensor Core GPU datasheet (2023): SXM BF16 1,979 TFLOPS with sparsity = 989 dense"},
                   {"board_power_w", "same datasheet: H100 SXM max TDP up to 700 W"},
                   {"memory_gib", "same datasheet: 80 GB HBM3, 3.35 TB/s"},
                   {"peak_tflops_tf32", "NVIDIA H100 datasheet (2023): SXM TF32 989 TFLOPS with sparsity = 494.5 dense, FP32 67 TFLOPS"},
                   {"nvlink_gbs", "same datasheet: NVLink 900 GB/s total = 450 GB/s per direction"}};
      break;
    case GpuKind::H200:
      p.name = "h200";
      p.peak_tflops_tf32 = 494.5;
      p.peak_tflops_fp32 = 67;
      p.board_power_w = 700;
      p.description = "NVIDIA H200 SXM 141GB, BF16";
      p.peak_tflops = 989;
      p.memory_gib = 141;
      p.mem_bandwidth_gbs = 4800;
      p.nvlink_gbs = 450;
      p.sources = {{"peak_tflops", "NVIDIA H200 Tensor Core GPU datasheet (2024): SXM BF16 1,979 TFLOPS with sparsity = 989 dense"},
                   {"board_power_w", "same datasheet: H200 SXM max TDP up to 700 W"},
                   {"memory_gib", "same datasheet: 141 GB HBM3e, 4.8 TB/s"},
                   {"peak_tflops_tf32", "NVIDIA H200 datasheet (2024): SXM TF32 989 TFLOPS with sparsity = 494.5 dense, FP32 67 TFLOPS"},
                   {"nvlink_gbs", "same datasheet: NVLink 900 GB/s total = 450 GB/s per direction"}};
      break;
  }
  p.gemm_min_dim = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
  p.nvlink_efficiency = gpu == GpuKind::A100 ? 0.78 : 0.8;
  p.sources.emplace_back("nvlink_efficiency", "NCCL all_reduce bus bandwidth of large messages inside one node (nccl-tests): "
                                              "about 235 GB/s on DGX A100 (0.78 x 300), 360 GB/s on DGX H100 (0.8 x 450)");
  if (gpu == GpuKind::A100) {
    p.gemm_fraction = {0.21, 0.35, 0.48, 0.58, 0.63, 0.68, 0.71, 0.73};
  } else {
    p.gemm_fraction = {0.15, 0.28, 0.42, 0.55, 0.65, 0.72, 0.76, 0.78};
  }
  p.sources.emplace_back("gemm_fraction",
                         "achieved fraction of BF16 peak against the smallest GEMM dimension (m, n, k); shape "
                         "from published cuBLAS sweeps (Anthony et al. 2024, arXiv:2401.14489, A100 and H100; "
                         "NVIDIA's Matrix Multiplication Background guide: tile and wave quantization), levels "
                         "checked by `atlas bench validate` (Megatron-LM SC'21 on A100, Llama 3 on H100)");
  p.fused_attention = true;
  p.sources.emplace_back("fused_attention", "FlashAttention (Dao et al. 2022, arXiv:2205.14135), the default of "
                                            "current training stacks; decks of 2021-era runs set train.attention = unfused");
  p.achievable_fraction = 0.45;
  p.nvlink_latency_us = 3;
  p.activation_bytes = 2;
  p.grad_bytes = 2;
  p.pipeline_scatter_gather = true;
  p.sequence_parallel = true;
  p.selective_recompute = true;
  p.sources.emplace_back("achievable_fraction", mfu);
  p.sources.emplace_back("state_bytes_per_param", state);
  p.sources.emplace_back("bwd_over_fwd", bwd);
  p.sources.emplace_back("activation_bytes",
                         "bf16 activations; memory per layer from Korthikanti et al., MLSys'23 (arXiv:2205.05198): "
                         "34*s*b*h/t bytes with sequence parallelism and selective recomputation (their "
                         "recommended setting, used by Megatron-LM for large models)");
  p.sources.emplace_back("grad_bytes", "bf16 gradient all-reduce (generous to DP over the WAN; Megatron's fp32 "
                                       "default would double it)");
  p.sources.emplace_back("pipeline_scatter_gather",
                         "Megatron-LM sends 1/tp of a boundary tensor per TP rank (scatter-gather, Narayanan et al. SC'21)");
  p.sources.emplace_back("usable_memory_fraction", "assumption: 10% for CUDA context, NCCL buffers, fragmentation");
  p.sources.emplace_back("nvlink_latency_us", "assumption: ~3 us per ring step (small-message NCCL latency inside a node)");
  return p;
}

namespace {

/// The GPU kind whose profile costs the deck: plan.gpu, except for a device.backend = cuda deck
/// that leaves plan.gpu = host (the host profile prices a GPU step ~1000x too long): h100, as
/// run_costing with no device name (the run itself costs the GPU it runs on).
GpuKind offline_gpu(const Config& cfg) {
  return cfg.device.backend == Backend::Cuda && cfg.plan.gpu == GpuKind::Host ? GpuKind::H100 : cfg.plan.gpu;
}

/// The profile file (or built-in one) of offline_gpu, before the deck's train.* choices.
DeviceProfile device_profile_of_files(const Config& cfg) {
  ATLAS_ASSERT(cfg.device_profiles.read,
               "the deck's device profile files were not read (deck::load reads them; after deck::parse call "
               "deck::read_device_profiles)");
  const GpuKind kind = offline_gpu(cfg);
  const std::string want = to_string(kind);
  const auto& files = cfg.device_profiles.files;
  if (!cfg.plan.profiles.empty()) {
    std::vector<std::string> names;
    for (const auto& f : files) {
      DeviceProfile p = [&] {
        try {
          return parse_device_profile(f.path, f.text);
        } catch (const ConfigError& e) {  // say which key named the file
          std::vector<std::string> problems;
          for (const auto& m : e.problems()) problems.push_back("plan.profiles: " + m);
          throw ConfigError(problems);
        }
      }();
      if (p.name == want) return p;
      names.push_back(p.name + " (" + f.path + ")");
    }
    std::string listed;
    for (const auto& n : names) listed += (listed.empty() ? "" : ", ") + n;
    throw ConfigError(fmt::format("plan.gpu = {}, but no file in plan.profiles is a '{}' profile (found: {})\n"
                                  "  hint: add profiles/device/{}.profile to plan.profiles or change plan.gpu",
                                  want, want, listed, want));
  }
  // Without plan.profiles the files are profiles/device/<kind>.profile, one per kind found.
  for (const auto& f : files)
    if (fs::path(f.path).stem().string() == want) return parse_device_profile(f.path, f.text);
  return builtin_device_profile(kind);
}

}  // namespace

DeviceProfile device_profile(const Config& cfg) {
  DeviceProfile p = device_profile_of_files(cfg);
  switch (cfg.train.recompute) {
    case Recompute::Auto: break;
    case Recompute::None: p.selective_recompute = false; p.full_recompute = false; break;
    case Recompute::Selective: p.selective_recompute = true; p.full_recompute = false; break;
    case Recompute::Full: p.selective_recompute = false; p.full_recompute = true; break;
  }
  if (cfg.train.sequence_parallel != ProfileSwitch::Auto)
    p.sequence_parallel = cfg.train.sequence_parallel == ProfileSwitch::On;
  if (cfg.train.attention != AttentionKernel::Auto) p.fused_attention = cfg.train.attention == AttentionKernel::Fused;
  p.zero_stage = cfg.train.zero_stage;
  // A GPU run (always costed with a GPU profile: offline_gpu) stores and sends its activations in
  // device.precision's width (bf16: 2 bytes, fp32 and tf32: 4), whatever the profile assumed;
  // other runs keep the profile's.
  if (cfg.device.backend == Backend::Cuda)
    p.activation_bytes = activation_bytes(effective_precision(cfg.device));
  return p;
}

std::optional<GpuKind> gpu_kind_of_device(std::string_view device_name) {
  std::string lower(device_name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (GpuKind g : {GpuKind::A100, GpuKind::H100, GpuKind::H200})
    if (lower.find(to_string(g)) != std::string::npos) return g;
  return std::nullopt;
}

std::string ignored_costing_keys_note(const Config& cfg) {
  if (!cfg.schedule.bwd_over_fwd_ignored()) return {};
  const GpuKind gpu = offline_gpu(cfg);
  return fmt::format("WARNING: schedule.bwd_over_fwd = {:g} has no effect: it scales the forward time that "
                     "schedule.fwd_ms_per_layer or schedule.device_tflops gives, and neither is set (the {} device "
                     "profile {})\n  hint: set one of them, or remove schedule.bwd_over_fwd\n",
                     cfg.schedule.bwd_over_fwd, to_string(gpu),
                     gpu == GpuKind::Host ? "times both passes from its measured block table"
                                          : "costs each pass's kernels, the backward's included");
}

std::string offline_costing_note(const Config& cfg) {
  const std::string ignored = ignored_costing_keys_note(cfg);
  if (offline_gpu(cfg) == cfg.plan.gpu) return ignored;
  return ignored + fmt::format("note: device.backend = cuda leaves plan.gpu = host: costed with the {} device profile (a run "
                     "costs the GPU it runs on); set plan.gpu = a100, h100 or h200 to cost another\n",
                     to_string(offline_gpu(cfg)));
}

RunCosting run_costing(const Config& cfg, std::string_view device_name) {
  const char* measure = "atlas profile --gemm --backend cuda --update profiles/device/{}.profile";
  const std::string ignored = ignored_costing_keys_note(cfg);
  if (cfg.device.backend != Backend::Cuda || cfg.plan.gpu != GpuKind::Host)
    return {cfg.plan.gpu,
            ignored + (cfg.device.backend == Backend::Cuda
                ? fmt::format("# table costed with the {} device profile (plan.gpu); measure its GEMM curve with `{}`\n",
                              to_string(cfg.plan.gpu), fmt::format(fmt::runtime(measure), to_string(cfg.plan.gpu)))
                : std::string())};
  const std::optional<GpuKind> found = gpu_kind_of_device(device_name);
  const GpuKind gpu = found.value_or(offline_gpu(cfg));  // no GPU named: what the offline commands use
  const std::string why =
      found ? std::string("the GPU it runs on")
            : fmt::format("no a100/h100/h200 in the device's name '{}': the nearest built-in GPU profile; set plan.gpu "
                          "to a profile of this GPU",
                          device_name.empty() ? std::string_view("(not known)") : device_name);
  return {gpu, ignored + fmt::format("# table costed with the {} device profile (device.backend = cuda leaves plan.gpu = host: "
                           "{}); measure its GEMM curve with `{}`\n",
                           to_string(gpu), why, fmt::format(fmt::runtime(measure), to_string(gpu)))};
}

}  // namespace atlas::sched
