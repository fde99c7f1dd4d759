// SPDX-License-Identifier: MIT
// The default block timer (OpenBLAS sgemm over a transformer block's GEMM shapes) and the
// measurement of a device profile's table.
#include "atlas/sim/measure.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "atlas/core/check.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/sched/cost_model.hpp"

namespace atlas::sim {

namespace {

/// One GEMM of the block: C[m x n] = A[m x k] * B[k x n], `count` times (per head / sample).
struct Gemm {
  int m, n, k, count;
};

std::vector<Gemm> block_gemms(const BlockShape& s) {
  const int tokens = s.micro_batch_size * s.seq_len;
  const int h = s.hidden;
  const int d = s.hidden / s.heads;
  const int local_heads = std::max(1, s.heads / s.tp);
  const int hl = h / s.tp;
  return {
      {tokens, 3 * hl, h, 1},                                       // QKV projection
      {s.seq_len, s.seq_len, d, s.micro_batch_size * local_heads},  // scores Q K^T
      {s.seq_len, d, s.seq_len, s.micro_batch_size * local_heads},  // scores x V
      {tokens, h, hl, 1},                                           // output projection
      {tokens, 4 * hl, h, 1},                                       // MLP up
      {tokens, h, 4 * hl, 1},                                       // MLP down
  };
}

double time_ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

BlockTimer sgemm_block_timer(int repeats, int threads) {
  return [repeats, threads](const BlockShape& s) {
    ATLAS_ASSERT(s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0 && s.seq_len > 0 && s.micro_batch_size > 0 &&
                     s.tp > 0 && s.hidden % s.tp == 0,
                 "bad block shape");
    if (threads > 0) openblas_set_num_threads(threads);
    const auto gemms = block_gemms(s);
    std::size_t biggest = 0;
    for (const auto& g : gemms)
      biggest = std::max({biggest, static_cast<std::size_t>(g.m) * g.k, static_cast<std::size_t>(g.k) * g.n,
                          static_cast<std::size_t>(g.m) * g.n});
    std::vector<float> a(biggest, 0.01f), b(biggest, 0.02f), c(biggest, 0.0f);
    auto forward = [&] {
      for (const auto& g : gemms)
        for (int i = 0; i < g.count; ++i)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.m, g.n, g.k, 1.0f, a.data(), g.k, b.data(), g.n,
                      0.0f, c.data(), g.n);
    };
    auto backward = [&] {
      for (const auto& g : gemms)
        for (int i = 0; i < g.count; ++i) {
          // dA[m x k] = dC[m x n] * B^T ; dB[k x n] = A^T * dC
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.m, g.k, g.n, 1.0f, c.data(), g.n, b.data(), g.n,
                      0.0f, a.data(), g.k);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.k, g.n, g.m, 1.0f, a.data(), g.k, c.data(), g.n,
                      0.0f, b.data(), g.n);
        }
    };
    forward();  // warm-up (page faults, thread start)
    backward();
    std::vector<double> f;
    std::vector<double> bw;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      f.push_back(time_ms(forward));
      bw.push_back(time_ms(backward));
    }
    std::sort(f.begin(), f.end());
    std::sort(bw.begin(), bw.end());
    return BlockTiming{f[f.size() / 2], bw[bw.size() / 2]};
  };
}

std::vector<BlockShape> default_host_shapes(bool quick) {
  if (quick) return {{64, 4, 32, 1, 1}, {128, 4, 64, 2, 1}};
  std::vector<BlockShape> out;
  for (int h : {64, 128, 256, 512, 1024})
    for (int seq : {64, 256})
      for (int b : {1, 4}) out.push_back({h, std::max(4, h / 64), seq, b, 1});
  return out;
}

DeviceProfile measure_device_profile(const BlockTimer& timer, const std::vector<BlockShape>& shapes,
                                     DeviceProfile base) {
  base.table.clear();
  double best = 0.0;
  for (const auto& s : shapes) {
    const BlockTiming t = timer(s);
    ATLAS_ASSERT(t.fwd_ms > 0 && t.bwd_ms > 0, "block timer returned a non-positive time");
    base.table.push_back({s.hidden, s.heads, s.seq_len, s.micro_batch_size, s.tp, t.fwd_ms, t.bwd_ms});
    ModelCfg m;
    m.hidden = s.hidden;
    m.heads = s.heads;
    m.seq_len = s.seq_len;
    const double flops = sched::block_forward_flops(m, static_cast<double>(s.micro_batch_size) * s.seq_len) / s.tp;
    best = std::max(best, flops / (t.fwd_ms * 1e-3));
  }
  base.peak_tflops = best / 1e12;
  base.achievable_fraction = 1.0;
  return base;
}

double host_memory_gib() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemTotal:") return kib / (1024.0 * 1024.0);
  return 0.0;
}

}  // namespace atlas::sim
