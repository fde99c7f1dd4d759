// SPDX-License-Identifier: MIT
// Verifiable WAN test payloads: every byte is a pure function of (seed, src, dst, message,
// offset), so a receiver checks any chunk alone, whichever rail it came on (nccl-tests idea).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace atlas::wan::testing {

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t payload_key(std::uint64_t seed, int src, int dst, std::uint64_t msg) {
  return splitmix(seed ^ splitmix((static_cast<std::uint64_t>(src) << 40) ^
                                  (static_cast<std::uint64_t>(dst) << 20) ^ msg));
}

/// Fills `bytes` bytes of message `msg` from `src` to `dst`.
inline void fill_payload(std::uint8_t* out, std::size_t bytes, std::uint64_t seed, int src, int dst,
                         std::uint64_t msg) {
  const std::uint64_t key = payload_key(seed, src, dst, msg);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t w = splitmix(key + i);
    std::memcpy(out + i, &w, 8);
  }
  if (i < bytes) {
    const std::uint64_t w = splitmix(key + i);
    std::memcpy(out + i, &w, bytes - i);
  }
}

/// Offset of the first wrong byte, or SIZE_MAX when the whole message is right.
inline std::size_t check_payload(const std::uint8_t* in, std::size_t bytes, std::uint64_t seed, int src,
                                 int dst, std::uint64_t msg) {
  const std::uint64_t key = payload_key(seed, src, dst, msg);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t w = splitmix(key + i);
    const std::size_t n = bytes - i < 8 ? bytes - i : 8;
    if (std::memcmp(in + i, &w, n) != 0) {
      for (std::size_t j = 0; j < n; ++j)
        if (in[i + j] != reinterpret_cast<const std::uint8_t*>(&w)[j]) return i + j;
    }
  }
  return SIZE_MAX;
}

inline std::vector<std::uint8_t> make_payload(std::size_t bytes, std::uint64_t seed, int src, int dst,
                                              std::uint64_t msg) {
  std::vector<std::uint8_t> v(bytes);
  fill_payload(v.data(), bytes, seed, src, dst, msg);
  return v;
}

}  // namespace atlas::wan::testing
