// SPDX-License-Identifier: MIT
// The CUDA backend class: GEMMs at device.precision (fp32 through cuBLAS with TF32 off; tf32 and
// bf16 through cuBLASLt, lt_gemm.hpp), the fused Backend calls (cuBLASLt epilogues, fused.cu),
// the kernels of kernels/*.cu for the rest, one non-blocking stream per backend that every call (and NCCL) is issued on. Internal
// to src/device/cuda/; everyone else sees device::Backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "atlas/device/backend.hpp"
#include "cuda_handles.hpp"
#include "kernels.hpp"
#include "lt_gemm.hpp"

namespace atlas::device::cuda {

class CudaBackend final : public Backend {
 public:
  /// Runs on `device` (of `device_count` visible); `local_rank` is only reported by describe().
  /// `precision` (resolved, not Auto) applies to every GEMM but the attention's.
  CudaBackend(int device, int device_count, int local_rank, Precision precision = Precision::Fp32);
  ~CudaBackend() override;

  // ---- identity ----
  [[nodiscard]] atlas::Backend kind() const noexcept override { return atlas::Backend::Cuda; }
  [[nodiscard]] std::string describe() const override { return m_description; }
  [[nodiscard]] bool host_accessible() const noexcept override { return false; }
  /// Seconds an NCCL set-up or operation on this backend's stream may take before the
  /// communicator is aborted and an error thrown (device.nccl_timeout_s; docs/cuda.md).
  [[nodiscard]] double nccl_timeout_s() const noexcept { return m_nccl_timeout_s; }
  void set_nccl_timeout_s(double seconds) noexcept { m_nccl_timeout_s = seconds; }

  // ---- memory ----
  void upload(void* dst, const void* src, std::size_t bytes) override;
  void download(void* dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill(float* x, float value, std::size_t n) override;
  void scale(float* x, float alpha, std::size_t n) override;
  void synchronize() override;
  void to_bf16(Bf16Bits* out, const float* in, std::size_t n) override;
  void from_bf16(float* out, const Bf16Bits* in, std::size_t n) override;

  // ---- dense algebra ----
  void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override;
  /// cuBLASLt with B read as bf16 directly (bf16 precision only).
  void gemm_bf16_b(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const Bf16Bits* b, int ldb, float beta, float* c, int ldc) override;
  /// cuBLASLt with A read as bf16 directly (bf16 precision only).
  void gemm_bf16_a(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                   const Bf16Bits* a, int lda, const float* b, int ldb, float beta, float* c,
                   int ldc) override;
  void add_bias(float* out, const float* bias, int rows, int cols) override;
  void bias_grad(float* dbias, const float* dout, int rows, int cols) override;
  void add(float* out, const float* a, const float* b, std::size_t n) override;
  [[nodiscard]] double sq_norm(const float* x, std::size_t n) override;

  // ---- layers ----
  void layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                         const float* weight, const float* bias, int rows, int cols) override;
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                          const float* in, const float* weight, const float* mean,
                          const float* rstd, int rows, int cols) override;
  void gelu_forward(float* out, const float* in, std::size_t n) override;
  void gelu_backward(float* din, const float* in, const float* dout, std::size_t n) override;
  /// Fused: the log-sum-exp [B,H,T]; unfused: the probabilities [B,H,T,T] (as on the host).
  [[nodiscard]] std::size_t attention_saved_floats(int batch, int seq, int heads,
                                                   int head_dim) const override;
  /// Fused: rowsum(dout * out) [B,H,T]; unfused: dL/d(probabilities) [B,H,T,T].
  [[nodiscard]] std::size_t attention_workspace_floats(int batch, int seq, int heads,
                                                       int head_dim) const override;
  void attention_forward(float* out, float* saved, const float* qkv, int batch, int seq,
                         int heads, int head_dim, float* workspace) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, int batch, int seq, int heads, int head_dim,
                          float* workspace) override;
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                         const float* wpe, int batch, int seq, int channels) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout,
                          const std::int32_t* tokens, int batch, int seq,
                          int channels) override;
  void softmax_xent_forward(float* losses, float* probs, const float* logits,
                            const std::int32_t* targets, int rows, int vocab) override;
  void softmax_xent_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                             int rows, int vocab, float scale) override;

  // ---- optimizer ----
  void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n,
                    const AdamWArgs& args) override;

  // ---- fused calls ----
  /// cuBLASLt BIAS / GELU_AUX_BIAS epilogue (the unfused default where cuBLASLt has none).
  void linear_forward(float* out, float* pre_act, const float* in, const float* w,
                      const float* bias, int rows, int in_f, int out_f, Activation act) override;
  /// dweight with the BGRADB epilogue (dbias through a scratch vector, then added), din with
  /// the DGELU epilogue when in_act = Gelu.
  void linear_backward(float* din, float* dweight, float* dbias, const float* dout,
                       const float* in, const float* w, const float* in_pre, int rows, int in_f,
                       int out_f, Activation in_act) override;
  /// dweight (and dbias) as linear_backward computes them: the same BGRADB call.
  void linear_backward_weight(float* dweight, float* dbias, const float* dout, const float* in,
                              int rows, int in_f, int out_f) override;
  /// linear_forward's cuBLASLt epilogues with the bf16 `in` read directly (bf16 precision only).
  void linear_forward_bf16_in(float* out, float* pre_act, const Bf16Bits* in, const float* w,
                              const float* bias, int rows, int in_f, int out_f,
                              Activation act) override;
  /// linear_backward with the dweight GEMM reading the bf16 `in` directly (bf16 precision only).
  void linear_backward_bf16_in(float* din, float* dweight, float* dbias, const float* dout,
                               const Bf16Bits* in, const float* w, const float* in_pre, int rows,
                               int in_f, int out_f, Activation in_act) override;
  void residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                  const float* x, const float* delta, const float* bias,
                                  const float* ln_weight, const float* ln_bias, int rows,
                                  int cols) override;
  void softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                          const std::int32_t* targets, int rows, int vocab, float scale) override;
  /// One launch over a device-side table (re-uploaded only when the tensor list changes).
  void adamw_update_multi(std::span<const AdamWTensor> tensors, const AdamWArgs& args) override;
  /// One launch, one fixed-order sum, one host wait.
  [[nodiscard]] double sq_norm_multi(std::span<const ConstFloats> ranges) override;
  [[nodiscard]] Precision precision() const noexcept override { return m_lt.precision(); }
  /// Fused GEMM calls that cuBLASLt refused, so far (composed of unfused calls instead).
  [[nodiscard]] long epilogue_fallbacks() const noexcept { return m_lt.fallbacks(); }

  // ---- CUDA specifics (src/device/cuda/ only) ----
  [[nodiscard]] cudaStream_t stream() const noexcept { return m_stream.get(); }
  [[nodiscard]] cublasHandle_t cublas() const noexcept { return m_cublas.get(); }
  /// Drops the converted (bf16) weight copies that overlap [ptr, ptr + bytes): for writes made
  /// outside the Backend calls (the NCCL collective's sums).
  void weights_written(const void* ptr, std::size_t bytes) noexcept { m_lt.invalidate(ptr, bytes); }
  [[nodiscard]] int device() const noexcept { return m_device; }
  [[nodiscard]] const std::string& pci_bus_id() const noexcept { return m_pci_bus_id; }
  /// Makes this backend's device current on the calling thread.
  void make_current() const;
  /// How attention runs (docs/attention.md): the fused flash kernel with fp32 or bf16 numerics,
  /// or (fused = false, and for head_dim > 128) the unfused fp32 reference. Set by the factory
  /// from device.precision; tests switch it. Allocate `saved` after changing it.
  struct AttentionOptions {
    bool fused = true;
    bool bf16 = false;
  };
  void set_attention_options(AttentionOptions options) noexcept { m_attention = options; }

  // ---- graphs (cuda_graph.cpp) ----
  [[nodiscard]] bool can_capture() const noexcept override { return true; }
  void begin_capture() override;
  [[nodiscard]] std::unique_ptr<Graph> end_capture(std::string* why) override;
  void abort_capture() noexcept override;
  void launch_graph(Graph& graph) override;
  [[nodiscard]] std::uint64_t graph_epoch() const noexcept override { return m_epoch + m_lt.epoch(); }
  [[nodiscard]] AttentionOptions attention_options() const noexcept { return m_attention; }

 protected:
  void* allocate(std::size_t bytes) override;
  void release(void* ptr, std::size_t bytes) noexcept override;

 public:
  /// Every byte of device memory this process's CUDA backend held at once (device_bytes()): its
  /// Buffers and its scratch (weight and operand copies, workspaces), not only the Buffers.
  [[nodiscard]] std::size_t peak_bytes() const override;

 private:
  /// Frees what release() deferred while a graph was being recorded.
  void free_deferred() noexcept;

  /// Row-major strided-batched GEMM: for i < batch, C_i = alpha op(A_i) op(B_i) + beta C_i with
  /// X_i = X + i * stride_x (elements).
  void gemm_batched(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, long long stride_a, const float* b, int ldb,
                    long long stride_b, float beta, float* c, int ldc, long long stride_c,
                    int batch);
  /// linear_forward's cuBLASLt call (BIAS or GELU_AUX_BIAS epilogue; `in` or the stored bf16
  /// `in_bf16`); false where the epilogue does not apply or cuBLASLt refused (the caller falls back).
  bool lt_linear_forward(float* out, float* pre_act, const float* in, const Bf16Bits* in_bf16,
                         const float* w, const float* bias, int rows, int in_f, int out_f, bool gelu);
  /// gemm_bf16_a / gemm_bf16_b: one operand stored as bf16 (a or a_bf16, b or b_bf16 set);
  /// `what` names the caller in the precision check.
  void gemm_stored_bf16(const char* what, Trans trans_a, Trans trans_b, int m, int n, int k,
                        float alpha, const float* a, const Bf16Bits* a_bf16, int lda,
                        const float* b, const Bf16Bits* b_bf16, int ldb, float beta, float* c,
                        int ldc);
  /// True if attention of this head_dim takes the fused kernel (notes the fallback once).
  [[nodiscard]] bool fused_attention(int head_dim) const;
  void attention_forward_unfused(float* out, float* saved, const float* qkv, int batch, int seq,
                                 int heads, int head_dim);
  void attention_backward_unfused(float* dqkv, const float* dout, const float* qkv,
                                  const float* saved, int batch, int seq, int heads, int head_dim,
                                  float* workspace);
  /// A multi-tensor table on the device, kept while the same tensors are passed again.
  struct TensorTable {
    std::vector<kernels::TensorEntry> entries;  // host copy of the device table
    std::vector<std::size_t> sizes;
    int chunk_count = 0;
    DeviceArray<kernels::TensorEntry> d_entries;
    DeviceArray<kernels::Chunk> d_chunks;
  };
  /// Makes `table` describe `entries` (sizes[i] elements each); uploads only on a change.
  void prepare_table(TensorTable& table, const std::vector<kernels::TensorEntry>& entries,
                     const std::vector<std::size_t>& sizes);
  /// Throws atlas::Error (Internal) while a graph is being recorded: `what` (a host transfer, a
  /// wait, an allocation, host-side state) cannot be recorded.
  void not_while_capturing(const char* what) const;
  /// `n` floats of the backend's bias-gradient scratch.
  float* dbias_scratch(std::size_t n);

  /// din = dout w (times gelu'(in_pre) when in_act = Gelu): linear_backward's second half.
  /// reuse_dout: the dW GEMM right before converted dout (its bf16 copy is reused).
  void linear_backward_din(float* din, const float* dout, const float* w, const float* in_pre,
                           int rows, int in_f, int out_f, Activation in_act, bool reuse_dout);
  /// After a cross-entropy kernel: its bad-target flag is copied to the host in stream order
  /// (no wait), and the next sync() reports it. One check per synchronisation the work needs
  /// anyway (a step's loss download), not a host stall per call.
  void queue_target_check(int vocab);
  /// Waits for the stream; then, if a cross-entropy call since the last sync flagged a target
  /// outside its vocabulary, re-arms the flag and throws atlas::Error (Internal) naming the first
  /// such row and its target. Every place that waits for the stream goes through here.
  void sync();

  int m_device;
  std::string m_pci_bus_id;
  std::string m_description;
  double m_nccl_timeout_s = 300.0;  // device.nccl_timeout_s's default
  Stream m_stream;
  CublasHandle m_cublas;
  // cuBLAS's workspace, fixed (cublasSetWorkspace): a recorded cuBLAS call (fp32 GEMMs, the
  // unfused attention, cuBLASLt's fallback) then allocates nothing of its own in each graph.
  DeviceArray<unsigned char> m_cublas_workspace;
  DeviceArray<double> m_norm_scratch;  // sq_norm partial sums, then the total
  DeviceArray<kernels::BadTarget> m_bad_target;  // first bad row and its target (kNoBadTarget: none)
  PinnedArray<kernels::BadTarget> m_host_bad;    // its copy, valid after the next sync
  bool m_target_check_pending = false;           // a copy of it was queued since the last sync
  int m_target_vocab = 0;                        // the vocabulary of those calls (-1: several)
  PinnedArray<double> m_host_double;
  // Pinned staging for small uploads (upload): a ring of slots, each reused once the copy out of
  // it has finished (its event), allocated at first use.
  static constexpr std::size_t kStageBytes = std::size_t{1} << 20;
  static constexpr std::size_t kStageSlots = 4;
  struct StageSlot {
    PinnedArray<unsigned char> bytes;
    Event copied{false};
    bool used = false;
  };
  std::vector<StageSlot> m_stage;
  std::size_t m_stage_next = 0;
  AttentionOptions m_attention;
  LtGemm m_lt;
  DeviceArray<float> m_dbias_scratch;
  TensorTable m_adamw_table;
  TensorTable m_norm_table;
  DeviceArray<double> m_norm_partials;
  bool m_capturing = false;  // begin_capture ... end_capture
  std::vector<std::pair<void*, std::size_t>> m_deferred_frees;  // released while recording (free_deferred)
  std::string m_capture_violation;  // why the recording cannot become a graph (release during it)
  std::uint64_t m_epoch = 0;  // + m_lt.epoch(): graph_epoch()
};

}  // namespace atlas::device::cuda
