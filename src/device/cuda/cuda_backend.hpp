// SPDX-License-Identifier: MIT
// CUDA-free entry points of the CUDA backend, for the factory registration and the GPU tests:
// device discovery, device selection by node-local rank, and the backend constructor. The
// backend class itself (with CUDA types) is in cuda_backend_impl.hpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"

namespace atlas::device {
class Collective;
}  // namespace atlas::device

namespace atlas::device::cuda {

/// What the CUDA runtime reports about this process's devices.
struct DeviceProbe {
  int count = 0;      ///< devices visible (0 when the call failed)
  std::string error;  ///< empty if cudaGetDeviceCount succeeded, else "<name> (<text>)"
};

/// Asks cudaGetDeviceCount (checks its return code: without a driver it fails and leaves the
/// count untouched). Never throws.
[[nodiscard]] DeviceProbe probe_devices();

/// Node-local rank from the launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
/// MPI_LOCALRANKID, PMI_LOCAL_RANK, first one set wins); 0 when none is set.
[[nodiscard]] int local_rank_from_env();

/// A CUDA backend on device local_rank_from_env() % count, with its own stream and cuBLAS
/// handle; sets that device current on the calling thread. Throws atlas::Error (Device) with
/// "no CUDA device is visible" and the runtime's reason when there is none.
[[nodiscard]] std::unique_ptr<Backend> make_cuda_backend(const DeviceCfg& cfg);

/// The device ordinal `backend` runs on if it is a CUDA backend, else -1.
[[nodiscard]] int device_of(const Backend& backend);

/// "<pci bus id>" of the device `backend` runs on ("" if not a CUDA backend). Two ranks with the
/// same host name and bus id share one GPU.
[[nodiscard]] std::string pci_bus_id_of(const Backend& backend);

/// Device bytes this process's CUDA backends hold now (their Buffers and scratch: device_bytes());
/// the footer's peak memory is the most of it at once (Backend::peak_bytes). For tests.
[[nodiscard]] std::size_t device_bytes_held();

/// Fused GEMM calls of `backend` that cuBLASLt refused so far (composed of unfused calls
/// instead); -1 if not a CUDA backend. The GPU tests print it.
[[nodiscard]] long epilogue_fallbacks_of(const Backend& backend);

/// The NCCL limit (device.nccl_timeout_s, seconds) of `backend` if it is a CUDA backend, else 0.
[[nodiscard]] double nccl_timeout_s_of(const Backend& backend);

/// True if `collective` (from device::make_collective) sums with NCCL; false for MPI (host
/// memory) or MPI staged through host memory (several group members on one GPU).
[[nodiscard]] bool uses_nccl(const device::Collective& collective);

}  // namespace atlas::device::cuda
