// SPDX-License-Identifier: MIT
// cuda_emu stand-in for <cuda_bf16.h> (tests only).
#pragma once
#include "cuda_emu.hpp"
