// SPDX-License-Identifier: MIT
// The kernels of the fused causal attention (flash-attention 2 style), included by
// flash_attention.cu (the launchers) and by the CPU emulation test (tests/unit/
// test_flash_attention_emulated.cpp, which runs them on a CUDA shim). Device code only.
//
// Layout: qkv [B,T,3,H,D], out/dout [B,T,H,D], lse/delta [B,H,T]. Every block works on one
// (batch, head) and one tile of rows; each warp owns 16 rows of the tile, so the score strip,
// its softmax and the accumulators it updates are private to the warp (only the K/V or Q/dO
// tiles are shared, loaded by the whole block between barriers).
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "common.cuh"

namespace atlas::device::cuda::kernels::flash {

using bf16 = __nv_bfloat16;

constexpr int kStrip = 16;  // rows per warp (the wmma tile edge)

template <class E>
constexpr bool kIsFloat = std::is_same_v<E, float>;
// Row padding of shared tiles, in elements. fp32: +1 (odd strides: the scalar products read a
// column across lanes without bank conflicts). bf16: wmma wants a leading dimension that is a
// multiple of 8 (16-bit) or 4 (float) elements and 32-byte aligned fragment pointers; +8 / +4
// keeps both and staggers the rows.
template <class E>
constexpr int kPadE = kIsFloat<E> ? 1 : 8;  // tiles of E (q, k, v, dout, P, dS)
template <class E>
constexpr int kPadF = kIsFloat<E> ? 1 : 4;  // float tiles (scores, accumulators)

constexpr std::size_t align128(std::size_t bytes) { return (bytes + 127) / 128 * 128; }

template <class E>
__device__ __forceinline__ E to_elem(float x) {
  if constexpr (kIsFloat<E>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);  // round to nearest even; NaN stays NaN
  }
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

/// Rows [t0, t0 + kRows) of one head (token t's D floats at g + t * row) into a shared tile of
/// Dp columns and row stride ld, converted to E; rows at or past seq and columns at or past
/// head_dim are zero (so they add nothing to any product).
template <class E, int Dp, int kRows>
__device__ void load_tile(E* tile, int ld, const float* g, std::size_t row, int t0, int seq,
                          int head_dim) {
  for (int i = static_cast<int>(threadIdx.x); i < kRows * Dp; i += static_cast<int>(blockDim.x)) {
    const int r = i / Dp;
    const int d = i % Dp;
    const int t = t0 + r;
    const float x = (t < seq && d < head_dim) ? g[static_cast<std::size_t>(t) * row + d] : 0.0F;
    tile[r * ld + d] = to_elem<E>(x);
  }
}

// ---- one warp's 16-row tile products ----
// A StripAcc is a warp's fp32 accumulator of a 16 x N strip, in registers: fp32, lane owns
// columns lane, lane + 32, ... of every row; bf16, N/16 wmma accumulator fragments. warp_mma
// adds A[16 x K] . B[K x N] to it: A row-major (a[r * lda + k]) or, with kATrans, stored
// column-major (a[k * lda + r]); B row-major (b[k * ldb + n]) or, with kBTrans, stored as its
// transpose (b[n * ldb + k]). fp32: scalar FMA; bf16: 16x16x16 wmma with fp32 accumulation.
// acc_load / acc_store move the strip from / to a float row-major tile. N and K are multiples
// of 32 and 16. The bf16 path needs sm_80; the build targets sm_80 and sm_90 only.

template <class E, int N, bool = kIsFloat<E>>
struct StripAcc {  // fp32
  float v[kStrip][N / kWarp];
};
template <class E, int N>
struct StripAcc<E, N, false> {  // bf16
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kStrip, kStrip, kStrip, float> f[N / kStrip];
};

template <class E, int N>
__device__ __forceinline__ void acc_zero(StripAcc<E, N>& acc) {
  if constexpr (kIsFloat<E>) {
#pragma unroll
    for (int r = 0; r < kStrip; ++r)
#pragma unroll
      for (int j = 0; j < N / kWarp; ++j) acc.v[r][j] = 0.0F;
  } else {
#pragma unroll
    for (int j = 0; j < N / kStrip; ++j) nvcuda::wmma::fill_fragment(acc.f[j], 0.0F);
  }
}

template <class E, int N>
__device__ __forceinline__ void acc_load(StripAcc<E, N>& acc, const float* c, int ldc) {
  if constexpr (kIsFloat<E>) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll
    for (int r = 0; r < kStrip; ++r)
#pragma unroll
      for (int j = 0; j < N / kWarp; ++j) acc.v[r][j] = c[r * ldc + lane + kWarp * j];
  } else {
#pragma unroll
    for (int j = 0; j < N / kStrip; ++j)
      nvcuda::wmma::load_matrix_sync(acc.f[j], c + kStrip * j, static_cast<unsigned>(ldc),
                                     nvcuda::wmma::mem_row_major);
  }
}

template <class E, int N>
__device__ __forceinline__ void acc_store(float* c, int ldc, const StripAcc<E, N>& acc) {
  if constexpr (kIsFloat<E>) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll
    for (int r = 0; r < kStrip; ++r)
#pragma unroll
      for (int j = 0; j < N / kWarp; ++j) c[r * ldc + lane + kWarp * j] = acc.v[r][j];
  } else {
#pragma unroll
    for (int j = 0; j < N / kStrip; ++j)
      nvcuda::wmma::store_matrix_sync(c + kStrip * j, acc.f[j], static_cast<unsigned>(ldc),
                                      nvcuda::wmma::mem_row_major);
  }
}

template <class E, int N, int K, bool kATrans, bool kBTrans>
__device__ __forceinline__ void warp_mma(StripAcc<E, N>& acc, const E* a, int lda, const E* b,
                                         int ldb) {
  static_assert(N % kWarp == 0 && K % kStrip == 0, "tile shapes");
  if constexpr (kIsFloat<E>) {
    constexpr int kCols = N / kWarp;
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      float bv[kCols];
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int n = lane + kWarp * j;
        bv[j] = kBTrans ? b[n * ldb + k] : b[k * ldb + n];
      }
#pragma unroll
      for (int r = 0; r < kStrip; ++r) {
        const float av = kATrans ? a[k * lda + r] : a[r * lda + k];
#pragma unroll
        for (int j = 0; j < kCols; ++j) acc.v[r][j] = fmaf(av, bv[j], acc.v[r][j]);
      }
    }
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    namespace wmma = nvcuda::wmma;
    using ALayout = std::conditional_t<kATrans, wmma::col_major, wmma::row_major>;
    using BLayout = std::conditional_t<kBTrans, wmma::col_major, wmma::row_major>;
#pragma unroll 2
    for (int k = 0; k < K; k += kStrip) {
      wmma::fragment<wmma::matrix_a, kStrip, kStrip, kStrip, bf16, ALayout> fa;
      wmma::load_matrix_sync(fa, kATrans ? a + k * lda : a + k, static_cast<unsigned>(lda));
#pragma unroll
      for (int j = 0; j < N / kStrip; ++j) {
        wmma::fragment<wmma::matrix_b, kStrip, kStrip, kStrip, bf16, BLayout> fb;
        wmma::load_matrix_sync(fb, kBTrans ? b + kStrip * j * ldb + k : b + k * ldb + kStrip * j,
                               static_cast<unsigned>(ldb));
        wmma::mma_sync(acc.f[j], fa, fb, acc.f[j]);
      }
    }
#endif
  }
}

/// C[16 x N] (= or, with kAccumulate, +=) A . B through shared memory (float tile C).
template <class E, int N, int K, bool kATrans, bool kBTrans, bool kAccumulate>
__device__ __forceinline__ void warp_mm(float* c, int ldc, const E* a, int lda, const E* b,
                                        int ldb) {
  StripAcc<E, N> acc;
  if constexpr (kAccumulate) {
    acc_load(acc, c, ldc);
  } else {
    acc_zero(acc);
  }
  warp_mma<E, N, K, kATrans, kBTrans>(acc, a, lda, b, ldb);
  acc_store(c, ldc, acc);
}

// ---- forward ----

// Tiles per padded head dim: 64 queries x 64 keys forward for Dp <= 64, 64 x 32 for Dp = 128
// (shared memory; the launchers and the emulation test use these); the backward's square tiles are 64 (4 warps) or 32 (2 warps) for Dp = 128.
template <int Dp>
constexpr int kFwdKeys = Dp <= 64 ? 64 : 32;
template <int Dp>
constexpr int kBwdWarps = Dp <= 64 ? 4 : 2;


/// Shared memory of the forward: Q [Br x Dp], K and V [Bc x Dp] (E), scores S [Br x Bc] (float),
/// probabilities P [Br x Bc] (E; for fp32 P overwrites S in place), output accumulator O
/// [Br x Dp] (float).
template <class E, int Dp, int Bc>
struct FwdLayout {
  static constexpr int kWarps = 4;
  static constexpr int kBr = kStrip * kWarps;
  static constexpr int kLdE = Dp + kPadE<E>;
  static constexpr int kLdS = Bc + kPadF<E>;
  static constexpr int kLdP = kIsFloat<E> ? kLdS : Bc + kPadE<E>;
  static constexpr int kLdO = Dp + kPadF<E>;
  static constexpr std::size_t kQ = 0;
  static constexpr std::size_t kK = align128(kQ + sizeof(E) * kBr * kLdE);
  static constexpr std::size_t kV = align128(kK + sizeof(E) * Bc * kLdE);
  static constexpr std::size_t kS = align128(kV + sizeof(E) * Bc * kLdE);
  static constexpr std::size_t kP = kIsFloat<E> ? kS : align128(kS + sizeof(float) * kBr * kLdS);
  static constexpr std::size_t kO =
      align128((kIsFloat<E> ? kS + sizeof(float) * kBr * kLdS : kP + sizeof(E) * kBr * kLdP));
  static constexpr std::size_t kBytes = align128(kO + sizeof(float) * kBr * kLdO);
};

template <class E, int Dp, int Bc>
__global__ void __launch_bounds__(FwdLayout<E, Dp, Bc>::kWarps * kWarp)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int seq, int heads,
                         int head_dim, float scale) {
  using L = FwdLayout<E, Dp, Bc>;
  extern __shared__ __align__(128) unsigned char smem[];
  E* qs = reinterpret_cast<E*>(smem + L::kQ);
  E* ks = reinterpret_cast<E*>(smem + L::kK);
  E* vs = reinterpret_cast<E*>(smem + L::kV);
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  E* ps = reinterpret_cast<E*>(smem + L::kP);
  float* os = reinterpret_cast<float*>(smem + L::kO);

  // The longest rows (most keys) first: the last query tile is the first block.
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int q0 = qt * L::kBr;
  const std::size_t hd = static_cast<std::size_t>(heads) * head_dim;
  const std::size_t row = 3 * hd;  // floats from one token's qkv to the next
  const float* qg = qkv + static_cast<std::size_t>(b) * seq * row + static_cast<std::size_t>(h) * head_dim;
  const float* kg = qg + hd;
  const float* vg = kg + hd;

  load_tile<E, Dp, L::kBr>(qs, L::kLdE, qg, row, q0, seq, head_dim);
  for (int i = static_cast<int>(threadIdx.x); i < L::kBr * L::kLdO; i += static_cast<int>(blockDim.x))
    os[i] = 0.0F;

  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int r0 = warp * kStrip;  // this warp's rows in the tile
  float m_run[kStrip];           // running max of the scaled scores, per row
  float l_run[kStrip];           // running sum of exp(score - m_run), per row
#pragma unroll
  for (int r = 0; r < kStrip; ++r) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.0F;
  }

  const int q_last = min(q0 + L::kBr, seq) - 1;  // causal: no key past the tile's last query
  const int n_ktiles = q_last / Bc + 1;
  for (int kt = 0; kt < n_ktiles; ++kt) {
    const int k0 = kt * Bc;
    __syncthreads();  // the previous K, V are read by every warp (and Q, O are initialised)
    load_tile<E, Dp, Bc>(ks, L::kLdE, kg, row, k0, seq, head_dim);
    load_tile<E, Dp, Bc>(vs, L::kLdE, vg, row, k0, seq, head_dim);
    __syncthreads();

    // S = Q K^T for this warp's rows (unscaled; fp32 accumulation)
    warp_mm<E, Bc, Dp, false, true, false>(ss + r0 * L::kLdS, L::kLdS, qs + r0 * L::kLdE,
                                            L::kLdE, ks, L::kLdE);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kStrip; ++r) {
      const int t = q0 + r0 + r;
      float* srow = ss + (r0 + r) * L::kLdS;
      E* prow = ps + (r0 + r) * L::kLdP;
      float sv[Bc / kWarp];
      float m_tile = -INFINITY;
#pragma unroll
      for (int j = 0; j < Bc / kWarp; ++j) {
        const int key = k0 + lane + kWarp * j;
        // key <= t < seq: causal, and keeps the zero rows past seq out (rows past seq are
        // entirely masked and never stored).
        sv[j] = (t < seq && key <= t) ? srow[lane + kWarp * j] * scale : -INFINITY;
        m_tile = fmaxf(m_tile, sv[j]);
      }
      m_tile = warp_max(m_tile);
      const float m_new = fmaxf(m_run[r], m_tile);
      // A row with no key yet (only rows past seq, or none at all in tile 0) keeps O = 0, l = 0.
      const float m_use = m_new == -INFINITY ? 0.0F : m_new;
      const float alpha = expf(m_run[r] - m_use);  // 0 while m_run is -inf
      float sum = 0.0F;
#pragma unroll
      for (int j = 0; j < Bc / kWarp; ++j) {
        const float p = expf(sv[j] - m_use);  // 0 where masked
        prow[lane + kWarp * j] = to_elem<E>(p);
        sum += p;
      }
      sum = warp_sum(sum);
      l_run[r] = l_run[r] * alpha + sum;
      m_run[r] = m_new;
      float* orow = os + (r0 + r) * L::kLdO;
      for (int d = lane; d < Dp; d += kWarp) orow[d] *= alpha;
    }
    __syncwarp();
    // O += P V for this warp's rows
    warp_mm<E, Dp, Bc, false, false, true>(os + r0 * L::kLdO, L::kLdO, ps + r0 * L::kLdP,
                                           L::kLdP, vs, L::kLdE);
    __syncwarp();
  }

#pragma unroll
  for (int r = 0; r < kStrip; ++r) {
    const int t = q0 + r0 + r;
    if (t >= seq) continue;  // uniform over the warp
    const float inv = 1.0F / l_run[r];  // l >= 1: the row's max term is exp(0)
    const float* orow = os + (r0 + r) * L::kLdO;
    float* og = out + (static_cast<std::size_t>(b) * seq + t) * hd + static_cast<std::size_t>(h) * head_dim;
    for (int d = lane; d < head_dim; d += kWarp) og[d] = orow[d] * inv;
    if (lane == 0)
      lse[(static_cast<std::size_t>(b) * heads + h) * seq + t] = m_run[r] + logf(l_run[r]);
  }
}

// ---- backward ----

/// delta[b,h,t] = sum_d dout * out (dout as the backward's products see it: rounded to E), and
/// the query slice of dqkv zeroed for the atomic dQ sums. One warp per (b, t, h).
template <class E>
__global__ void flash_backward_prep_kernel(float* delta, float* dqkv, const float* dout,
                                           const float* out, int rows, int seq, int heads,
                                           int head_dim) {
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;  // uniform per warp
  const int h = r % heads;
  const int bt = r / heads;  // b * seq + t
  const int t = bt % seq;
  const int b = bt / seq;
  const float* dy = dout + static_cast<std::size_t>(r) * head_dim;
  const float* y = out + static_cast<std::size_t>(r) * head_dim;
  float acc = 0.0F;
  for (int d = lane; d < head_dim; d += kWarp) acc = fmaf(to_float(to_elem<E>(dy[d])), y[d], acc);
  acc = warp_sum(acc);
  if (lane == 0) delta[(static_cast<std::size_t>(b) * heads + h) * seq + t] = acc;
  float* dq = dqkv + static_cast<std::size_t>(bt) * 3 * heads * head_dim +
              static_cast<std::size_t>(h) * head_dim;
  for (int d = lane; d < head_dim; d += kWarp) dq[d] = 0.0F;
}

/// Shared memory of the backward (key and query tiles both kTile = 16 * kWarps rows): K, V of
/// the block's key tile and Q, dO of the current query tile (E); S^T and dP^T [keys x queries]
/// (float); P^T and dS^T (E; for fp32 they overwrite S^T and dP^T in place); the dQ partial
/// product [kTile x Dp] (float; for bf16 over S^T where it fits: S^T is dead by then), which
/// also stages dK and dV (accumulated in registers) on their way out; lse and delta.
template <class E, int Dp, int kWarps>
struct BwdLayout {
  static constexpr int kTile = kStrip * kWarps;
  static constexpr int kLdE = Dp + kPadE<E>;
  static constexpr int kLdT = kTile + kPadF<E>;
  static constexpr int kLdPt = kIsFloat<E> ? kLdT : kTile + kPadE<E>;
  static constexpr int kLdG = Dp + kPadF<E>;
  static constexpr std::size_t kTileE = sizeof(E) * kTile * kLdE;
  static constexpr std::size_t kTileT = sizeof(float) * kTile * kLdT;
  static constexpr std::size_t kTilePt = sizeof(E) * kTile * kLdPt;
  static constexpr std::size_t kTileG = sizeof(float) * kTile * kLdG;
  static constexpr bool kDqOverSt = !kIsFloat<E> && kTileG <= kTileT;
  static constexpr std::size_t kK = 0;
  static constexpr std::size_t kV = align128(kK + kTileE);
  static constexpr std::size_t kQ = align128(kV + kTileE);
  static constexpr std::size_t kDO = align128(kQ + kTileE);
  static constexpr std::size_t kSt = align128(kDO + kTileE);
  static constexpr std::size_t kDPt = align128(kSt + kTileT);
  static constexpr std::size_t kPt = kIsFloat<E> ? kSt : align128(kDPt + kTileT);
  static constexpr std::size_t kDSt = kIsFloat<E> ? kDPt : align128(kPt + kTilePt);
  static constexpr std::size_t kEnd = align128(kIsFloat<E> ? kDPt + kTileT : kDSt + kTilePt);
  static constexpr std::size_t kDQ = kDqOverSt ? kSt : kEnd;
  static constexpr std::size_t kLse = align128(kDqOverSt ? kEnd : kDQ + kTileG);
  static constexpr std::size_t kDelta = align128(kLse + sizeof(float) * kTile);
  static constexpr std::size_t kBytes = align128(kDelta + sizeof(float) * kTile);
};

/// One block per (key tile, head, sample): loops over the query tiles at or after the key tile
/// (causal), recomputes P = exp(scale S - lse), accumulates dV += P^T dO and dK += dS^T Q in
/// registers (written once at the end: deterministic) and adds dQ = dS K into dqkv with
/// atomicAdd. dS = P (dP - delta), dP = dO V^T; the factor `scale` is applied to dQ and dK as
/// they are written (the host's rounding point of dS at bf16).
template <class E, int Dp, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarp)
    flash_backward_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                          const float* delta, int seq, int heads, int head_dim, float scale) {
  using L = BwdLayout<E, Dp, kWarps>;
  constexpr int kTile = L::kTile;
  extern __shared__ __align__(128) unsigned char smem[];
  E* ks = reinterpret_cast<E*>(smem + L::kK);
  E* vs = reinterpret_cast<E*>(smem + L::kV);
  E* qs = reinterpret_cast<E*>(smem + L::kQ);
  E* dos = reinterpret_cast<E*>(smem + L::kDO);
  float* st = reinterpret_cast<float*>(smem + L::kSt);
  float* dpt = reinterpret_cast<float*>(smem + L::kDPt);
  E* pt = reinterpret_cast<E*>(smem + L::kPt);
  E* dst = reinterpret_cast<E*>(smem + L::kDSt);
  float* dqs = reinterpret_cast<float*>(smem + L::kDQ);
  float* lse_s = reinterpret_cast<float*>(smem + L::kLse);
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);

  const int kt = static_cast<int>(blockIdx.x);  // key tile 0 has the most query tiles: first
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int k0 = kt * kTile;
  const std::size_t hd = static_cast<std::size_t>(heads) * head_dim;
  const std::size_t row = 3 * hd;
  const std::size_t head_off = static_cast<std::size_t>(h) * head_dim;
  const float* qg = qkv + static_cast<std::size_t>(b) * seq * row + head_off;
  const float* kg = qg + hd;
  const float* vg = kg + hd;
  const float* dog = dout + static_cast<std::size_t>(b) * seq * hd + head_off;
  float* dqg = dqkv + static_cast<std::size_t>(b) * seq * row + head_off;
  float* dkg = dqg + hd;
  float* dvg = dkg + hd;
  const std::size_t bh = (static_cast<std::size_t>(b) * heads + h) * seq;

  load_tile<E, Dp, kTile>(ks, L::kLdE, kg, row, k0, seq, head_dim);
  load_tile<E, Dp, kTile>(vs, L::kLdE, vg, row, k0, seq, head_dim);

  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int r0 = warp * kStrip;  // this warp's keys (and, for dQ, queries) in the tile
  StripAcc<E, Dp> dk_acc;
  StripAcc<E, Dp> dv_acc;
  acc_zero(dk_acc);
  acc_zero(dv_acc);
  const int n_tiles = (seq + kTile - 1) / kTile;
  for (int qt = kt; qt < n_tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous Q, dO, dS^T are read by every warp
    load_tile<E, Dp, kTile>(qs, L::kLdE, qg, row, q0, seq, head_dim);
    load_tile<E, Dp, kTile>(dos, L::kLdE, dog, hd, q0, seq, head_dim);
    for (int i = static_cast<int>(threadIdx.x); i < kTile; i += static_cast<int>(blockDim.x)) {
      const int t = q0 + i;
      lse_s[i] = t < seq ? lse[bh + t] : 0.0F;
      delta_s[i] = t < seq ? delta[bh + t] : 0.0F;
    }
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T for this warp's keys (all queries of the tile)
    warp_mm<E, kTile, Dp, false, true, false>(st + r0 * L::kLdT, L::kLdT, ks + r0 * L::kLdE,
                                              L::kLdE, qs, L::kLdE);
    warp_mm<E, kTile, Dp, false, true, false>(dpt + r0 * L::kLdT, L::kLdT, vs + r0 * L::kLdE,
                                              L::kLdE, dos, L::kLdE);
    __syncwarp();
#pragma unroll 4
    for (int r = 0; r < kStrip; ++r) {
      const int key = k0 + r0 + r;
#pragma unroll
      for (int j = 0; j < kTile / kWarp; ++j) {
        const int i = lane + kWarp * j;
        const int t = q0 + i;
        const int at_t = (r0 + r) * L::kLdT + i;
        const bool ok = key <= t && t < seq;
        const float p = ok ? expf(st[at_t] * scale - lse_s[i]) : 0.0F;
        // dS without the 1/sqrt(D) factor: rounded to bf16 as the host rounds it (docs/precision.md),
        // the factor applied to dK and dQ in fp32 as they leave (identical only where it is a power
        // of two: D = 16, 64, 256; D = 32 and 128 differed by up to an ulp of bf16 per element).
        const float ds = p * (dpt[at_t] - delta_s[i]);
        const int at_p = (r0 + r) * L::kLdPt + i;
        pt[at_p] = to_elem<E>(p);
        dst[at_p] = to_elem<E>(ds);
      }
    }
    __syncwarp();
    // dV += P^T dO, dK += dS^T Q (this warp's keys)
    warp_mma<E, Dp, kTile, false, false>(dv_acc, pt + r0 * L::kLdPt, L::kLdPt, dos, L::kLdE);
    warp_mma<E, Dp, kTile, false, false>(dk_acc, dst + r0 * L::kLdPt, L::kLdPt, qs, L::kLdE);
    __syncthreads();  // dS^T complete: every warp's keys
    // dQ for this warp's queries: dS (= dS^T read column-major) times K
    warp_mm<E, Dp, kTile, true, false, false>(dqs + r0 * L::kLdG, L::kLdG, dst + r0, L::kLdPt,
                                              ks, L::kLdE);
    __syncwarp();
    for (int r = 0; r < kStrip; ++r) {
      const int t = q0 + r0 + r;
      if (t >= seq) break;  // uniform over the warp; later rows are past seq too
      const float* src = dqs + (r0 + r) * L::kLdG;
      float* dst_g = dqg + static_cast<std::size_t>(t) * row;
      for (int d = lane; d < head_dim; d += kWarp) atomicAdd(dst_g + d, src[d] * scale);
    }
  }

  // dK, dV out through this warp's rows of the dQ scratch (no other warp reads them now; over
  // S^T, which no warp reads after the last iteration's barrier).
  float* stage = dqs + r0 * L::kLdG;
  float* grads[2] = {dkg, dvg};
  for (int which = 0; which < 2; ++which) {
    __syncwarp();
    acc_store(stage, L::kLdG, which == 0 ? dk_acc : dv_acc);
    __syncwarp();
    for (int r = 0; r < kStrip; ++r) {
      const int key = k0 + r0 + r;
      if (key >= seq) break;  // uniform over the warp; later rows are past seq too
      for (int d = lane; d < head_dim; d += kWarp)
        grads[which][static_cast<std::size_t>(key) * row + d] = stage[r * L::kLdG + d] * (which == 0 ? scale : 1.0F);
    }
  }
}

// ---- launch geometry (the launchers and the emulation test use these) ----

/// 1/sqrt(D), as the host backend computes it.
inline float attention_scale(int head_dim) { return 1.0F / std::sqrt(static_cast<float>(head_dim)); }

/// Forward: one block per (query tile, head, sample).
template <class E, int Dp>
struct ForwardLaunch {
  using Layout = FwdLayout<E, Dp, kFwdKeys<Dp>>;
  static constexpr int kThreadsPerBlock = Layout::kWarps * kWarp;
  static constexpr auto kernel() { return &flash_forward_kernel<E, Dp, kFwdKeys<Dp>>; }
  static dim3 grid(int batch, int seq, int heads) {
    return dim3(static_cast<unsigned>((seq + Layout::kBr - 1) / Layout::kBr),
                static_cast<unsigned>(heads), static_cast<unsigned>(batch));
  }
};

/// Backward: the prep kernel (one warp per (b, t, h) row), then one block per (key tile, head,
/// sample).
template <class E, int Dp>
struct BackwardLaunch {
  using Layout = BwdLayout<E, Dp, kBwdWarps<Dp>>;
  static constexpr int kThreadsPerBlock = kBwdWarps<Dp> * kWarp;
  static constexpr int kPrepThreads = kThreads;
  static constexpr auto kernel() { return &flash_backward_kernel<E, Dp, kBwdWarps<Dp>>; }
  static constexpr auto prep_kernel() { return &flash_backward_prep_kernel<E>; }
  static dim3 prep_grid(int rows) {
    return dim3(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  }
  static dim3 grid(int batch, int seq, int heads) {
    return dim3(static_cast<unsigned>((seq + Layout::kTile - 1) / Layout::kTile),
                static_cast<unsigned>(heads), static_cast<unsigned>(batch));
  }
};

/// Shared memory per block the fused kernels need for `head_dim` (padded to 32, 64 or 128
/// columns) with tiles of E: the larger of the forward's and the backward's; 0 past 128. fp32 at
/// 33-128 needs more than the 99 KiB of sm_86/sm_89 GPUs (A10, L4, RTX 30/40): the backend then
/// runs the unfused attention (CudaBackend::fused_attention).
template <class E>
constexpr std::size_t shared_bytes(int head_dim) {
  const auto larger = [](std::size_t a, std::size_t b) { return a > b ? a : b; };
  if (head_dim <= 32) return larger(FwdLayout<E, 32, kFwdKeys<32>>::kBytes, BwdLayout<E, 32, kBwdWarps<32>>::kBytes);
  if (head_dim <= 64) return larger(FwdLayout<E, 64, kFwdKeys<64>>::kBytes, BwdLayout<E, 64, kBwdWarps<64>>::kBytes);
  if (head_dim <= 128)
    return larger(FwdLayout<E, 128, kFwdKeys<128>>::kBytes, BwdLayout<E, 128, kBwdWarps<128>>::kBytes);
  return 0;
}

}  // namespace atlas::device::cuda::kernels::flash
