// SPDX-License-Identifier: MIT
// Frame header and handshake encoding (CRC32C: core/crc32c.hpp) and HMAC-SHA256 (OpenSSL).
#include "atlas/wan/framing.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/error.hpp"

namespace atlas::wan {

namespace {

// ---- little-endian helpers ----
void put_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint16_t get_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

constexpr std::uint8_t kHelloType = 1;
constexpr std::uint8_t kChallengeType = 2;
constexpr std::uint8_t kResponseType = 3;
constexpr std::size_t kChallengeMacAt = 56;  // challenge bytes before the MAC are covered by it

void put_hs_prefix(std::uint8_t* p, std::uint8_t type) {
  put_u32(p, kHandshakeMagic);
  p[4] = kWireVersion;
  p[5] = type;
  put_u16(p + 6, 0);
}

std::string check_hs_prefix(const std::uint8_t* p, std::uint8_t type, const char* what) {
  if (get_u32(p) != kHandshakeMagic)
    return fmt::format("{} has bad magic 0x{:08x} (expected 0x{:08x}): not an atlas WAN peer", what,
                       get_u32(p), kHandshakeMagic);
  if (p[4] != kWireVersion)
    return fmt::format("{} has wire version {} but this build speaks {}", what, p[4], kWireVersion);
  if (p[5] != type) return fmt::format("{} has message type {} (expected {})", what, p[5], type);
  return {};
}

Mac hmac(const Secret& secret, const char* label, std::span<const std::uint8_t> a,
         std::span<const std::uint8_t> b) {
  std::vector<std::uint8_t> msg;
  const std::size_t label_len = std::strlen(label);
  msg.reserve(label_len + a.size() + b.size());
  msg.insert(msg.end(), label, label + label_len);
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  Mac out{};
  unsigned int out_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
           out.data(), &out_len) == nullptr ||
      out_len != out.size())
    throw Error(ExitCode::Comm, "WAN handshake: HMAC-SHA256 failed inside OpenSSL");
  return out;
}

}  // namespace

// ---- frame header ----

void encode_header(const FrameHeader& h, std::span<std::uint8_t, kHeaderBytes> out) {
  std::uint8_t* p = out.data();
  put_u32(p + 0, kFrameMagic);
  p[4] = kWireVersion;
  p[5] = static_cast<std::uint8_t>(h.type);
  put_u16(p + 6, h.flags);
  put_u32(p + 8, h.length);
  put_u32(p + 12, h.payload_crc);
  put_u64(p + 16, h.msg_id);
  put_u64(p + 24, h.offset);
  put_u64(p + 32, h.total);
  put_u64(p + 40, h.tag_seq);
  put_u32(p + 48, static_cast<std::uint32_t>(h.tag));
  put_u32(p + 52, crc32c(p, 52));
}

std::string decode_header(std::span<const std::uint8_t, kHeaderBytes> in,
                          std::uint64_t max_frame_bytes, FrameHeader& h) {
  const std::uint8_t* p = in.data();
  if (get_u32(p) != kFrameMagic)
    return fmt::format("bad frame magic 0x{:08x} (expected 0x{:08x}): the stream is corrupt",
                       get_u32(p), kFrameMagic);
  if (p[4] != kWireVersion)
    return fmt::format("frame has wire version {} but this build speaks {}", p[4], kWireVersion);
  const std::uint32_t want = crc32c(p, 52);
  if (get_u32(p + 52) != want)
    return fmt::format("frame header CRC32C mismatch (header says 0x{:08x}, computed 0x{:08x})",
                       get_u32(p + 52), want);
  const std::uint8_t type = p[5];
  if (type < static_cast<std::uint8_t>(FrameType::Data) ||
      type > static_cast<std::uint8_t>(FrameType::Pad))
    return fmt::format("unknown frame type {}", type);
  h.type = static_cast<FrameType>(type);
  h.flags = get_u16(p + 6);
  h.length = get_u32(p + 8);
  h.payload_crc = get_u32(p + 12);
  h.msg_id = get_u64(p + 16);
  h.offset = get_u64(p + 24);
  h.total = get_u64(p + 32);
  h.tag_seq = get_u64(p + 40);
  h.tag = static_cast<std::int32_t>(get_u32(p + 48));
  if (h.length > max_frame_bytes)
    return fmt::format("frame length {} bytes exceeds wan.max_frame_bytes = {}", h.length,
                       max_frame_bytes);
  if (h.type != FrameType::Data && h.type != FrameType::Pad && h.length != 0)
    return fmt::format("control frame (type {}) carries a {}-byte payload", type, h.length);
  return {};
}

// ---- handshake ----

std::array<std::uint8_t, kHelloBytes> encode_hello(const Hello& h) {
  std::array<std::uint8_t, kHelloBytes> out{};
  std::uint8_t* p = out.data();
  put_hs_prefix(p, kHelloType);
  put_u32(p + 8, static_cast<std::uint32_t>(h.from_rank));
  put_u32(p + 12, static_cast<std::uint32_t>(h.to_rank));
  put_u32(p + 16, h.rail);
  put_u32(p + 20, h.rails);
  put_u64(p + 24, h.chunk_bytes);
  put_u64(p + 32, h.credit_bytes);
  std::memcpy(p + 40, h.nonce.data(), h.nonce.size());
  return out;
}

std::string decode_hello(std::span<const std::uint8_t, kHelloBytes> in, Hello& h) {
  const std::uint8_t* p = in.data();
  if (auto why = check_hs_prefix(p, kHelloType, "handshake hello"); !why.empty()) return why;
  h.from_rank = static_cast<std::int32_t>(get_u32(p + 8));
  h.to_rank = static_cast<std::int32_t>(get_u32(p + 12));
  h.rail = get_u32(p + 16);
  h.rails = get_u32(p + 20);
  h.chunk_bytes = get_u64(p + 24);
  h.credit_bytes = get_u64(p + 32);
  std::memcpy(h.nonce.data(), p + 40, h.nonce.size());
  return {};
}

std::array<std::uint8_t, kChallengeBytes> encode_challenge(
    const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello, std::uint64_t chunk_bytes,
    std::uint64_t credit_bytes, const Nonce& nonce) {
  std::array<std::uint8_t, kChallengeBytes> out{};
  std::uint8_t* p = out.data();
  put_hs_prefix(p, kChallengeType);
  put_u64(p + 8, chunk_bytes);
  put_u64(p + 16, credit_bytes);
  std::memcpy(p + 24, nonce.data(), nonce.size());
  const Mac mac = hmac(secret, "atlas-wan/accept", hello, std::span(out).first(kChallengeMacAt));
  std::memcpy(p + kChallengeMacAt, mac.data(), mac.size());
  return out;
}

std::string check_challenge(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                            std::span<const std::uint8_t, kChallengeBytes> in, Challenge& c) {
  const std::uint8_t* p = in.data();
  if (auto why = check_hs_prefix(p, kChallengeType, "handshake challenge"); !why.empty()) return why;
  c.chunk_bytes = get_u64(p + 8);
  c.credit_bytes = get_u64(p + 16);
  std::memcpy(c.nonce.data(), p + 24, c.nonce.size());
  std::memcpy(c.mac.data(), p + kChallengeMacAt, c.mac.size());
  const Mac want = hmac(secret, "atlas-wan/accept", hello, in.first(kChallengeMacAt));
  if (CRYPTO_memcmp(want.data(), c.mac.data(), want.size()) != 0)
    return "the acceptor's HMAC-SHA256 proof does not match this job's secret (a different job, "
           "or not an atlas peer)";
  return {};
}

std::array<std::uint8_t, kResponseBytes> encode_response(
    const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
    std::span<const std::uint8_t, kChallengeBytes> challenge) {
  std::array<std::uint8_t, kResponseBytes> out{};
  put_hs_prefix(out.data(), kResponseType);
  const Mac mac =
      hmac(secret, "atlas-wan/connect", hello, challenge.first(kChallengeMacAt));
  std::memcpy(out.data() + 8, mac.data(), mac.size());
  return out;
}

std::string check_response(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                           std::span<const std::uint8_t, kChallengeBytes> challenge,
                           std::span<const std::uint8_t, kResponseBytes> in) {
  if (auto why = check_hs_prefix(in.data(), kResponseType, "handshake response"); !why.empty())
    return why;
  const Mac want = hmac(secret, "atlas-wan/connect", hello, challenge.first(kChallengeMacAt));
  if (CRYPTO_memcmp(want.data(), in.data() + 8, want.size()) != 0)
    return "the connector's HMAC-SHA256 proof does not match this job's secret (a different job, "
           "or not an atlas peer)";
  return {};
}

void random_bytes(std::span<std::uint8_t> out) {
  if (out.size() > static_cast<std::size_t>(INT_MAX) ||
      RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    throw Error(ExitCode::Comm, "OpenSSL RAND_bytes failed: no secure random bytes for the WAN secret");
}

}  // namespace atlas::wan
