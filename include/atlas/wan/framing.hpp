// SPDX-License-Identifier: MIT
// Wire format of the multirail WAN transport: the per-connection handshake (HMAC-SHA256 over the
// per-job secret and two nonces) and the fixed frame header (magic, version, message id, offset,
// length, CRC32C). Pure encode/decode and crypto helpers; no sockets, no state machines.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "atlas/core/crc32c.hpp"

namespace atlas::wan {

/// Per-job secret shared by every rank of one job (made by world rank 0 with RAND_bytes).
using Secret = std::array<std::uint8_t, 32>;
/// Random per-connection nonce.
using Nonce = std::array<std::uint8_t, 32>;
/// HMAC-SHA256 tag.
using Mac = std::array<std::uint8_t, 32>;

inline constexpr std::uint32_t kFrameMagic = 0x574C5441;      ///< "ATLW" little-endian
inline constexpr std::uint32_t kHandshakeMagic = 0x48574C41;  ///< "ALWH" little-endian
inline constexpr std::uint8_t kWireVersion = 1;
inline constexpr std::size_t kHeaderBytes = 56;

// ---- CRC32C ----

/// CRC32C of `data` (include/atlas/core/crc32c.hpp; the checkpoints use the same one).
using ::atlas::crc32c;

// ---- frame header ----

enum class FrameType : std::uint8_t {
  Data = 1,    ///< a chunk of a message: msg_id, offset, total, tag, tag_seq; payload follows
  Ack = 2,     ///< cumulative count of reliable frames received on this connection (in `offset`)
  Rts = 3,     ///< request to send: msg_id, total, tag, tag_seq (message larger than the credit)
  Cts = 4,     ///< clear to send msg_id: its irecv is posted
  Credit = 5,  ///< cumulative eager bytes the receiver has delivered (in `total`)
  Bye = 6,     ///< the sender shuts its transport down; no more frames on this connection
  Pad = 7,     ///< warm-up bytes on a new connection (zeros, checked and dropped); acknowledged
};

/// Data frame flag: the message is sent eagerly (within the receiver's credit), not after a CTS.
inline constexpr std::uint16_t kFlagEager = 1;

/// One frame header. Little-endian on the wire, `kHeaderBytes` long, protected by its own CRC.
struct FrameHeader {
  FrameType type = FrameType::Data;
  std::uint16_t flags = 0;
  std::uint32_t length = 0;       ///< payload bytes following the header
  std::uint32_t payload_crc = 0;  ///< crc32c of the payload (0 when length is 0)
  std::uint64_t msg_id = 0;       ///< per (sender, receiver) message number, from 0
  std::uint64_t offset = 0;       ///< payload offset in the message (Ack: frames received)
  std::uint64_t total = 0;        ///< message bytes (Credit: cumulative bytes)
  std::uint64_t tag_seq = 0;      ///< index of this message among the sender's sends with `tag`
  std::int32_t tag = 0;           ///< user tag
};

/// Writes `h` (with magic, version and header CRC) into `out`.
void encode_header(const FrameHeader& h, std::span<std::uint8_t, kHeaderBytes> out);

/// Decodes and checks magic, version, header CRC, frame type and `length <= max_frame_bytes`.
/// Returns "" and fills `h` when the header is sound, else a one-line reason (no peer/rail: the
/// caller adds those).
std::string decode_header(std::span<const std::uint8_t, kHeaderBytes> in,
                          std::uint64_t max_frame_bytes, FrameHeader& h);

// ---- handshake ----
// connector -> acceptor: Hello (who I am, who I think you are, which rail, my nonce)
// acceptor -> connector: Challenge (acceptor's nonce and its proof over Hello + nonce)
// connector -> acceptor: Response (connector's proof). Frames may follow immediately.

inline constexpr std::size_t kHelloBytes = 72;
inline constexpr std::size_t kChallengeBytes = 88;
inline constexpr std::size_t kResponseBytes = 40;

struct Hello {
  std::int32_t from_rank = -1;       ///< world rank of the connector
  std::int32_t to_rank = -1;         ///< world rank the connector wants
  std::uint32_t rail = 0;            ///< rail index of this connection
  std::uint32_t rails = 0;           ///< rails per peer on the connector (must match)
  std::uint64_t chunk_bytes = 0;     ///< connector's chunk size (its data frames' length)
  std::uint64_t credit_bytes = 0;    ///< eager bytes the connector accepts unasked
  Nonce nonce{};
};

struct Challenge {
  std::uint64_t chunk_bytes = 0;
  std::uint64_t credit_bytes = 0;
  Nonce nonce{};
  Mac mac{};  ///< HMAC(secret, "atlas-wan/accept" | hello | challenge fields before mac)
};

struct Response {
  Mac mac{};  ///< HMAC(secret, "atlas-wan/connect" | hello | challenge fields before mac)
};

std::array<std::uint8_t, kHelloBytes> encode_hello(const Hello& h);
/// Returns "" and fills `h`, or the reason the bytes are not a Hello.
std::string decode_hello(std::span<const std::uint8_t, kHelloBytes> in, Hello& h);

/// Builds the acceptor's Challenge (computes its MAC) for the received Hello bytes.
std::array<std::uint8_t, kChallengeBytes> encode_challenge(
    const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello, std::uint64_t chunk_bytes,
    std::uint64_t credit_bytes, const Nonce& nonce);
/// Connector side: "" when the Challenge is well formed and its MAC proves the acceptor knows
/// `secret`; else the reason.
std::string check_challenge(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                            std::span<const std::uint8_t, kChallengeBytes> in, Challenge& c);

/// Builds the connector's Response for the exchanged Hello and Challenge bytes.
std::array<std::uint8_t, kResponseBytes> encode_response(
    const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
    std::span<const std::uint8_t, kChallengeBytes> challenge);
/// Acceptor side: "" when the Response proves the connector knows `secret`, else the reason.
std::string check_response(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                           std::span<const std::uint8_t, kChallengeBytes> challenge,
                           std::span<const std::uint8_t, kResponseBytes> in);

/// Cryptographically random bytes (OpenSSL RAND_bytes). Throws atlas::Error (Comm) on failure.
void random_bytes(std::span<std::uint8_t> out);

}  // namespace atlas::wan
