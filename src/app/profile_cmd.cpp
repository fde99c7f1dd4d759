// SPDX-License-Identifier: MIT
// `atlas profile`: measure this machine's per-block compute cost into a device profile
// (default profiles/device/host.profile); --show FILE checks and summarises a profile;
// --wan FILE [--dcs "a b c"] prints the deck lines of those regions; --gemm times GEMMs of several
// shapes on a backend (the profile's GEMM efficiency curve) and --update FILE writes it there.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <cmath>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/core/file.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/core/check.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/sim/measure.hpp"
#include "atlas/sim/profile.hpp"

namespace atlas::app {

namespace {

int show(const std::string& path) {
  // A device or a WAN profile: try the kind the file names.
  const std::string text = deck::read_text_file(path);
  const bool wan = std::regex_search(text, std::regex("(^|\n)[ \t]*kind[ \t]*=[ \t]*\"?wan\"?[ \t]*(#|\n|$)"));
  if (wan) {
    const sim::WanProfile w = sim::parse_wan_profile(path, text);
    fmt::print("# WAN profile {} ({} regions, measured {})\n", w.name, w.regions.size(), w.date);
    for (const auto& [k, v] : w.sources) fmt::print("#   source.{}: {}\n", k, v);
    return 0;
  }
  const sim::DeviceProfile p = sim::parse_device_profile(path, text);
  fmt::print("# device profile {}: {}\n", p.name, p.description);
  fmt::print("  achieved forward rate {:.4g} TFLOP/s, memory {:g} GiB, {} measured blocks\n",
             p.peak_tflops * p.achievable_fraction, p.memory_gib, p.table.size());
  for (const auto& [k, v] : p.sources) fmt::print("#   source.{}: {}\n", k, v);
  return 0;
}

int wan_lines(const std::string& path, const std::string& dcs_text) {
  const sim::WanProfile w = sim::load_wan_profile(path);
  const std::vector<std::string> dcs = dcs_text.empty() ? w.regions : deck::split_list(dcs_text);
  const auto ov = w.deck_overrides(dcs);
  fmt::print("# from WAN profile {} ({}, measured {}); one-way latency = RTT / 2\n", w.name, path, w.date);
  std::string names;
  for (const auto& d : dcs) names += (names.empty() ? "" : " ") + d;
  fmt::print("cluster.dcs            = {}\n", names);
  for (const auto& o : ov) {
    const auto eq = o.find('=');
    fmt::print("{:<22} = {}\n", o.substr(0, eq), o.substr(eq + 1));
  }
  return 0;
}

/// `atlas profile --gemm`: GEMMs (L x L x d, d the smallest dimension) on the backend, median of
/// `repeat` after a warm-up; prints the achieved rate per d and the curve's fraction against the
/// peak of the precision measured (the `--update` profile's, else the best measured rate), and
/// with --update rewrites that profile's gemm_min_dim / gemm_fraction. The host measures fp32
/// (OpenBLAS sgemm) against peak_tflops; a GPU measures --precision bf16 by default (the
/// training's, through cuBLASLt, its operands' conversion included) against peak_tflops, or tf32 /
/// fp32 against peak_tflops_tf32 / peak_tflops_fp32: the simulator prices a GEMM at peak_tflops x
/// the fraction, so a fraction must be of the peak of the precision it was measured in.
int gemm_curve(const Args& args, int threads, int repeat) {
  const std::string kind = args.option("backend", "host");
  if (kind != "host" && kind != "cuda") throw UsageError("--backend must be host or cuda");
  const std::string prec = args.option("precision", kind == "cuda" ? "bf16" : "fp32");
  if (prec != "fp32" && prec != "tf32" && prec != "bf16")
    throw UsageError("--precision must be fp32, tf32 or bf16, not '" + prec + "'");
  if (kind == "host" && prec != "fp32")
    throw UsageError("--precision " + prec + " on the host backend: the host emulates " + prec +
                     " by rounding fp32 (docs/precision.md), which measures no " + prec +
                     " hardware\n  hint: drop --precision (the host measures fp32), or measure a GPU with --backend "
                     "cuda");
  DeviceCfg dev;
  dev.backend = kind == "cuda" ? Backend::Cuda : Backend::Host;
  dev.threads = threads;
  dev.precision = prec == "bf16" ? Precision::Bf16 : prec == "tf32" ? Precision::Tf32 : Precision::Fp32;
  auto backend = device::make_backend(dev);
  // Small on the CPU (a few seconds with one thread), up to 8192 on a GPU.
  const std::vector<int> dims = kind == "cuda" ? std::vector<int>{64, 128, 256, 512, 1024, 2048, 4096, 8192}
                                               : std::vector<int>{16, 32, 64, 128, 256};
  const int large = kind == "cuda" ? 8192 : 256;
  const std::string update = args.option("update");
  sim::DeviceProfile target;
  double target_peak = 0.0;  // the --update profile's peak of this precision
  const char* peak_key = prec == "bf16" || kind == "host" ? "peak_tflops" : prec == "tf32" ? "peak_tflops_tf32"
                                                                                          : "peak_tflops_fp32";
  if (!update.empty()) {
    target = sim::parse_device_profile(update, deck::read_text_file(update, deck::kMaxDeckBytes, "profile"));
    target_peak = std::string_view(peak_key) == "peak_tflops"        ? target.peak_tflops
                  : std::string_view(peak_key) == "peak_tflops_tf32" ? target.peak_tflops_tf32
                                                                     : target.peak_tflops_fp32;
    if (target_peak <= 0)
      throw ConfigError(fmt::format("atlas profile --gemm --update {}: the profile gives no {}, the peak a {} curve "
                                    "is a fraction of\n  hint: add {} = TFLOPS to it, or measure --precision bf16",
                                    update, peak_key, prec, peak_key));
    if (prec != "bf16" && kind == "cuda")
      std::fprintf(stderr,
                   "note: the curve is of %s GEMMs (fractions of %s); the simulator prices the training's GEMMs "
                   "at peak_tflops x the fraction\n",
                   prec.c_str(), peak_key);
  }
  fmt::print("# GEMM efficiency curve on the {} backend ({}), {} thread(s), median of {}: L x L x d, L = {}\n", kind,
             prec, threads, repeat, large);
  fmt::print("# {:>6} {:>6} {:>6} {:>12} {:>12}\n", "d", "L", "L", "ms", "TFLOP/s");
  std::vector<double> rates;
  for (int d : dims) {
    const int L = std::max(large, d);
    device::Buffer a = backend->alloc_floats(static_cast<std::size_t>(L) * d);
    device::Buffer b = backend->alloc_floats(static_cast<std::size_t>(d) * L);
    device::Buffer c = backend->alloc_floats(static_cast<std::size_t>(L) * L);
    backend->fill(a.f32(), 0.5f, static_cast<std::size_t>(L) * d);
    backend->fill(b.f32(), 0.25f, static_cast<std::size_t>(L) * d);
    std::vector<double> ms;
    for (int r = 0; r <= repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      backend->gemm(device::Trans::No, device::Trans::No, L, L, d, 1.0f, a.f32(), d, b.f32(), L,
                    0.0f, c.f32(), L);
      backend->synchronize();
      if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    rates.push_back(2.0 * L * L * d / (med * 1e-3) / 1e12);
    fmt::print("  {:>6} {:>6} {:>6} {:>12.4f} {:>12.5g}\n", d, L, L, med, rates.back());
    std::fflush(stdout);
  }
  const double peak = target_peak > 0 ? target_peak : *std::max_element(rates.begin(), rates.end());
  std::string dim_line;
  std::string frac_line;
  std::vector<double> fracs;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    fracs.push_back(std::clamp(rates[i] / peak, 1e-6, 1.0));
    dim_line += fmt::format("{}{}", i ? " " : "", dims[i]);
    frac_line += fmt::format("{}{:.3g}", i ? " " : "", fracs.back());
  }
  fmt::print("gemm_min_dim              = {}\ngemm_fraction             = {}\n", dim_line, frac_line);
  if (!update.empty()) {
    target.gemm_min_dim.assign(dims.begin(), dims.end());
    target.gemm_fraction = fracs;
    bool found = false;
    for (auto& [k, v] : target.sources)
      if (k == "gemm_fraction")
        v = fmt::format("measured by `atlas profile --gemm --backend {} --precision {}` (of {})", kind, prec, peak_key),
        found = true;
    if (!found)
      target.sources.emplace_back("gemm_fraction", fmt::format("measured by `atlas profile --gemm --backend {} "
                                                               "--precision {}` (of {})",
                                                               kind, prec, peak_key));
    write_file_whole(update, sim::format_device_profile(target));
    fmt::print("# wrote the curve (fractions of {:.4g} TFLOP/s) into {}\n", peak, update);
  }
  return 0;
}

}  // namespace

int cmd_profile(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  const Args args = parse_args(
      ctx.args, {"out", "threads", "repeat", "show", "wan", "dcs", "timer", "backend", "update", "precision"},
      {"quick", "gemm"},
      {{"out", "FILE: the measured host profile (profiles/device/host.profile)"},
       {"threads", "N: host threads per rank (1)"},
       {"repeat", "N: timings per shape, the median kept (3)"},
       {"timer", "model|sgemm: time the real block, or its GEMMs alone (model)"},
       {"quick", "fewer block shapes"},
       {"gemm", "the GEMM efficiency curve instead of the block table"},
       {"backend", "host|cuda: where --gemm measures (host)"},
       {"precision", "fp32|tf32|bf16: --gemm's GEMMs (cuda: bf16, the training's; host: fp32)"},
       {"update", "PROFILE: write --gemm's curve into this device profile"},
       {"show", "PROFILE: print a device profile's figures, nothing measured"},
       {"wan", "PROFILE: a WAN profile's matrices as deck lines, nothing measured"},
       {"dcs", "NAMES: --wan's regions, in this order (all)"}});
  if (!args.overrides.empty())
    throw UsageError("atlas profile takes no key=value overrides (got '" + args.overrides.front() +
                     "'): it measures this machine, not a deck; its options are listed by atlas profile --help");
  // --show and --wan read a file and measure nothing: another option with them was ignored.
  if (args.flag("show")) {
    only_options(args, "profile --show", {"show"});
    return show(args.option("show"));
  }
  if (args.flag("wan")) {
    only_options(args, "profile --wan", {"wan", "dcs"});
    return wan_lines(args.option("wan"), args.option("dcs"));
  }
  if (!args.positional.empty()) throw UsageError("atlas profile takes no deck (options: --out FILE --quick --threads N)");

  const int threads = args.int_option("threads", 1, 1, 4096);
  const int repeat = args.int_option("repeat", 3, 1, 1000000);
  // Each mode reads its own options: `--backend cuda --out FILE` without --gemm measured the host
  // CPU into FILE; --out with --gemm was ignored.
  if (args.flag("gemm")) {
    only_options(args, "profile --gemm", {"gemm", "backend", "update", "threads", "repeat", "precision"});
    return gemm_curve(args, threads, repeat);
  }
  only_options(args, "profile", {"out", "threads", "repeat", "timer", "quick"});
  const std::string out = args.option("out", "profiles/device/host.profile");
  const auto shapes = sim::default_host_shapes(args.flag("quick"));

  sim::DeviceProfile base = sim::builtin_device_profile(GpuKind::Host);
  const std::string timer_kind = args.option("timer", "model");
  if (timer_kind != "model" && timer_kind != "sgemm") throw UsageError("--timer must be model or sgemm");
  const bool real = timer_kind == "model";
  base.description = fmt::format("this machine's host backend, {}, {} thread(s) per rank",
                                 real ? "the real transformer block (fp32)" : "OpenBLAS sgemm fp32", threads);
  base.measured_threads = threads;
  if (const double mem = sim::host_memory_gib(); mem > 0) base.memory_gib = std::floor(mem * 10) / 10;
  base.sources = {
      {"table", real ? "measured by `atlas profile --timer model`: the model's own block forward/backward on the host "
                       "backend (GEMMs, attention, norms, GELU; no communication)"
                     : "measured by `atlas profile --timer sgemm` (sgemm over the block's GEMM shapes; elementwise ops not timed)"},
      {"peak_tflops", "best measured forward rate in the table (achievable_fraction = 1)"},
      {"memory_gib", "MemTotal of /proc/meminfo on the measuring machine"},
      {"mem_bandwidth_gbs", "assumption (8 GB/s streaming per rank), not measured"},
      {"nvlink_gbs", "assumption (5 GB/s, 1 us between ranks of a node through shared memory), not measured"},
  };
  fmt::print("# measuring {} block shapes ({} timer) with {} thread(s), median of {} ...\n", shapes.size(), timer_kind,
             threads, repeat);
  const sim::BlockTimer timer = real ? model_block_timer(repeat, threads) : sim::sgemm_block_timer(repeat, threads);
  const sim::BlockTimer verbose = [&](const sim::BlockShape& s) {
    const sim::BlockTiming t = timer(s);
    fmt::print("  hidden {:>5} heads {:>3} seq {:>5} mbs {:>2} tp {}: fwd {:9.3f} ms  bwd {:9.3f} ms\n", s.hidden,
               s.heads, s.seq_len, s.micro_batch_size, s.tp, t.fwd_ms, t.bwd_ms);
    std::fflush(stdout);
    return t;
  };
  const sim::DeviceProfile p = sim::measure_device_profile(verbose, shapes, base);
  std::error_code ec;
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  write_file_whole(out, sim::format_device_profile(p));
  fmt::print("# best forward rate {:.3f} GFLOP/s; wrote {}\n", p.peak_tflops * 1e3, out);
  return 0;
}

}  // namespace atlas::app
