// SPDX-License-Identifier: MIT
// What the GPU tests share: why this machine has no CUDA device to test on ("" when it has one),
// the reason every GPU test skips with; a fixture that skips so; a CUDA backend at a precision.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cuda_backend.hpp"

namespace atlas::testutil {

inline std::string no_device_reason() {
  const device::cuda::DeviceProbe probe = device::cuda::probe_devices();
  if (!probe.error.empty()) return "cudaGetDeviceCount returned " + probe.error;
  if (probe.count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

/// A test that needs a CUDA device: skipped, with the reason, where none is visible.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device visible (" << reason << "): skipped";
  }
};

/// The CUDA backend (device.backend = cuda) at `precision`.
inline std::unique_ptr<device::Backend> make_cuda(Precision precision) {
  DeviceCfg cfg;
  cfg.backend = Backend::Cuda;
  cfg.precision = precision;
  return device::cuda::make_cuda_backend(cfg);
}

}  // namespace atlas::testutil
