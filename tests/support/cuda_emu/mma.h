// SPDX-License-Identifier: MIT
// cuda_emu stand-in for <mma.h> (tests only).
#pragma once
#include "cuda_emu.hpp"
