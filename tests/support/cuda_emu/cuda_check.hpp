// SPDX-License-Identifier: MIT
// cuda_emu stand-in for src/device/cuda/cuda_check.hpp, which common.cuh includes (tests only).
#pragma once
#include "cuda_emu.hpp"
