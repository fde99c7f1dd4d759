// SPDX-License-Identifier: MIT
// Frame header and handshake encoding (CRC32C: core/crc32c.hpp), HMAC-SHA256, HKDF-SHA256 and
// the AES-256-GCM frame tags (OpenSSL EVP).
#include "atlas/wan/framing.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
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

HmacTag hmac(const Secret& secret, const char* label, std::span<const std::uint8_t> a,
         std::span<const std::uint8_t> b) {
  std::vector<std::uint8_t> msg;
  const std::size_t label_len = std::strlen(label);
  msg.reserve(label_len + a.size() + b.size());
  msg.insert(msg.end(), label, label + label_len);
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  HmacTag out{};
  unsigned int out_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
           out.data(), &out_len) == nullptr ||
      out_len != out.size())
    ATLAS_THROW(Comm, "WAN handshake: HMAC-SHA256 failed inside OpenSSL");
  return out;
}

[[noreturn]] void openssl_failed(const char* what) {
  ATLAS_THROW(Comm, fmt::format("WAN frame authentication: {} failed inside OpenSSL", what));
}

// The 96-bit GCM nonce of frame `n`: part 0 = its payload, part 1 = its header.
std::array<unsigned char, 12> frame_iv(std::uint64_t n, std::uint32_t part) {
  std::array<unsigned char, 12> iv{};
  put_u64(iv.data(), n);
  put_u32(iv.data() + 8, part);
  return iv;
}

constexpr std::size_t kPiece = std::size_t{1} << 30;  // EVP lengths are ints

void gcm_aad(EVP_CIPHER_CTX* c, const std::uint8_t* p, std::size_t n, bool enc) {
  while (n > 0) {
    const std::size_t k = std::min(n, kPiece);
    int len = 0;
    const int ok = enc ? EVP_EncryptUpdate(c, nullptr, &len, p, static_cast<int>(k))
                       : EVP_DecryptUpdate(c, nullptr, &len, p, static_cast<int>(k));
    if (ok != 1) openssl_failed("AES-GCM (additional data)");
    p += k;
    n -= k;
  }
}

void gcm_crypt(EVP_CIPHER_CTX* c, const std::uint8_t* in, std::uint8_t* out, std::size_t n, bool enc) {
  while (n > 0) {
    const std::size_t k = std::min(n, kPiece);
    int len = 0;
    const int ok = enc ? EVP_EncryptUpdate(c, out, &len, in, static_cast<int>(k))
                       : EVP_DecryptUpdate(c, out, &len, in, static_cast<int>(k));
    if (ok != 1 || len != static_cast<int>(k)) openssl_failed("AES-GCM (payload)");
    in += k;
    out += k;
    n -= k;
  }
}

}  // namespace

const char* auth_name(FrameAuth a) {
  switch (a) {
    case FrameAuth::Crc: return "crc";
    case FrameAuth::Mac: return "mac";
    case FrameAuth::Encrypt: return "encrypt";
  }
  return "?";
}

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
  std::memset(p + kPayloadTagAt, 0, 2 * kTagBytes);  // set by FrameSealer::seal
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

std::array<std::uint8_t, kHelloBytes> encode_hello(const Secret& secret, const Hello& h) {
  std::array<std::uint8_t, kHelloBytes> out{};
  std::uint8_t* p = out.data();
  put_hs_prefix(p, kHelloType);
  p[6] = static_cast<std::uint8_t>(h.auth);
  put_u32(p + 8, static_cast<std::uint32_t>(h.from_rank));
  put_u32(p + 12, static_cast<std::uint32_t>(h.to_rank));
  put_u32(p + 16, h.rail);
  put_u32(p + 20, h.rails);
  put_u64(p + 24, h.chunk_bytes);
  put_u64(p + 32, h.credit_bytes);
  std::memcpy(p + 40, h.nonce.data(), h.nonce.size());
  const HmacTag mac = hmac(secret, "atlas-wan/hello", std::span(out).first(kHelloMacAt), {});
  std::memcpy(p + kHelloMacAt, mac.data(), mac.size());
  return out;
}

std::string decode_hello(std::span<const std::uint8_t, kHelloBytes> in, Hello& h) {
  const std::uint8_t* p = in.data();
  if (auto why = check_hs_prefix(p, kHelloType, "handshake hello"); !why.empty()) return why;
  if (p[6] > static_cast<std::uint8_t>(FrameAuth::Encrypt))
    return fmt::format("handshake hello names an unknown wan.auth mode {}", p[6]);
  h.auth = static_cast<FrameAuth>(p[6]);
  h.from_rank = static_cast<std::int32_t>(get_u32(p + 8));
  h.to_rank = static_cast<std::int32_t>(get_u32(p + 12));
  h.rail = get_u32(p + 16);
  h.rails = get_u32(p + 20);
  h.chunk_bytes = get_u64(p + 24);
  h.credit_bytes = get_u64(p + 32);
  std::memcpy(h.nonce.data(), p + 40, h.nonce.size());
  std::memcpy(h.mac.data(), p + kHelloMacAt, h.mac.size());
  return {};
}

std::string check_hello(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> in) {
  const HmacTag want = hmac(secret, "atlas-wan/hello", in.first(kHelloMacAt), {});
  if (CRYPTO_memcmp(want.data(), in.data() + kHelloMacAt, want.size()) != 0)
    return "the hello's HMAC-SHA256 does not match the secret this rank shares with the rank it "
           "names (a different job or wan.key_file, or not an atlas peer)";
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
  const HmacTag mac = hmac(secret, "atlas-wan/accept", hello, std::span(out).first(kChallengeMacAt));
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
  const HmacTag want = hmac(secret, "atlas-wan/accept", hello, in.first(kChallengeMacAt));
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
  const HmacTag mac =
      hmac(secret, "atlas-wan/connect", hello, challenge.first(kChallengeMacAt));
  std::memcpy(out.data() + 8, mac.data(), mac.size());
  return out;
}

std::string check_response(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                           std::span<const std::uint8_t, kChallengeBytes> challenge,
                           std::span<const std::uint8_t, kResponseBytes> in) {
  if (auto why = check_hs_prefix(in.data(), kResponseType, "handshake response"); !why.empty())
    return why;
  const HmacTag want = hmac(secret, "atlas-wan/connect", hello, challenge.first(kChallengeMacAt));
  if (CRYPTO_memcmp(want.data(), in.data() + 8, want.size()) != 0)
    return "the connector's HMAC-SHA256 proof does not match this job's secret (a different job, "
           "or not an atlas peer)";
  return {};
}

// ---- frame authentication ----

void hkdf_sha256(std::span<const std::uint8_t> ikm, std::span<const std::uint8_t> salt,
                 std::span<const std::uint8_t> info, std::span<std::uint8_t> out) {
  struct CtxFree {
    void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
  };
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> c(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  std::size_t len = out.size();
  if (!c || EVP_PKEY_derive_init(c.get()) <= 0 || EVP_PKEY_CTX_set_hkdf_md(c.get(), EVP_sha256()) <= 0 ||
      (!salt.empty() &&
       EVP_PKEY_CTX_set1_hkdf_salt(c.get(), salt.data(), static_cast<int>(salt.size())) <= 0) ||
      EVP_PKEY_CTX_set1_hkdf_key(c.get(), ikm.data(), static_cast<int>(ikm.size())) <= 0 ||
      (!info.empty() &&
       EVP_PKEY_CTX_add1_hkdf_info(c.get(), info.data(), static_cast<int>(info.size())) <= 0) ||
      EVP_PKEY_derive(c.get(), out.data(), &len) <= 0 || len != out.size())
    openssl_failed("HKDF-SHA256");
}

void wipe_secret(std::span<std::uint8_t> bytes) noexcept {
  if (!bytes.empty()) OPENSSL_cleanse(bytes.data(), bytes.size());
}

FrameKeys derive_frame_keys(const Secret& secret, std::span<const std::uint8_t, kHelloBytes> hello,
                            std::span<const std::uint8_t, kChallengeBytes> challenge,
                            FrameAuth auth, bool connector) {
  // Salt: the connector's nonce (hello bytes 40..72) and the acceptor's (challenge bytes 24..56),
  // so every connection has keys of its own.
  std::array<std::uint8_t, 64> salt{};
  std::memcpy(salt.data(), hello.data() + 40, 32);
  std::memcpy(salt.data() + 32, challenge.data() + 24, 32);
  auto key = [&](const char* direction, FrameKey& k) {
    const std::string info =
        fmt::format("atlas-wan/v{} frames {} auth={}", kWireVersion, direction, auth_name(auth));
    hkdf_sha256(secret, salt,
                std::span(reinterpret_cast<const std::uint8_t*>(info.data()), info.size()), k);
  };
  // Written in place: no copy of a key outlives the FrameKeys that wipes it.
  FrameKeys keys;
  key("connector->acceptor", connector ? keys.send : keys.recv);
  key("acceptor->connector", connector ? keys.recv : keys.send);
  return keys;
}

struct FrameSealer::Ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

FrameSealer::FrameSealer(FrameAuth auth, const FrameKey& key) : m_auth(auth) {
  if (m_auth == FrameAuth::Crc) return;
  m_ctx = std::make_unique<Ctx>();
  if (!m_ctx->c || EVP_EncryptInit_ex(m_ctx->c, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1)
    openssl_failed("AES-256-GCM key setup");
}

FrameSealer::~FrameSealer() = default;

void FrameSealer::seal(std::span<std::uint8_t, kHeaderBytes> hdr, std::span<const std::uint8_t> payload,
                       std::uint8_t* cipher_out, bool corrupt_payload_tag) {
  if (m_auth == FrameAuth::Crc) return;
  EVP_CIPHER_CTX* c = m_ctx->c;
  const std::uint64_t n = m_count++;
  int len = 0;
  std::uint8_t* ptag = hdr.data() + kPayloadTagAt;
  std::memset(ptag, 0, kTagBytes);
  if (!payload.empty()) {
    const auto iv = frame_iv(n, 0);
    if (EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) != 1) openssl_failed("AES-GCM nonce");
    if (m_auth == FrameAuth::Encrypt) gcm_crypt(c, payload.data(), cipher_out, payload.size(), true);
    else gcm_aad(c, payload.data(), payload.size(), true);
    if (EVP_EncryptFinal_ex(c, nullptr, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTagBytes, ptag) != 1)
      openssl_failed("AES-GCM (payload tag)");
    if (corrupt_payload_tag) ptag[0] ^= 0x01;
  }
  const auto iv = frame_iv(n, 1);
  if (EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) != 1) openssl_failed("AES-GCM nonce");
  gcm_aad(c, hdr.data(), kHeaderTagAt, true);
  if (EVP_EncryptFinal_ex(c, nullptr, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTagBytes, hdr.data() + kHeaderTagAt) != 1)
    openssl_failed("AES-GCM (header tag)");
}

struct FrameOpener::Ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

FrameOpener::FrameOpener(FrameAuth auth, const FrameKey& key) : m_auth(auth) {
  if (m_auth == FrameAuth::Crc) return;
  m_ctx = std::make_unique<Ctx>();
  if (!m_ctx->c || EVP_DecryptInit_ex(m_ctx->c, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1)
    openssl_failed("AES-256-GCM key setup");
}

FrameOpener::~FrameOpener() = default;

std::string FrameOpener::open_header(std::span<const std::uint8_t, kHeaderBytes> hdr) {
  if (m_auth == FrameAuth::Crc) {
    ++m_count;
    return {};
  }
  EVP_CIPHER_CTX* c = m_ctx->c;
  const auto iv = frame_iv(m_count, 1);
  if (EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) != 1) openssl_failed("AES-GCM nonce");
  gcm_aad(c, hdr.data(), kHeaderTagAt, false);
  std::array<std::uint8_t, kTagBytes> tag{};
  std::memcpy(tag.data(), hdr.data() + kHeaderTagAt, kTagBytes);
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) != 1)
    openssl_failed("AES-GCM (set tag)");
  int len = 0;
  if (EVP_DecryptFinal_ex(c, nullptr, &len) <= 0)
    return fmt::format("frame #{} of this connection fails its header authentication tag (AES-256-GCM, "
                       "wan.auth = {}): changed, replayed, reordered or injected on the way",
                       m_count, auth_name(m_auth));
  std::memcpy(m_payload_tag.data(), hdr.data() + kPayloadTagAt, kTagBytes);
  ++m_count;
  return {};
}

std::string FrameOpener::open_payload(std::uint8_t* data, std::size_t bytes) {
  if (m_auth == FrameAuth::Crc || bytes == 0) return {};
  EVP_CIPHER_CTX* c = m_ctx->c;
  const auto iv = frame_iv(m_count - 1, 0);
  if (EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) != 1) openssl_failed("AES-GCM nonce");
  if (m_auth == FrameAuth::Encrypt) gcm_crypt(c, data, data, bytes, false);
  else gcm_aad(c, data, bytes, false);
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTagBytes, m_payload_tag.data()) != 1)
    openssl_failed("AES-GCM (set tag)");
  int len = 0;
  if (EVP_DecryptFinal_ex(c, nullptr, &len) <= 0)
    return fmt::format("payload of frame #{} of this connection ({} bytes) fails its authentication "
                       "tag (AES-256-GCM, wan.auth = {}): changed on the way",
                       m_count - 1, bytes, auth_name(m_auth));
  return {};
}

void random_bytes(std::span<std::uint8_t> out) {
  if (out.size() > static_cast<std::size_t>(INT_MAX) ||
      RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    ATLAS_THROW(Comm, "OpenSSL RAND_bytes failed: no secure random bytes for the WAN transport (nonces, keys)");
}

}  // namespace atlas::wan
