// SPDX-License-Identifier: MIT
// CudaBackend's graphs (Backend::begin_capture, end_capture, launch_graph): stream capture of
// the backend's one stream into a CUDA graph, instantiated once and launched on the same stream.
// Work recorded must not allocate, move host data or read host-side state at replay (each such
// call refuses while recording: not_while_capturing); cuBLASLt's weight copies are renewed before
// a recording and before every launch (LtGemm::refresh_weights), and its A-operand reuse is reset
// around both (LtGemm::forget_last_a). docs/cuda.md, "CUDA graphs".
#include <string>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "cuda_backend_impl.hpp"

namespace atlas::device::cuda {

namespace {

class CudaGraph final : public Graph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : m_exec(exec) {}
  ~CudaGraph() override {
    if (m_exec != nullptr) (void)cudaGraphExecDestroy(m_exec);
  }
  [[nodiscard]] cudaGraphExec_t exec() const noexcept { return m_exec; }

 private:
  cudaGraphExec_t m_exec = nullptr;
};

std::string cuda_error(const char* call, cudaError_t err) {
  return fmt::format("{} failed: {} ({})", call, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace

void CudaBackend::not_while_capturing(const char* what) const {
  if (m_capturing)
    ATLAS_THROW(Internal, "cuda backend: " << what << " inside a CUDA graph recording, which cannot record it");
}

void CudaBackend::begin_capture() {
  ATLAS_ASSERT(!m_capturing, "begin_capture while a graph is being recorded");
  make_current();
  m_lt.refresh_weights();  // the recorded GEMMs read the copies; no conversion is recorded
  m_lt.forget_last_a();    // the first recorded GEMM converts its A itself
  // Thread-local mode: another thread's CUDA calls (the WAN sender, NCCL's proxy) are unaffected.
  ATLAS_CUDA_CHECK(cudaStreamBeginCapture(m_stream.get(), cudaStreamCaptureModeThreadLocal));
  m_capture_violation.clear();
  m_capturing = true;
  m_lt.set_capturing(true);
}

std::unique_ptr<Graph> CudaBackend::end_capture(std::string* why) {
  ATLAS_ASSERT(m_capturing, "end_capture without begin_capture");
  m_capturing = false;
  m_lt.set_capturing(false);
  m_lt.forget_last_a();  // what the A workspace holds is the recording's business now
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(m_stream.get(), &graph);
  free_deferred();
  std::string fail;
  if (ended != cudaSuccess) fail = cuda_error("cudaStreamEndCapture", ended);
  else if (graph == nullptr) fail = "cudaStreamEndCapture gave no graph";
  else if (!m_lt.capture_violation().empty()) fail = m_lt.capture_violation();
  else if (!m_capture_violation.empty()) fail = m_capture_violation;
  cudaGraphExec_t exec = nullptr;
  if (fail.empty()) {
    const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (made != cudaSuccess) fail = cuda_error("cudaGraphInstantiateWithFlags", made);
  }
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (!fail.empty()) {
    // A failed capture leaves a non-sticky error behind: clear it so the next call does not report it.
    (void)cudaGetLastError();
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (why != nullptr) *why = fail;
    return nullptr;
  }
  return std::make_unique<CudaGraph>(exec);
}

void CudaBackend::abort_capture() noexcept {
  if (!m_capturing) return;
  m_capturing = false;
  m_lt.set_capturing(false);
  m_lt.forget_last_a();
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(m_stream.get(), &graph) == cudaSuccess && graph != nullptr) (void)cudaGraphDestroy(graph);
  free_deferred();
  (void)cudaGetLastError();  // an invalidated capture's non-sticky error
}

void CudaBackend::launch_graph(Graph& graph) {
  ATLAS_ASSERT(!m_capturing, "launch_graph inside a graph recording");
  auto* cuda_graph = dynamic_cast<CudaGraph*>(&graph);
  ATLAS_ASSERT(cuda_graph != nullptr, "launch_graph of a graph another backend recorded");
  m_lt.refresh_weights();
  ATLAS_CUDA_CHECK(cudaGraphLaunch(cuda_graph->exec(), m_stream.get()));
  m_lt.forget_last_a();
}

}  // namespace atlas::device::cuda
