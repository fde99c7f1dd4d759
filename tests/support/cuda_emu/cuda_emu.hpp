// SPDX-License-Identifier: MIT
// A CPU stand-in for the little of CUDA that the fused attention kernels use, so that CI runs
// them without a GPU (tests/unit/test_flash_attention_emulated.cpp): every CUDA thread is a
// ucontext fiber, __syncthreads / __syncwarp are barriers over the block's / warp's live
// threads, shuffles go through a per-warp slot array, wmma fragments hold their whole 16x16 tile
// in every lane (loads, products and stores are warp-collective, with a barrier on each side),
// bf16 is a 16-bit struct with round-to-nearest-even conversion. The fibers run in a seeded
// random order between barriers, so a missing barrier shows up as a wrong result. Not a
// performance model, not a general CUDA emulator. Test-only: never linked into atlas.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

namespace cuda_emu {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

enum class State { Run, WarpBarrier, BlockBarrier, Done };

struct Fiber {
  ucontext_t ctx{};
  std::vector<char> stack;
  uint3 tid;
  State state = State::Run;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler{};
  Fiber* current = nullptr;
  uint3 block_idx;
  dim3 block_dim, grid_dim;
  std::function<void()> body;
  std::vector<double> slots;  // one per thread: shuffle exchange
  std::mt19937 rng{12345};
};

inline Block*& block() {
  static Block* b = nullptr;
  return b;
}
inline Fiber& self() { return *block()->current; }
inline int lane_id() { return static_cast<int>(self().tid.x) % 32; }
inline int warp_id() { return static_cast<int>(self().tid.x) / 32; }

[[gnu::noinline]] inline void wait(State s) {
  Fiber* f = &self();
  f->state = s;
  swapcontext(&f->ctx, &block()->scheduler);
}

// The ucontext calls return twice (to gcc: setjmp-like); each sits in a small function of its
// own, so no caller's locals are kept across them.
[[gnu::noinline]] inline void resume(ucontext_t* scheduler, Fiber* f) {
  swapcontext(scheduler, &f->ctx);
}

inline void trampoline();

[[gnu::noinline]] inline void start(Fiber* f, ucontext_t* scheduler) {
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack.data();
  f->ctx.uc_stack.ss_size = f->stack.size();
  f->ctx.uc_link = scheduler;
  makecontext(&f->ctx, &trampoline, 0);
}

inline void trampoline() {
  block()->body();
  self().state = State::Done;  // uc_link returns to the scheduler
}

/// Runs `body` (one kernel invocation per thread) over the grid, block after block;
/// `before_block` (if set) runs before each block (e.g. to poison shared memory).
inline void launch(dim3 grid, dim3 threads, std::function<void()> body,
                   const std::function<void()>& before_block = {}, unsigned seed = 1) {
  if (threads.y != 1 || threads.z != 1) fail("only 1-D blocks");
  Block b;
  b.grid_dim = grid;
  b.block_dim = threads;
  b.body = std::move(body);
  b.fibers.resize(threads.x);
  b.slots.assign(threads.x, 0.0);
  b.rng.seed(seed);
  for (Fiber& f : b.fibers) f.stack.resize(256 * 1024);
  block() = &b;
  const int n = static_cast<int>(threads.x);
  const int warps = (n + 31) / 32;
  std::vector<int> order(static_cast<std::size_t>(n));
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.block_idx = {x, y, z};
        if (before_block) before_block();
        for (int i = 0; i < n; ++i) {
          Fiber& f = b.fibers[static_cast<std::size_t>(i)];
          f.tid = {static_cast<unsigned>(i), 0, 0};
          f.state = State::Run;
          start(&f, &b.scheduler);
        }
        for (;;) {
          for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
          std::shuffle(order.begin(), order.end(), b.rng);
          for (const int i : order) {
            Fiber& f = b.fibers[static_cast<std::size_t>(i)];
            if (f.state != State::Run) continue;
            b.current = &f;
            resume(&b.scheduler, &f);
          }
          bool all_done = true;
          bool all_at_block = true;
          for (const Fiber& f : b.fibers) {
            if (f.state != State::Done) all_done = false;
            if (f.state != State::Done && f.state != State::BlockBarrier) all_at_block = false;
          }
          if (all_done) break;
          bool released = false;
          if (all_at_block) {
            for (Fiber& f : b.fibers)
              if (f.state == State::BlockBarrier) f.state = State::Run;
            released = true;
          }
          for (int w = 0; w < warps && !released; ++w) {
            bool any = false;
            bool all = true;
            for (int i = 32 * w; i < std::min(n, 32 * w + 32); ++i) {
              const State s = b.fibers[static_cast<std::size_t>(i)].state;
              if (s == State::Done) continue;
              any = true;
              if (s != State::WarpBarrier) all = false;
            }
            if (any && all) {
              for (int i = 32 * w; i < std::min(n, 32 * w + 32); ++i)
                if (b.fibers[static_cast<std::size_t>(i)].state == State::WarpBarrier)
                  b.fibers[static_cast<std::size_t>(i)].state = State::Run;
              released = true;
            }
          }
          // Other warps may be released in later rounds; a round with nothing to run and
          // nothing released is a deadlock (mismatched barriers).
          bool any_run = false;
          for (const Fiber& f : b.fibers) any_run = any_run || f.state == State::Run;
          if (!released && !any_run) fail("deadlock: threads wait at barriers that never fill");
        }
      }
  block() = nullptr;
}

}  // namespace cuda_emu

// ---- the CUDA vocabulary the kernels use ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define threadIdx (::cuda_emu::self().tid)
#define blockIdx (::cuda_emu::block()->block_idx)
#define blockDim (::cuda_emu::block()->block_dim)
#define gridDim (::cuda_emu::block()->grid_dim)
using cuda_emu::dim3;
using cudaStream_t = void*;

inline void __syncthreads() { cuda_emu::wait(cuda_emu::State::BlockBarrier); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffU) {
  cuda_emu::wait(cuda_emu::State::WarpBarrier);
}
template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  auto& slots = cuda_emu::block()->slots;
  const int tid = static_cast<int>(cuda_emu::self().tid.x);
  const int base = tid - tid % 32;
  slots[static_cast<std::size_t>(tid)] = static_cast<double>(v);
  __syncwarp();
  const T got = static_cast<T>(slots[static_cast<std::size_t>(base + ((tid % 32) ^ lane_mask))]);
  __syncwarp();
  return got;
}
inline float atomicAdd(float* p, float v) {  // fibers never run at once: a plain add
  const float old = *p;
  *p = old + v;
  return old;
}
inline int min(int a, int b) { return a < b ? a : b; }
[[noreturn]] inline void __trap() { cuda_emu::fail("__trap"); }

// ---- bf16 ----
struct __nv_bfloat16 {
  std::uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return {static_cast<std::uint16_t>((u >> 16) | 0x40U)};
  u += 0x7fffU + ((u >> 16) & 1U);
  return {static_cast<std::uint16_t>(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b.bits) << 16;
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- wmma (16x16x16 only) ----
namespace nvcuda::wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: 16x16x16 fragments only");
  float x[16 * 16];  // the whole tile, in every lane
};

namespace detail {
inline float value(float v) { return v; }
inline float value(__nv_bfloat16 v) { return __bfloat162float(v); }
inline void check(const void* p, unsigned ldm, std::size_t elem) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) cuda_emu::fail("wmma pointer not 32-byte aligned");
  if ((ldm * elem) % 16 != 0) cuda_emu::fail("wmma ldm not a multiple of 16 bytes");
}
}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  detail::check(p, ldm, sizeof(T));
  __syncwarp();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = detail::value(std::is_same_v<Layout, col_major> ? p[c * ldm + r]
                                                                        : p[r * ldm + c]);
  __syncwarp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  detail::check(p, ldm, sizeof(float));
  __syncwarp();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
  __syncwarp();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check(p, ldm, sizeof(float));
  __syncwarp();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * 16 + c];
  __syncwarp();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (float& e : f.x) e = v;
}
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "cuda_emu: bf16 operands only");
  float out[16 * 16];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) acc += a.x[r * 16 + k] * b.x[k * 16 + n];  // exact products
      out[r * 16 + n] = acc;
    }
  std::memcpy(d.x, out, sizeof out);
}
}  // namespace nvcuda::wmma
