// SPDX-License-Identifier: MIT
// GEMM benchmark: device::Backend::gemm versus the vendor call made directly (cblas_sgemm on the
// host, cublasSgemm with backend=cuda) on the model's shapes. Both run on the same buffers (same
// OpenBLAS thread count / same cuBLAS handle and stream), calls alternate so machine noise hits
// both alike, and the best of `reps` timed calls is reported for each.
#include "atlas/model/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/device/reference_gemm.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::model {

namespace {

struct Shape {
  std::string name;
  device::Trans ta, tb;
  int m, n, k;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const atlas::bench::Spec& gemm_bench_spec() {
  static const atlas::bench::Spec spec{
      "gemm",
      "backend GEMM on the model's shapes vs the bare vendor call (cblas_sgemm / cublasSgemm)",
      "[device.backend=host|cuda] [device.threads=N]",
      {{"hidden", "N", "768", "model width (d_model)"},
       {"seq-len", "N", "256", "tokens per sample"},
       {"batch", "N", "4", "samples per micro-batch"},
       {"vocab", "N", "256", "vocabulary (lm_head shapes)"},
       {"tp", "N", "1", "the per-rank shard of column/row-parallel layers"},
       {"reps", "N", "5", "timed calls per shape (the best is reported)"}}};
  return spec;
}

int run_gemm_bench(const atlas::bench::Args& args) {
  if (!args.positional.empty()) args.fail("unknown argument '" + args.positional.front() + "' (no deck: only device.* keys)");
  std::map<std::string, long> opt;
  for (const char* name : {"hidden", "seq-len", "batch", "vocab", "tp", "reps"})
    opt[name] = args.integer(name, 1, 1 << 24);
  // What the backend is and how many threads it runs are the deck's device.* keys.
  for (const auto& o : args.overrides)
    if (o.rfind("device.", 0) != 0) args.fail("'" + o + "': only device.* keys apply to this benchmark");
  const Config deck = deck::parse("(atlas bench gemm)", "cluster.dcs = a\ncluster.gpus_per_dc = 1\nparallel.stages_per_dc = 1\n",
                                  args.overrides);
  const atlas::Backend kind = deck.device.backend;
  const int c = static_cast<int>(opt["hidden"]);
  const int tp = static_cast<int>(opt["tp"]);
  // The shapes' sizes in 64 bits: seq-len x batch, and the largest matrix (tokens x the widest
  // of vocab and 4 x hidden), must fit a GEMM's int dimensions and this machine's memory.
  const long tokens = opt["seq-len"] * opt["batch"];
  const double widest = static_cast<double>(std::max({opt["vocab"], 4 * opt["hidden"]}));
  const double largest_bytes = static_cast<double>(tokens) * widest * sizeof(float);
  if (tokens > std::numeric_limits<int>::max())
    args.fail(fmt::format("--seq-len {} x --batch {} = {} tokens: more than a GEMM dimension holds ({})",
                          opt["seq-len"], opt["batch"], tokens, std::numeric_limits<int>::max()));
  if (largest_bytes > 64.0 * 1024 * 1024 * 1024)
    args.fail(fmt::format("the largest matrix ({} tokens x {:g}) would take {:.0f} GiB (at most 64 GiB)", tokens,
                          widest, largest_bytes / (1024.0 * 1024 * 1024)));
  const int n_tok = static_cast<int>(tokens);
  const int v = static_cast<int>(opt["vocab"]);
  const int reps = static_cast<int>(opt["reps"]);
  if (c % tp != 0) args.fail(fmt::format("--hidden {} is not divisible by --tp {}", c, tp));
  const int cl = c / tp;
  const int ff = 4 * c / tp;
  using device::Trans;
  const std::vector<Shape> shapes = {
      {"attn.qkv fwd", Trans::No, Trans::Yes, n_tok, 3 * cl, c},
      {"attn.proj fwd", Trans::No, Trans::Yes, n_tok, c, cl},
      {"mlp.fc fwd", Trans::No, Trans::Yes, n_tok, ff, c},
      {"mlp.proj fwd", Trans::No, Trans::Yes, n_tok, c, ff},
      {"lm_head fwd", Trans::No, Trans::Yes, n_tok, v, c},
      {"attn.qkv dX", Trans::No, Trans::No, n_tok, c, 3 * cl},
      {"attn.qkv dW", Trans::Yes, Trans::No, 3 * cl, c, n_tok},
      {"mlp.fc dX", Trans::No, Trans::No, n_tok, c, ff},
      {"mlp.fc dW", Trans::Yes, Trans::No, ff, c, n_tok},
      {"mlp.proj dX", Trans::No, Trans::No, n_tok, ff, c},
      {"mlp.proj dW", Trans::Yes, Trans::No, c, ff, n_tok},
      {"lm_head dW", Trans::Yes, Trans::No, v, c, n_tok},
  };

  auto backend = device::make_backend(deck.device);
  const char* reference = device::reference_gemm_name(kind);
  fmt::print("# atlas bench gemm: {} backend gemm vs bare {} ({}), best of {} calls\n",
             to_string(kind), reference, backend->describe(), reps);
  fmt::print("# model shapes: hidden {}, tp {}, seq_len x batch = {} tokens, vocab {}\n", c, tp,
             n_tok, v);
  const atlas::bench::Table table({{"shape", "", 14, true},
                                   {"op", "", 2},
                                   {"m", "", 6},
                                   {"n", "", 6},
                                   {"k", "", 6},
                                   {"backend", "GF/s", 13},
                                   {kind == atlas::Backend::Host ? "cblas" : "cublas", "GF/s", 13},
                                   {"ratio", "", 7}});
  fmt::print("{}", table.head());

  double total_flops = 0.0;
  double total_backend_s = 0.0;
  double total_cblas_s = 0.0;
  for (const Shape& s : shapes) {
    // Stored operand shapes (row-major): A is m x k (or k x m if transposed), B is k x n (n x k).
    const int lda = s.ta == Trans::Yes ? s.m : s.k;
    const int ldb = s.tb == Trans::Yes ? s.k : s.n;
    const std::size_t a_n = static_cast<std::size_t>(s.m) * s.k;
    const std::size_t b_n = static_cast<std::size_t>(s.k) * s.n;
    const std::size_t c_n = static_cast<std::size_t>(s.m) * s.n;
    std::vector<float> host(std::max(a_n, b_n));
    const std::uint64_t key = rng::key(1, s.name);
    for (std::size_t i = 0; i < host.size(); ++i) {
      host[i] = static_cast<float>(rng::uniform(key, i) - 0.5);
    }
    device::Buffer a = backend->alloc_floats(a_n);
    device::Buffer b = backend->alloc_floats(b_n);
    device::Buffer out = backend->alloc_floats(c_n);
    backend->upload(a.data(), host.data(), a_n * sizeof(float));
    backend->upload(b.data(), host.data(), b_n * sizeof(float));

    auto run_backend = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      backend->gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0F, a.f32(), lda, b.f32(), ldb, 0.0F, out.f32(),
                    s.n);
      backend->synchronize();
      return seconds_since(t0);
    };
    auto run_cblas = [&] {  // the direct vendor call (returns when the product is done)
      const auto t0 = std::chrono::steady_clock::now();
      device::reference_gemm(*backend, s.ta, s.tb, s.m, s.n, s.k, 1.0F, a.f32(), lda, b.f32(), ldb,
                             0.0F, out.f32(), s.n);
      return seconds_since(t0);
    };
    run_backend();  // warm-up (first-touch, OpenBLAS thread start)
    run_cblas();
    double best_backend = 1e30;
    double best_cblas = 1e30;
    for (int r = 0; r < reps; ++r) {
      if (r % 2 == 0) {
        best_backend = std::min(best_backend, run_backend());
        best_cblas = std::min(best_cblas, run_cblas());
      } else {
        best_cblas = std::min(best_cblas, run_cblas());
        best_backend = std::min(best_backend, run_backend());
      }
    }
    const double flops = 2.0 * s.m * s.n * s.k;
    total_flops += flops;
    total_backend_s += best_backend;
    total_cblas_s += best_cblas;
    fmt::print("{}", table.row({s.name, fmt::format("{}{}", s.ta == Trans::Yes ? 'T' : 'N', s.tb == Trans::Yes ? 'T' : 'N'),
                                std::to_string(s.m), std::to_string(s.n), std::to_string(s.k),
                                fmt::format("{:.1f}", flops / best_backend * 1e-9),
                                fmt::format("{:.1f}", flops / best_cblas * 1e-9),
                                fmt::format("{:.3f}", best_cblas / best_backend)}));
  }
  const double ratio = total_cblas_s / total_backend_s;
  fmt::print("{}", table.row({"overall", "", "", "", "", fmt::format("{:.1f}", total_flops / total_backend_s * 1e-9),
                              fmt::format("{:.1f}", total_flops / total_cblas_s * 1e-9), fmt::format("{:.3f}", ratio)}));
  const bool ok = ratio >= 0.7;
  fmt::print("{}", atlas::bench::footer("gemm", fmt::format("backend/{} throughput ratio {:.3f} (goal >= 0.7): {}",
                                                            reference, ratio, ok ? "OK" : "FAILED")));
  std::fflush(stdout);
  return ok ? 0 : 2;
}

}  // namespace atlas::model
