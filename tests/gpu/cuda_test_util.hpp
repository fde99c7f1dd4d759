// SPDX-License-Identifier: MIT
// What the GPU tests share: why this machine has no CUDA device to test on ("" when it has one),
// the reason every GPU test skips with.
#pragma once

#include <string>

#include "cuda_backend.hpp"

namespace atlas::testutil {

inline std::string no_device_reason() {
  const device::cuda::DeviceProbe probe = device::cuda::probe_devices();
  if (!probe.error.empty()) return "cudaGetDeviceCount returned " + probe.error;
  if (probe.count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

}  // namespace atlas::testutil
