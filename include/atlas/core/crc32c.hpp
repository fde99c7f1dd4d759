// SPDX-License-Identifier: MIT
// CRC32C (Castagnoli), the one checksum atlas uses: WAN frame payloads and headers, checkpoint
// datasets. Through ISA-L's crc32_iscsi (hardware CRC instructions where the CPU has them).
// A CRC detects accidental corruption only; it is not a MAC.
#pragma once

#include <cstddef>
#include <cstdint>

namespace atlas {

/// CRC32C (Castagnoli, as iSCSI and ext4) of `bytes` bytes at `data`: initial value ~0, final
/// inversion, so crc32c("123456789", 9) == 0xE3069283 and crc32c(p, 0) == 0. Any length.
[[nodiscard]] std::uint32_t crc32c(const void* data, std::size_t bytes);

}  // namespace atlas
