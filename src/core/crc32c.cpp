// SPDX-License-Identifier: MIT
// CRC32C through ISA-L.
#include "atlas/core/crc32c.hpp"

#include <isa-l/crc.h>

namespace atlas {

std::uint32_t crc32c(const void* data, std::size_t bytes) { return crc32c_extend(0, data, bytes); }

std::uint32_t crc32c_extend(std::uint32_t crc_so_far, const void* data, std::size_t bytes) {
  // crc32_iscsi keeps the raw register: start at ~0 (the register after the empty string, whose
  // CRC is 0) and invert at the end (standard CRC32C).
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  unsigned int crc = ~crc_so_far;
  constexpr std::size_t kPiece = std::size_t{1} << 30;  // its length argument is an int
  while (bytes > 0) {
    const std::size_t n = bytes < kPiece ? bytes : kPiece;
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    bytes -= n;
  }
  return ~crc;
}

}  // namespace atlas
