// SPDX-License-Identifier: MIT
// device::Backend: every operation the GPT model needs (allocation, copies, GEMM, fused layer
// kernels, AdamW), over device addresses inside device::Buffer allocations. The host backend
// (OpenBLAS + C++/OpenMP) is the reference; a CUDA backend implements the same interface from
// src/device/cuda/ and registers itself through register_backend_factory(). No CUDA types here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "atlas/core/byte_meter.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/device/buffer.hpp"

namespace atlas::device {

/// Transpose flag of a GEMM operand.
enum class Trans { No, Yes };

/// Scalars of one AdamW update (see Backend::adamw_update).
struct AdamWArgs {
  float lr = 0.0F;                 ///< learning rate of this step
  float beta1 = 0.9F;
  float beta2 = 0.95F;
  float eps = 1e-8F;
  float weight_decay = 0.0F;       ///< decoupled decay (0 for tensors that are not decayed)
  float bias_correction1 = 1.0F;   ///< 1 - beta1^t (t = 1-based step count)
  float bias_correction2 = 1.0F;   ///< 1 - beta2^t
  float grad_scale = 1.0F;         ///< gradient multiplier (global-norm clipping)
};

/// Activation applied after a linear layer's bias (Backend::linear_forward).
enum class Activation { None, Gelu };

/// One tensor of a multi-tensor AdamW step (Backend::adamw_update_multi): n elements of each
/// array, and the decoupled decay of this tensor (0 for tensors that are not decayed).
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::size_t n = 0;
  float weight_decay = 0.0F;
};

/// A read-only fp32 range on the device (Backend::sq_norm_multi).
struct ConstFloats {
  const float* data = nullptr;
  std::size_t n = 0;
};

/// A recorded sequence of backend calls (a CUDA graph on the cuda backend), run again by
/// Backend::launch_graph with the arguments it was recorded with. Must not outlive its backend.
class Graph {
 public:
  virtual ~Graph() = default;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
};

/// The compute device of one rank. Not thread-safe: one thread issues all calls. All pointers are
/// device addresses obtained from Buffers of *this backend* (plus element offsets); all tensors
/// are fp32 (tokens/targets int32; the `Bf16Bits` operands of the calls that say so), row-major, densely packed unless a leading dimension is given.
/// Calls may be asynchronous on a device backend: results are visible to later calls on this
/// backend at once, and to the host after download() or synchronize(). No call is collective.
/// Output pointers may alias inputs only where a call says so.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // ---- identity ----
  /// Which backend this is (host or cuda).
  [[nodiscard]] virtual atlas::Backend kind() const noexcept = 0;
  /// One line for the rank map / logs, e.g. "host (OpenBLAS, 4 threads)".
  [[nodiscard]] virtual std::string describe() const = 0;
  /// True if Buffer memory is ordinary host memory (MPI may read it directly).
  [[nodiscard]] virtual bool host_accessible() const noexcept = 0;
  /// The numbers of the matmul inputs (device.precision, resolved: never Auto). At Bf16 the model
  /// stores the activations that backward reads only as GEMM operands in bf16
  /// (docs/precision.md, "Storage").
  [[nodiscard]] virtual Precision precision() const noexcept = 0;

  // ---- memory ----
  /// Allocates `bytes` (may be 0: an empty Buffer), zero-filled, 64-byte aligned.
  /// Throws atlas::Error (Device) when the memory is not available.
  [[nodiscard]] Buffer alloc(std::size_t bytes);
  /// Allocates `count` fp32 elements (zero-filled).
  [[nodiscard]] Buffer alloc_floats(std::size_t count) { return alloc(count * sizeof(float)); }
  /// The most bytes this backend's Buffers have held at once (its allocator's high-water mark,
  /// counted in alloc() and Buffer release; a device backend's cudaMalloc'd bytes, without the
  /// CUDA context or library workspaces).
  [[nodiscard]] std::size_t buffer_peak_bytes() const noexcept { return m_bytes.peak(); }
  /// The peak memory of this rank's device so far, in bytes, for the run footer: the host backend
  /// the process's peak resident set (getrusage), which includes everything besides Buffers; the
  /// default (a device backend) buffer_peak_bytes().
  [[nodiscard]] virtual std::size_t peak_bytes() const { return buffer_peak_bytes(); }
  /// Copies `bytes` from host memory `src` to device address `dst`. Synchronous for `src`.
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  /// Copies `bytes` from device address `src` to host memory `dst`; returns when `dst` is valid.
  virtual void download(void* dst, const void* src, std::size_t bytes) = 0;
  /// Device-to-device copy of `bytes` (ranges must not overlap).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  /// x[i] = value for i < n.
  virtual void fill(float* x, float value, std::size_t n) = 0;
  /// x[i] *= alpha for i < n.
  virtual void scale(float* x, float alpha, std::size_t n) = 0;
  /// Waits until every issued call has finished (no-op on the host).
  virtual void synchronize() = 0;
  /// out[i] = the bf16 bits of in[i], round-to-nearest-even (rounding.hpp's float_to_bf16_bits:
  /// NaN stays NaN, no flush of denormals) for i < n: storing an activation in bf16.
  virtual void to_bf16(Bf16Bits* out, const float* in, std::size_t n) = 0;
  /// out[i] = the fp32 value of the bf16 in[i] (exact) for i < n.
  virtual void from_bf16(float* out, const Bf16Bits* in, std::size_t n) = 0;

  // ---- dense algebra ----
  /// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, op = transpose if Yes.
  /// lda/ldb/ldc are row strides (elements) of A, B, C as stored. beta = 1 accumulates.
  virtual void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) = 0;
  /// gemm (above) whose B operand is stored as bf16 (b: ldb-strided bf16 values). The product is
  /// the one gemm gives for the widened (exact fp32) B: at bf16 bitwise the same as gemm on the
  /// fp32 tensor B was rounded from, since gemm rounds its operands to bf16 first. A device
  /// backend reads B as bf16 directly (no conversion pass). Used only where precision() is Bf16
  /// (the model stores bf16 activations only then); a device backend may refuse (Internal)
  /// otherwise.
  virtual void gemm_bf16_b(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const Bf16Bits* b, int ldb, float beta,
                           float* c, int ldc) = 0;
  /// gemm_bf16_b with the A operand stored as bf16 instead (B fp32, rounded as gemm does).
  virtual void gemm_bf16_a(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                           const Bf16Bits* a, int lda, const float* b, int ldb, float beta,
                           float* c, int ldc) = 0;
  /// out[r, c] += bias[c] for r < rows, c < cols.
  virtual void add_bias(float* out, const float* bias, int rows, int cols) = 0;
  /// dbias[c] += sum_r dout[r, c] (the bias gradient; accumulates).
  virtual void bias_grad(float* dbias, const float* dout, int rows, int cols) = 0;
  /// out[i] = a[i] + b[i]; `out` may alias `a` or `b` (residual add, accumulation).
  virtual void add(float* out, const float* a, const float* b, std::size_t n) = 0;
  /// Sum of squares of x[0..n), accumulated in double. Synchronous (returns a host value).
  [[nodiscard]] virtual double sq_norm(const float* x, std::size_t n) = 0;

  // ---- layers ----
  /// LayerNorm over the last dim (eps 1e-5): out[r,:] = (in[r,:] - mean) * rstd * weight + bias.
  /// Saves mean[r] and rstd[r] (rows elements each) for the backward pass.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                                 const float* weight, const float* bias, int rows, int cols) = 0;
  /// LayerNorm backward. ACCUMULATES into din (+=), dweight (+=) and dbias (+=).
  virtual void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                                  const float* in, const float* weight, const float* mean,
                                  const float* rstd, int rows, int cols) = 0;
  /// GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  /// `out` may alias `in`.
  virtual void gelu_forward(float* out, const float* in, std::size_t n) = 0;
  /// din = gelu'(in) * dout (overwrites din; din may alias dout).
  virtual void gelu_backward(float* din, const float* in, const float* dout, std::size_t n) = 0;

  /// Floats the backend saves per attention call for the backward pass (e.g. softmax
  /// probabilities [B,H,T,T] on the host) for `batch` samples of `seq` tokens, `heads` heads of
  /// `head_dim` each.
  [[nodiscard]] virtual std::size_t attention_saved_floats(int batch, int seq, int heads,
                                                           int head_dim) const = 0;
  /// Floats of scratch one attention call (forward or backward) needs; shared by all calls.
  [[nodiscard]] virtual std::size_t attention_workspace_floats(int batch, int seq, int heads,
                                                               int head_dim) const = 0;
  /// Causal multi-head self-attention of a head group. qkv is [B, T, 3, H, D] (per token: all H
  /// query heads, then all key heads, then all value heads, each head D contiguous floats);
  /// out is [B, T, H, D]; scores scaled by 1/sqrt(D); token t attends to tokens <= t.
  /// `saved` (attention_saved_floats) is written for attention_backward; `workspace`
  /// (attention_workspace_floats, may be null when that is 0) is scratch.
  virtual void attention_forward(float* out, float* saved, const float* qkv, int batch, int seq,
                                 int heads, int head_dim, float* workspace) = 0;
  /// Attention backward: dqkv [B,T,3,H,D] is OVERWRITTEN with dL/dqkv from dout [B,T,H,D].
  /// qkv, out and saved are the forward's inputs/outputs of the same call.
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* saved, int batch, int seq,
                                  int heads, int head_dim, float* workspace) = 0;

  /// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]; out is [B,T,C], tokens int32 [B,T] on the
  /// device, each in [0, V) (the caller checks the range).
  virtual void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                                 const float* wpe, int batch, int seq, int channels) = 0;
  /// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:] (both accumulate).
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const std::int32_t* tokens, int batch, int seq,
                                  int channels) = 0;
  /// Row softmax of logits [rows, V] into probs (probs may alias logits) and per-row
  /// cross-entropy losses[r] = -log probs[r, targets[r]].
  virtual void softmax_xent_forward(float* losses, float* probs, const float* logits,
                                    const std::int32_t* targets, int rows, int vocab) = 0;
  /// dlogits = (probs - onehot(targets)) * scale (overwrites; dlogits may alias probs).
  virtual void softmax_xent_backward(float* dlogits, const float* probs,
                                     const std::int32_t* targets, int rows, int vocab,
                                     float scale) = 0;

  // ---- optimizer ----
  /// One AdamW step over n elements with g = grad * grad_scale:
  /// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  /// param -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * param).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n,
                            const AdamWArgs& args) = 0;

  // ---- graphs (docs/cuda.md, "CUDA graphs") ----
  /// True if begin_capture() records calls (the cuda backend; a test's recording backend).
  [[nodiscard]] virtual bool can_capture() const noexcept { return false; }
  /// Starts recording this backend's calls: until end_capture() the calls are recorded, not run,
  /// with their arguments as given (pointers, scalars: a later launch_graph reads the memory as it
  /// is then, with the same scalars). Calls that move data to or from the host, wait for the
  /// device or allocate (upload, download, synchronize, sq_norm, alloc) throw atlas::Error
  /// (Internal) while recording; so may a call whose device work depends on host state that a
  /// replay would not see (a weight's converted copy made stale). The caller then calls
  /// end_capture() (which gives nothing) and runs the calls again without recording. Default:
  /// throws (can_capture() is false).
  virtual void begin_capture();
  /// Ends the recording begun by begin_capture(): the graph of the calls recorded, or null when
  /// the recording failed or is unusable (`why`, when not null, then says why; nothing recorded
  /// has run either way). Default: null.
  [[nodiscard]] virtual std::unique_ptr<Graph> end_capture(std::string* why);
  /// Ends the recording begun by begin_capture() and drops what it recorded (nothing of it ran):
  /// after a recorded call threw. Default: nothing.
  virtual void abort_capture() noexcept {}
  /// Runs a graph from end_capture() of this backend, in order with the other calls.
  virtual void launch_graph(Graph& graph);
  /// Changes whenever memory of the backend's own that a graph may have recorded (workspaces,
  /// converted weight copies) moved or was freed: graphs recorded before are then stale and must
  /// be dropped. The caller keeps its own pointers (arguments) valid while its graphs live.
  [[nodiscard]] virtual std::uint64_t graph_epoch() const noexcept { return 0; }

  // ---- fused calls ----
  // Each has a default (src/device/backend.cpp) that issues the calls above in the order stated,
  // so a backend that does not override one gives bit-for-bit the results of that sequence (the
  // host backend relies on this). A device backend overrides them with fewer passes over memory
  // (GEMM epilogues, one kernel); it then matches the sequence within its usual tolerances.

  /// Linear layer: out[rows, out_f] = act(in[rows, in_f] . w[out_f, in_f]^T + bias[out_f]);
  /// bias may be null (no bias). act = None: `pre_act` is unused (may be null). act = Gelu:
  /// pre_act[rows, out_f] receives the value before GELU (kept for linear_backward). Default:
  /// gemm into (act ? pre_act : out), add_bias (if any), then gelu_forward(out, pre_act). No
  /// pointer may alias another. A device backend may keep a converted copy of `w` until `w` is
  /// next written by upload, copy, fill, scale, adamw_update(_multi) or a collective sum, or its
  /// memory is freed: weights must change only through those calls.
  virtual void linear_forward(float* out, float* pre_act, const float* in, const float* w,
                              const float* bias, int rows, int in_f, int out_f, Activation act);
  /// Backward of y = in . w^T + b (see linear_forward), where `in` = in_act(in_pre):
  /// dbias[out_f] += sum_r dout[r, :] (skipped if dbias is null); dweight[out_f, in_f] += dout^T . in;
  /// din[rows, in_f] = dout . w (OVERWRITTEN), then, if in_act = Gelu, din *= gelu'(in_pre)
  /// (in_pre [rows, in_f], the pre-activation linear_forward saved; unused for None).
  /// dweight = null (dbias must then be null too): din only, the input-gradient half (B) of a
  /// split backward (schedule.split_backward); linear_backward_weight then gives the rest.
  /// Default: linear_backward_weight (when dweight is given), gemm (din), gelu_backward(din,
  /// in_pre, din): bias_grad, gemm (dweight), gemm (din), gelu_backward.
  virtual void linear_backward(float* din, float* dweight, float* dbias, const float* dout,
                               const float* in, const float* w, const float* in_pre, int rows,
                               int in_f, int out_f, Activation in_act);
  /// The weight-gradient half (W) of linear_backward, from the same dout and in:
  /// dbias[out_f] += sum_r dout[r, :] (skipped if dbias is null), dweight[out_f, in_f] +=
  /// dout^T . in. Bit for bit what linear_backward adds to dweight and dbias for the same
  /// arguments (a backend computes them the same way in both calls), so B's din-only
  /// linear_backward plus this call equal one linear_backward. Default: bias_grad, gemm (dweight).
  virtual void linear_backward_weight(float* dweight, float* dbias, const float* dout,
                                      const float* in, int rows, int in_f, int out_f);
  /// linear_forward (above) whose input `in` [rows, in_f] is stored as bf16 (the forward GEMM
  /// reads it through gemm_bf16_a: on a device, no rounding pass over `in`). Only where
  /// precision() is Bf16. Default: gemm_bf16_a into (act ? pre_act : out), add_bias (if any),
  /// then gelu_forward(out, pre_act).
  virtual void linear_forward_bf16_in(float* out, float* pre_act, const Bf16Bits* in,
                                      const float* w, const float* bias, int rows, int in_f,
                                      int out_f, Activation act);
  /// linear_backward (above) whose input `in` [rows, in_f] is stored as bf16 (the dweight GEMM
  /// reads it through gemm_bf16_b; everything else as linear_backward). Only where precision()
  /// is Bf16. A null dweight (and dbias) gives din only, as linear_backward's split input half.
  /// Default: linear_backward_weight_bf16_in (if dweight), gemm (din), gelu_backward.
  virtual void linear_backward_bf16_in(float* din, float* dweight, float* dbias,
                                       const float* dout, const Bf16Bits* in, const float* w,
                                       const float* in_pre, int rows, int in_f, int out_f,
                                       Activation in_act);
  /// linear_backward_weight (the split backward's W half) with `in` stored as bf16: bit for bit
  /// what linear_backward_bf16_in adds to dweight and dbias. Default: bias_grad, gemm_bf16_b.
  virtual void linear_backward_weight_bf16_in(float* dweight, float* dbias, const float* dout,
                                              const Bf16Bits* in, int rows, int in_f, int out_f);
  /// Residual add, optional bias, optional LayerNorm: res[r, c] = x[r, c] + delta[r, c], then
  /// res[r, c] += bias[c] if bias is not null, then, if ln_out is not null,
  /// layernorm_forward(ln_out, mean, rstd, res, ln_weight, ln_bias, rows, cols). `res` may
  /// alias `x` or `delta`. Default: add, add_bias, layernorm_forward.
  virtual void residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                          const float* x, const float* delta, const float* bias,
                                          const float* ln_weight, const float* ln_bias, int rows,
                                          int cols);
  /// Softmax cross-entropy, loss and gradient in one call: losses[r] = -log softmax(logits[r])
  /// [targets[r]], and dlogits = (softmax(logits) - onehot(targets)) * scale. dlogits may alias
  /// logits (the usual use: the logits are read once and replaced by their gradient).
  /// Default: softmax_xent_forward(losses, dlogits, logits), then
  /// softmax_xent_backward(dlogits, dlogits, targets, rows, vocab, scale).
  virtual void softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                                  const std::int32_t* targets, int rows, int vocab, float scale);
  /// AdamW over every tensor of `tensors` with the shared scalars of `args` (its weight_decay is
  /// ignored: each tensor carries its own). Default: adamw_update per tensor, in order.
  virtual void adamw_update_multi(std::span<const AdamWTensor> tensors, const AdamWArgs& args);
  /// Sum of squares over every range of `ranges` (double). Synchronous; one host wait in a
  /// device backend. Default: sum of sq_norm per range, in order, starting from 0.0.
  [[nodiscard]] virtual double sq_norm_multi(std::span<const ConstFloats> ranges);

 protected:
  /// Backend-specific allocation: `bytes` > 0, zero-filled, 64-byte aligned; throws on failure.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Frees memory from allocate(). Must not throw.
  virtual void release(void* ptr, std::size_t bytes) noexcept = 0;

 private:
  friend class Buffer;
  /// Buffer's release: the bytes no longer held (see buffer_peak_bytes).
  void forget(std::size_t bytes) noexcept { m_bytes.sub(bytes); }
  ByteMeter m_bytes;
};

/// Builds a backend of `cfg.backend` kind. Host: always available; threads from cfg.threads
/// (see resolve_host_threads). Cuda: available only when the CUDA object library is linked in
/// (it registers a factory); otherwise throws atlas::ConfigError naming the rebuild option.
/// Not collective, but every rank with the same deck reaches the same verdict.
[[nodiscard]] std::unique_ptr<Backend> make_backend(const DeviceCfg& cfg);

/// Signature of a backend factory (the CUDA build provides one).
using BackendFactory = std::unique_ptr<Backend> (*)(const DeviceCfg&);

/// Registration hook: the CUDA object library calls this from a static initialiser, e.g.
///   static const bool kRegistered = (register_backend_factory(atlas::Backend::Cuda, &make), true);
/// A null `factory` removes the registration (tests). Registering the host kind is an error (it
/// is built in). Not thread-safe; call before main.
void register_backend_factory(atlas::Backend kind, BackendFactory factory);

/// True if make_backend() can build `kind` in this binary.
[[nodiscard]] bool backend_available(atlas::Backend kind);

}  // namespace atlas::device
