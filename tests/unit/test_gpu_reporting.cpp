// SPDX-License-Identifier: MIT
// What a GPU run reports and how its table is costed, checked without a GPU: the model FLOPs per
// token and MFU (hand-computed numbers), the peak of a precision, the GPU named by a CUDA device's
// description, the runtime's choice of device profile for a cuda deck (its table ~1000x shorter
// than the host profile's), activation bytes following device.precision, and the backend's memory
// high-water mark.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/sched/mfu.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {
namespace {

namespace fs = std::filesystem;

constexpr const char* kH200 =
    "cuda (device 0 of 1 for local rank 0: NVIDIA H200, 139.8 GiB, sm_90, CUDA 13.0, cuBLAS 130000, TF32 off)";

/// inputs/default.deck on one rank with `more` overrides, validated as a CUDA binary would.
Config deck_with(std::vector<std::string> more) {
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  std::vector<std::string> ov = {"parallel.stages_per_dc=1 0", "cluster.gpus_per_dc=1 0", "parallel.dp_size=1"};
  ov.insert(ov.end(), more.begin(), more.end());
  deck::JobShape shape;
  shape.world_size = 1;
  shape.cuda_built = true;
  const fs::path here = fs::current_path();
  fs::current_path(root);  // profiles/device/ relative to the checkout
  Config cfg = deck::parse_and_validate("default.deck", deck::read_text_file((root / "inputs/default.deck").string()),
                                        ov, shape);
  deck::read_device_profiles(cfg);
  fs::current_path(here);
  return cfg;
}

TEST(Mfu, ModelFlopsPerTokenIsSixNPlusTwelveLTC) {
  ModelCfg m;
  m.layers = 2;
  m.hidden = 4;
  m.heads = 1;
  m.seq_len = 8;
  m.vocab = 10;
  // N = vocab C + T C + L (12 C^2 + 13 C) + 2 C = 40 + 32 + 2 x 244 + 8 = 568; 6 N = 3408;
  // 12 L T C = 12 x 2 x 8 x 4 = 768.
  ASSERT_EQ(m.parameter_count(), 568);
  EXPECT_DOUBLE_EQ(model_flops_per_token(m), 3408.0 + 768.0);
  // The shape (12 x 768, 12 heads, seq 1024, bytes): N = 86,039,040 -> 629,480,448 FLOPs.
  m = ModelCfg{};
  m.layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.seq_len = 1024;
  m.vocab = 256;
  EXPECT_DOUBLE_EQ(model_flops_per_token(m), 629480448.0);
}

TEST(Mfu, IsTokenFlopsOverTheDevicesPeak) {
  EXPECT_DOUBLE_EQ(mfu(1000.0, 4176.0, 1e6, 2), 2.088);  // 4.176e6 / 2e6
  // 52,500 tokens/s of the model on one H200 (989 TFLOP/s bf16): 3.34% MFU.
  EXPECT_NEAR(mfu(52500.0, 629480448.0, 989e12, 1), 0.033415, 1e-6);
  EXPECT_EQ(mfu(1000.0, 4176.0, 0.0, 1), 0.0);
  EXPECT_EQ(mfu(1000.0, 4176.0, 1e6, 0), 0.0);
}

TEST(Mfu, ThePeakFollowsThePrecision) {
  const DeviceProfile h200 = builtin_device_profile(GpuKind::H200);
  EXPECT_DOUBLE_EQ(peak_flops(h200, Precision::Bf16), 989e12);
  EXPECT_DOUBLE_EQ(peak_flops(h200, Precision::Auto), 989e12);
  EXPECT_DOUBLE_EQ(peak_flops(h200, Precision::Tf32), 494.5e12);
  EXPECT_DOUBLE_EQ(peak_flops(h200, Precision::Fp32), 67e12);
  // A profile without the fp32/tf32 peaks (the host's) falls back to peak_tflops.
  const DeviceProfile host = builtin_device_profile(GpuKind::Host);
  EXPECT_DOUBLE_EQ(peak_flops(host, Precision::Fp32), host.peak_tflops * 1e12);
}

TEST(Mfu, TheProfileFilesCarryTheBuiltInPeaks) {
  for (GpuKind g : {GpuKind::A100, GpuKind::H100, GpuKind::H200}) {
    const DeviceProfile b = builtin_device_profile(g);
    const fs::path file = fs::path(ATLAS_SOURCE_DIR) / "profiles/device" / (b.name + ".profile");
    const DeviceProfile f = parse_device_profile(file.string(), deck::read_text_file(file.string()));
    EXPECT_GT(b.peak_tflops_tf32, 0) << b.name;
    EXPECT_GT(b.peak_tflops_fp32, 0) << b.name;
    EXPECT_DOUBLE_EQ(f.peak_tflops_tf32, b.peak_tflops_tf32) << b.name;
    EXPECT_DOUBLE_EQ(f.peak_tflops_fp32, b.peak_tflops_fp32) << b.name;
    const DeviceProfile q = parse_device_profile("round.profile", format_device_profile(b));
    EXPECT_DOUBLE_EQ(q.peak_tflops_tf32, b.peak_tflops_tf32) << b.name;
    EXPECT_DOUBLE_EQ(q.peak_tflops_fp32, b.peak_tflops_fp32) << b.name;
  }
}

TEST(RunCosting, TheDeviceNameNamesTheGpu) {
  EXPECT_EQ(gpu_kind_of_device(kH200), GpuKind::H200);
  EXPECT_EQ(gpu_kind_of_device("NVIDIA A100-SXM4-80GB"), GpuKind::A100);
  EXPECT_EQ(gpu_kind_of_device("nvidia h100 80gb hbm3"), GpuKind::H100);
  EXPECT_EQ(gpu_kind_of_device("Tesla V100-SXM2-16GB"), std::nullopt);
  EXPECT_EQ(gpu_kind_of_device("host (OpenBLAS, 4 threads)"), std::nullopt);
  EXPECT_EQ(gpu_kind_of_device(""), std::nullopt);
}

TEST(RunCosting, ACudaDeckIsCostedForItsGpuAThousandTimesFasterThanTheHost) {
  const Config cuda = deck_with({"device.backend=cuda"});
  ASSERT_EQ(cuda.plan.gpu, GpuKind::Host);
  const RunCosting c = run_costing(cuda, kH200);
  EXPECT_EQ(c.gpu, GpuKind::H200);
  EXPECT_NE(c.note.find("costed with the h200 device profile"), std::string::npos) << c.note;
  EXPECT_NE(c.note.find("atlas profile --gemm --backend cuda --update profiles/device/h200.profile"), std::string::npos)
      << c.note;
  Config costed = cuda;
  costed.plan.gpu = c.gpu;
  const topo::Layout layout(1, cuda.parallel);
  const ScheduleTable host_table = build_schedule(deck_with({}), layout);  // the host backend, its profile
  const ScheduleTable gpu_table = build_schedule(costed, layout);
  ASSERT_GT(gpu_table.step_ms, 0.0);
  // The host profile (20 GFLOP/s) against the H200's 989 TFLOP/s x GEMM efficiency: ~1000x and more.
  EXPECT_GT(host_table.step_ms / gpu_table.step_ms, 300.0)
      << "host " << host_table.step_ms << " ms, h200 " << gpu_table.step_ms << " ms";

  // A GPU that names no profile: h100, and the note says so and how to fix it.
  const RunCosting unknown = run_costing(cuda, "cuda (device 0 of 1: NVIDIA L4)");
  EXPECT_EQ(unknown.gpu, GpuKind::H100);
  EXPECT_NE(unknown.note.find("no a100/h100/h200 in the device's name"), std::string::npos) << unknown.note;
  EXPECT_NE(unknown.note.find("set plan.gpu"), std::string::npos) << unknown.note;
  // plan.gpu set by the deck wins over the device's name.
  const RunCosting a100 = run_costing(deck_with({"device.backend=cuda", "plan.gpu=a100"}), kH200);
  EXPECT_EQ(a100.gpu, GpuKind::A100);
  EXPECT_NE(a100.note.find("a100 device profile (plan.gpu)"), std::string::npos) << a100.note;
  // A host run keeps plan.gpu and says nothing.
  const RunCosting host = run_costing(deck_with({}), kH200);
  EXPECT_EQ(host.gpu, GpuKind::Host);
  EXPECT_TRUE(host.note.empty());
}

TEST(RunCosting, OfflineACudaDeckWithoutPlanGpuIsCostedWithTheH100Profile) {
  // schedule, simulate and plan know no device: a cuda deck that leaves plan.gpu = host is costed
  // with h100 (as run_costing with no device name), not with the host profile (a GPU step ~1000x
  // too long: `atlas simulate inputs/gpt2_124m_gpu.deck` predicted 4,430 s a step), and a note says so.
  const Config cuda = deck_with({"device.backend=cuda"});
  EXPECT_EQ(device_profile(cuda).name, "h100");
  EXPECT_EQ(run_costing(cuda, "").gpu, GpuKind::H100);
  EXPECT_NE(offline_costing_note(cuda).find("costed with the h100 device profile"), std::string::npos)
      << offline_costing_note(cuda);
  const topo::Layout layout(1, cuda.parallel);
  Config h100 = cuda;
  h100.plan.gpu = GpuKind::H100;
  EXPECT_DOUBLE_EQ(build_schedule(cuda, layout).step_ms, build_schedule(h100, layout).step_ms);
  // plan.gpu set, or a host deck: its own profile, no note.
  EXPECT_EQ(device_profile(deck_with({"device.backend=cuda", "plan.gpu=a100"})).name, "a100");
  EXPECT_TRUE(offline_costing_note(deck_with({"device.backend=cuda", "plan.gpu=a100"})).empty());
  EXPECT_EQ(device_profile(deck_with({})).name, "host");
  EXPECT_TRUE(offline_costing_note(deck_with({})).empty());
}

TEST(RunCosting, ActivationBytesFollowDevicePrecisionOnAGpu) {
  auto bytes = [](const std::vector<std::string>& ov) { return device_profile(deck_with(ov)).activation_bytes; };
  EXPECT_DOUBLE_EQ(bytes({"device.backend=cuda", "plan.gpu=h200"}), 2.0);  // auto = bf16 on cuda
  EXPECT_DOUBLE_EQ(bytes({"device.backend=cuda", "plan.gpu=h200", "device.precision=bf16"}), 2.0);
  EXPECT_DOUBLE_EQ(bytes({"device.backend=cuda", "plan.gpu=h200", "device.precision=fp32"}), 4.0);
  EXPECT_DOUBLE_EQ(bytes({"device.backend=cuda", "plan.gpu=h200", "device.precision=tf32"}), 4.0);
  // The host's profile keeps its own (the host backend's precision is H1's cost-model change).
  EXPECT_DOUBLE_EQ(bytes({}), builtin_device_profile(GpuKind::Host).activation_bytes);
}

TEST(PeakBytes, TheHighWaterMarkOfBuffersAndTheHostsResidentSet) {
  const auto backend = device::make_host_backend(1);
  EXPECT_EQ(backend->buffer_peak_bytes(), 0U);
  constexpr std::size_t kBig = std::size_t{48} << 20;
  {
    device::Buffer a = backend->alloc(kBig);
    device::Buffer b = backend->alloc(1000);
    EXPECT_EQ(backend->buffer_peak_bytes(), kBig + 1000);
  }
  // Released: the mark stays; a smaller allocation does not raise it, a larger one does.
  device::Buffer c = backend->alloc(4096);
  EXPECT_EQ(backend->buffer_peak_bytes(), kBig + 1000);
  device::Buffer d = backend->alloc(kBig);
  EXPECT_EQ(backend->buffer_peak_bytes(), 4096 + kBig);  // c and d held together
  // The host's peak: the process's peak resident set, never below the Buffers' own mark (calloc'd
  // pages that were never touched are not resident).
  EXPECT_GE(backend->peak_bytes(), backend->buffer_peak_bytes());
}

}  // namespace
}  // namespace atlas::sched
