// SPDX-License-Identifier: MIT
// Wire format of the multirail WAN transport: the per-connection handshake (HMAC-SHA256 over the
// pair secret: the Hello's own, then over both nonces), the fixed frame header (magic, version, message id, offset,
// length, CRC32C, two AES-256-GCM tags) and the per-connection frame keys and tags (HKDF-SHA256,
// AES-256-GCM through OpenSSL's EVP API). Pure encode/decode and crypto; no sockets, no state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "atlas/core/crc32c.hpp"

namespace atlas::wan {

/// Secret shared by the two ranks of one WAN pair (make_transport derives it from an X25519
/// exchange and, when set, the job's wan.key_file; tests may use any random value).
using Secret = std::array<std::uint8_t, 32>;
/// Random per-connection nonce.
using Nonce = std::array<std::uint8_t, 32>;
/// HMAC-SHA256 tag.
using HmacTag = std::array<std::uint8_t, 32>;

inline constexpr std::uint32_t kFrameMagic = 0x574C5441;      ///< "ATLW" little-endian
inline constexpr std::uint32_t kHandshakeMagic = 0x48574C41;  ///< "ALWH" little-endian
inline constexpr std::uint8_t kWireVersion = 3;
/// Header layout: [0, 52) fields, [52, 56) header CRC32C, [56, 72) payload tag, [72, 88) header
/// tag. The tags are zero (and not checked) under FrameAuth::Crc.
inline constexpr std::size_t kHeaderBytes = 88;
inline constexpr std::size_t kTagBytes = 16;
inline constexpr std::size_t kPayloadTagAt = 56;
inline constexpr std::size_t kHeaderTagAt = 72;

/// How each frame is protected after the handshake (wan.auth).
enum class FrameAuth : std::uint8_t {
  Crc = 0,      ///< CRC32C only: protects against accidents, not against anyone on the path
  Mac = 1,      ///< AES-256-GCM tag (GMAC) over header and payload; payload in clear
  Encrypt = 2,  ///< AES-256-GCM: header authenticated, payload encrypted and authenticated
};
/// "crc" | "mac" | "encrypt"
const char* auth_name(FrameAuth a);

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
  std::uint32_t payload_crc = 0;  ///< crc32c of the payload (FrameAuth::Crc; else 0, unchecked)
  std::uint64_t msg_id = 0;       ///< per (sender, receiver) message number, from 0
  std::uint64_t offset = 0;       ///< payload offset in the message (Ack: frames received)
  std::uint64_t total = 0;        ///< message bytes (Credit: cumulative bytes)
  std::uint64_t tag_seq = 0;      ///< index of this message among the sender's sends with `tag`
  std::int32_t tag = 0;           ///< user tag
};

/// Writes `h` (with magic, version and header CRC; tags zero) into `out`.
void encode_header(const FrameHeader& h, std::span<std::uint8_t, kHeaderBytes> out);

/// Decodes and checks magic, version, header CRC, frame type and `length <= max_frame_bytes`.
/// Returns "" and fills `h` when the header is sound, else a one-line reason (no peer/rail: the
/// caller adds those).
std::string decode_header(std::span<const std::uint8_t, kHeaderBytes> in,
                          std::uint64_t max_frame_bytes, FrameHeader& h);

// ---- handshake ----
// connector -> acceptor: Hello (who I am, who I think you are, which rail, my nonce, and an
//                      HMAC over all that: proof that I know our pair secret, from byte one)
// acceptor -> connector: Challenge (acceptor's nonce and its proof over Hello + nonce)
// connector -> acceptor: Response (connector's proof). Frames may follow immediately.
// The Hello's MAC lets the acceptor tell a real peer from a stranger before it answers (a
// stranger cannot push a real peer's pending connection out, see multirail.cpp make_room); it
// does not prove freshness (a recorded Hello can be replayed): the Challenge's fresh nonce does.

inline constexpr std::size_t kHelloBytes = 104;
inline constexpr std::size_t kHelloMacAt = 72;  ///< Hello bytes [0, 72) are covered by its MAC
inline constexpr std::size_t kChallengeBytes = 88;
inline constexpr std::size_t kResponseBytes = 40;

struct Hello {
  FrameAuth auth = FrameAuth::Mac;   ///< connector's wan.auth (must match the acceptor's)
  std::int32_t from_rank = -1;       ///< world rank of the connector
  std::int32_t to_rank = -1;         ///< world rank the connector wants
  std::uint32_t rail = 0;            ///< rail index of this connection
  std::uint32_t rails = 0;           ///< rails per peer on the connector (must match)
  std::uint64_t chunk_bytes = 0;     ///< connector's chunk size (its data frames' length)
  std::uint64_t credit_bytes = 0;    ///< eager bytes the connector accepts unasked
  Nonce nonce{};
  HmacTag mac{};  ///< HMAC(secret, "atlas-wan/hello" | hello bytes before mac); set by decode
};

struct Challenge {
  std::uint64_t chunk_bytes = 0;
  std::uint64_t credit_bytes = 0;
  Nonce nonce{};
  HmacTag mac{};  ///< HMAC(secret, "atlas-wan/accept" | hello | challenge fields before mac)
};

struct Response {
  HmacTag mac{};  ///< HMAC(secret, "atlas-wan/connect" | hello | challenge fields before mac)
};

/// Encodes `h` (its `mac` is ignored) and appends its MAC under `secret`, the pair's.
std::array<std::uint8_t, kHelloBytes> encode_hello(const Secret& secret, const Hello& h);
/// Returns "" and fills `h` (`mac` included), or the reason the bytes are not a Hello. Does not
/// check the MAC: `h.from_rank` says whose secret check_hello needs.
std::string decode_hello(std::span<const std::uint8_t, kHelloBytes> in, Hello& h);
/// Acceptor side, before anything else is done for the connection: "" when the Hello's MAC
/// proves its sender knows `secret` (constant-time compare), else the reason.
std::string check_hello(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> in);

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

// ---- frame authentication ----
// After the handshake each connection has two AES-256-GCM keys, one per direction, derived with
// HKDF-SHA256 from the pair secret (salt: both nonces; info: direction, auth mode, wire version).
// Both sides count every frame of a direction (Ack and Bye too) from 0; frame n's header tag uses
// the 96-bit nonce (n, 1) and its payload tag (n, 0). A frame that was changed, dropped, replayed,
// reordered or taken from another connection fails its tag.

using FrameKey = std::array<std::uint8_t, 32>;

/// Overwrites key material with zeros in a way the compiler cannot drop (OPENSSL_cleanse): what
/// holds a secret wipes it when it ends, so a core dump or a reused page shows none.
void wipe_secret(std::span<std::uint8_t> bytes) noexcept;

struct FrameKeys {
  FrameKey send{};  ///< this side's outgoing frames
  FrameKey recv{};  ///< the peer's frames
  ~FrameKeys() {
    wipe_secret(send);
    wipe_secret(recv);
  }
};

/// Keys of one connection, from the exchanged Hello and Challenge bytes (their nonces).
/// `connector`: this side sent the Hello. Throws Error (Comm) when OpenSSL fails.
FrameKeys derive_frame_keys(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                            std::span<const std::uint8_t, kChallengeBytes> challenge,
                            FrameAuth auth, bool connector);

/// Seals the frames of one direction of one connection, in the order they go on the wire.
/// Not thread-safe. Under FrameAuth::Crc it does nothing.
class FrameSealer {
 public:
  FrameSealer(FrameAuth auth, const FrameKey& key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  /// Seals the next frame: `hdr` (from encode_header) gets the payload tag and then the header
  /// tag (which covers the payload tag). Encrypt: the payload's ciphertext goes to `cipher_out`
  /// (payload.size() bytes; may not alias `payload`); else `cipher_out` is unused.
  /// `corrupt_payload_tag` (test hook): the payload tag is made wrong before the header tag
  /// covers it, as if the payload had been changed on the way.
  void seal(std::span<std::uint8_t, kHeaderBytes> hdr, std::span<const std::uint8_t> payload,
            std::uint8_t* cipher_out, bool corrupt_payload_tag = false);
  /// Frames sealed so far.
  [[nodiscard]] std::uint64_t count() const { return m_count; }

 private:
  FrameAuth m_auth;
  struct Ctx;
  std::unique_ptr<Ctx> m_ctx;
  std::uint64_t m_count = 0;
};

/// Checks the frames of one direction of one connection, in arrival order. Not thread-safe.
/// Under FrameAuth::Crc every check passes.
class FrameOpener {
 public:
  FrameOpener(FrameAuth auth, const FrameKey& key);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  /// Checks the next frame's header tag: "" when it holds (the frame number then advances and
  /// the header's payload tag is kept for open_payload), else the reason.
  std::string open_header(std::span<const std::uint8_t, kHeaderBytes> hdr);
  /// Checks (Encrypt: and decrypts in place) the payload of the frame whose header
  /// open_header accepted last: "" or the reason.
  std::string open_payload(std::uint8_t* data, std::size_t bytes);
  /// Frames whose header was accepted so far.
  [[nodiscard]] std::uint64_t count() const { return m_count; }

 private:
  FrameAuth m_auth;
  struct Ctx;
  std::unique_ptr<Ctx> m_ctx;
  std::uint64_t m_count = 0;
  std::array<std::uint8_t, kTagBytes> m_payload_tag{};
};

/// HKDF-SHA256 (RFC 5869) of `ikm` with `salt` and `info` into `out` (at most 8160 bytes).
/// Throws Error (Comm) when OpenSSL fails.
void hkdf_sha256(std::span<const std::uint8_t> ikm, std::span<const std::uint8_t> salt,
                 std::span<const std::uint8_t> info, std::span<std::uint8_t> out);

/// Cryptographically random bytes (OpenSSL RAND_bytes). Throws atlas::Error (Comm) on failure.
void random_bytes(std::span<std::uint8_t> out);

}  // namespace atlas::wan
