// SPDX-License-Identifier: MIT
// Model FLOPs per token, the device's peak for a precision, and MFU (see mfu.hpp).
#include "atlas/sched/mfu.hpp"

namespace atlas::sched {

double model_flops_per_token(const ModelCfg& m) {
  const double n = static_cast<double>(m.parameter_count());
  return 6.0 * n + 12.0 * m.layers * static_cast<double>(m.seq_len) * m.hidden;
}

double peak_flops(const DeviceProfile& p, Precision precision) {
  double tflops = p.peak_tflops;
  if (precision == Precision::Tf32 && p.peak_tflops_tf32 > 0) tflops = p.peak_tflops_tf32;
  if (precision == Precision::Fp32 && p.peak_tflops_fp32 > 0) tflops = p.peak_tflops_fp32;
  return tflops * 1e12;
}

double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_device, int devices) {
  if (!(peak_flops_per_device > 0) || devices <= 0 || !(tokens_per_s > 0)) return 0.0;
  return tokens_per_s * flops_per_token / (peak_flops_per_device * devices);
}

}  // namespace atlas::sched
