# SPDX-License-Identifier: MIT
# device.precision (#22, docs/precision.md): the bf16/tf32 rounding helpers, the host backend's
# emulation of the GPU's matmul numerics, emulated-bf16 training against fp32, bf16 boundaries.
atlas_unit_test(test_device_rounding unit/test_device_rounding.cpp)
atlas_unit_test(test_device_precision unit/test_device_precision.cpp)
atlas_unit_test(test_model_precision unit/test_model_precision.cpp)
