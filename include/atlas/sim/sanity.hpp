// SPDX-License-Identifier: MIT
// Warnings on predictions that cannot describe a real training job (a model of more parameters
// than any machine holds, a step of hours): the deck probably has a typo. Not errors: a what-if
// study may mean it.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::sim {

/// Above this many parameters a model is flagged (the largest trained models have ~2e12).
inline constexpr double kAbsurdParameters = 1e14;
/// A predicted step longer than this is flagged (real steps take seconds to minutes).
inline constexpr double kAbsurdStepS = 3600.0;

/// One line per implausible figure, each naming the keys to check; empty when all is plausible.
std::vector<std::string> sanity_warnings(const Config& cfg, double step_ms);

}  // namespace atlas::sim
