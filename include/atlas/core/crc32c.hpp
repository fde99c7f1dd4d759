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
/// The CRC32C of a byte string continued by `bytes` more bytes at `data`, from `crc` = the
/// CRC32C of the string so far: crc32c_extend(crc32c(a, n), b, m) == crc32c of a then b, and
/// crc32c_extend(0, p, n) == crc32c(p, n).
[[nodiscard]] std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t bytes);

}  // namespace atlas
