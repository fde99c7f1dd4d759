// SPDX-License-Identifier: MIT
// Implausible predictions (see sanity.hpp).
#include "atlas/sim/sanity.hpp"

#include <fmt/format.h>

namespace atlas::sim {

std::vector<std::string> sanity_warnings(const Config& cfg, double step_ms) {
  std::vector<std::string> out;
  const auto params = static_cast<double>(cfg.model.parameter_count());
  if (params > kAbsurdParameters)
    out.push_back(fmt::format("the model has {:.3g} parameters (model.layers {} x model.hidden {}), more than {:.0e}: "
                              "no machine trains that; check model.hidden and model.layers",
                              params, cfg.model.layers, cfg.model.hidden, kAbsurdParameters));
  if (step_ms / 1e3 > kAbsurdStepS)
    out.push_back(fmt::format("a predicted step of {:.3g} s ({:.1f} h, more than {:.0f} s): check the model size, "
                              "train.micro_batches, the GPUs (parallel.*, plan.gpu) and the WAN (cluster.latency_ms, "
                              "cluster.bandwidth_gbps, wan.flow_window_bytes)",
                              step_ms / 1e3, step_ms / 3.6e6, kAbsurdStepS));
  return out;
}

}  // namespace atlas::sim
