// SPDX-License-Identifier: MIT
// Wire format of the WAN transport: CRC32C, frame header checks, handshake proofs, frame keys
// and the AES-256-GCM frame tags (order, replay, direction, connection), HKDF.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "atlas/wan/framing.hpp"

namespace atlas::wan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(WanCrc32c, MatchesTheCastagnoliCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);  // the standard CRC-32C check value
  EXPECT_EQ(crc32c(s, 0), 0u);
  std::uint8_t zeros[32] = {};
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  // Continued in pieces (the data loader's stream CRC): the same as in one go, from any cut.
  for (std::size_t cut = 0; cut <= 9; ++cut)
    EXPECT_EQ(crc32c_extend(crc32c(s, cut), s + cut, 9 - cut), 0xE3069283u) << "cut at " << cut;
  EXPECT_EQ(crc32c_extend(0, s, 9), 0xE3069283u);
}

FrameHeader sample() {
  FrameHeader h;
  h.type = FrameType::Data;
  h.flags = kFlagEager;
  h.length = 4096;
  h.payload_crc = 0xDEADBEEF;
  h.msg_id = 123456789012ull;
  h.offset = 1ull << 33;
  h.total = (1ull << 34) + 5;
  h.tag_seq = 77;
  h.tag = 42;
  return h;
}

TEST(WanFrameHeader, RoundTripsEveryField) {
  std::array<std::uint8_t, kHeaderBytes> buf{};
  encode_header(sample(), buf);
  FrameHeader h;
  ASSERT_EQ(decode_header(buf, 1u << 20, h), "");
  EXPECT_EQ(h.type, FrameType::Data);
  EXPECT_EQ(h.flags, kFlagEager);
  EXPECT_EQ(h.length, 4096u);
  EXPECT_EQ(h.payload_crc, 0xDEADBEEFu);
  EXPECT_EQ(h.msg_id, 123456789012ull);
  EXPECT_EQ(h.offset, 1ull << 33);
  EXPECT_EQ(h.total, (1ull << 34) + 5);
  EXPECT_EQ(h.tag_seq, 77u);
  EXPECT_EQ(h.tag, 42);
}

TEST(WanFrameHeader, RejectsBadMagicVersionCrcTypeAndLength) {
  std::array<std::uint8_t, kHeaderBytes> good{};
  encode_header(sample(), good);
  FrameHeader h;
  auto bad = good;
  bad[0] ^= 0xFF;
  EXPECT_THAT(decode_header(bad, 1u << 20, h), HasSubstr("bad frame magic"));
  bad = good;
  bad[4] = 9;
  EXPECT_THAT(decode_header(bad, 1u << 20, h), HasSubstr("wire version 9"));
  bad = good;
  bad[20] ^= 1;  // a message-id bit: caught by the header CRC
  EXPECT_THAT(decode_header(bad, 1u << 20, h), HasSubstr("header CRC32C mismatch"));
  EXPECT_THAT(decode_header(good, 4095, h),
              HasSubstr("frame length 4096 bytes exceeds wan.max_frame_bytes = 4095"));
  FrameHeader ack;
  ack.type = FrameType::Ack;
  ack.length = 3;
  std::array<std::uint8_t, kHeaderBytes> buf{};
  encode_header(ack, buf);
  EXPECT_THAT(decode_header(buf, 1u << 20, h), HasSubstr("carries a 3-byte payload"));
}

TEST(WanFrameHeader, WarmUpPadFramesCarryAPayloadOtherControlFramesDoNot) {
  std::array<std::uint8_t, kHeaderBytes> buf{};
  FrameHeader h;
  FrameHeader pad;
  pad.type = FrameType::Pad;
  pad.length = 65536;
  encode_header(pad, buf);
  ASSERT_EQ(decode_header(buf, 1u << 20, h), "");
  EXPECT_EQ(h.type, FrameType::Pad);
  EXPECT_EQ(h.length, 65536u);
  EXPECT_THAT(decode_header(buf, 65535, h), HasSubstr("exceeds wan.max_frame_bytes = 65535"));
  for (FrameType t : {FrameType::Ack, FrameType::Rts, FrameType::Cts, FrameType::Credit, FrameType::Bye}) {
    FrameHeader c;
    c.type = t;
    c.length = 1;
    encode_header(c, buf);
    EXPECT_THAT(decode_header(buf, 1u << 20, h), HasSubstr("carries a 1-byte payload"))
        << "type " << static_cast<int>(t);
  }
  buf[5] = 8;  // one past the last type (the header CRC is checked first: recompute it)
  const std::uint32_t crc = crc32c(buf.data(), 52);
  std::memcpy(buf.data() + 52, &crc, 4);  // little-endian host
  EXPECT_THAT(decode_header(buf, 1u << 20, h), HasSubstr("unknown frame type 8"));
}

TEST(WanHandshake, ProvesTheSecretBothWays) {
  Secret secret{};
  random_bytes(secret);
  Hello hello;
  hello.from_rank = 3;
  hello.to_rank = 9;
  hello.rail = 2;
  hello.rails = 4;
  hello.chunk_bytes = 65536;
  hello.credit_bytes = 1 << 26;
  random_bytes(hello.nonce);
  const auto hb = encode_hello(secret, hello);
  Hello back;
  ASSERT_EQ(decode_hello(hb, back), "");
  EXPECT_EQ(check_hello(secret, hb), "");
  EXPECT_EQ(back.from_rank, 3);
  EXPECT_EQ(back.to_rank, 9);
  EXPECT_EQ(back.rail, 2u);
  EXPECT_EQ(back.rails, 4u);
  EXPECT_EQ(back.chunk_bytes, 65536u);
  EXPECT_EQ(back.nonce, hello.nonce);

  Nonce nonce{};
  random_bytes(nonce);
  const auto cb = encode_challenge(secret, hb, 1024, 2048, nonce);
  Challenge ch;
  ASSERT_EQ(check_challenge(secret, hb, cb, ch), "");
  EXPECT_EQ(ch.chunk_bytes, 1024u);
  EXPECT_EQ(ch.credit_bytes, 2048u);
  const auto rb = encode_response(secret, hb, cb);
  EXPECT_EQ(check_response(secret, hb, cb, rb), "");

  Secret other = secret;
  other[0] ^= 1;
  EXPECT_THAT(check_challenge(other, hb, cb, ch), HasSubstr("does not match this job's secret"));
  EXPECT_THAT(check_response(other, hb, cb, rb), HasSubstr("does not match this job's secret"));
  // A proof made for another rail (a replayed or redirected connection) fails too.
  Hello moved = hello;
  moved.rail = 3;
  const auto mb = encode_hello(secret, moved);
  EXPECT_THAT(check_challenge(secret, mb, cb, ch), HasSubstr("does not match"));
  EXPECT_THAT(check_response(secret, mb, cb, rb), HasSubstr("does not match"));
}

// ---- frame authentication ----

struct KeyedPair {
  FrameKeys connector, acceptor;
};

KeyedPair keys_for(const Secret& secret, FrameAuth auth) {
  Hello hello;
  hello.auth = auth;
  hello.rails = 1;
  random_bytes(hello.nonce);
  const auto hb = encode_hello(secret, hello);
  Nonce nonce{};
  random_bytes(nonce);
  const auto cb = encode_challenge(secret, hb, 4096, 4096, nonce);
  return {derive_frame_keys(secret, hb, cb, auth, true), derive_frame_keys(secret, hb, cb, auth, false)};
}

std::array<std::uint8_t, kHeaderBytes> header_of(std::uint32_t len) {
  FrameHeader h = sample();
  h.length = len;
  std::array<std::uint8_t, kHeaderBytes> b{};
  encode_header(h, b);
  return b;
}

TEST(WanFrameAuth, KeysDifferPerDirectionAndConnectionAndMatchAcrossTheTwoSides) {
  Secret secret{};
  random_bytes(secret);
  const KeyedPair k = keys_for(secret, FrameAuth::Mac);
  EXPECT_EQ(k.connector.send, k.acceptor.recv);
  EXPECT_EQ(k.connector.recv, k.acceptor.send);
  EXPECT_NE(k.connector.send, k.connector.recv);
  const KeyedPair other = keys_for(secret, FrameAuth::Mac);  // new nonces: a new connection
  EXPECT_NE(k.connector.send, other.connector.send);
}

TEST(WanFrameAuth, SealedFramesOpenInOrderAndCarryTheirPayload) {
  Secret secret{};
  random_bytes(secret);
  for (FrameAuth auth : {FrameAuth::Mac, FrameAuth::Encrypt}) {
    const KeyedPair k = keys_for(secret, auth);
    FrameSealer tx(auth, k.connector.send);
    FrameOpener rx(auth, k.acceptor.recv);
    for (std::uint32_t len : {0u, 1u, 4096u, 100000u}) {
      std::vector<std::uint8_t> payload(len);
      for (std::uint32_t i = 0; i < len; ++i) payload[i] = static_cast<std::uint8_t>(i * 7 + 1);
      auto hdr = header_of(len);
      std::vector<std::uint8_t> wire(len);
      tx.seal(hdr, payload, wire.data());
      if (auth == FrameAuth::Mac) {
        wire = payload;
      } else if (len > 16) {
        EXPECT_NE(wire, payload) << "encrypt sends ciphertext";
      }
      ASSERT_EQ(rx.open_header(hdr), "") << auth_name(auth) << " " << len;
      ASSERT_EQ(rx.open_payload(wire.data(), wire.size()), "") << auth_name(auth) << " " << len;
      EXPECT_EQ(wire, payload) << "decrypted in place";
      FrameHeader h;
      EXPECT_EQ(decode_header(hdr, 1u << 20, h), "") << "the tags leave the fields alone";
    }
    EXPECT_EQ(tx.count(), 4u);
    EXPECT_EQ(rx.count(), 4u);
  }
}

TEST(WanFrameAuth, ChangedReplayedReorderedOrForeignFramesFailTheirTags) {
  Secret secret{};
  random_bytes(secret);
  const FrameAuth auth = FrameAuth::Mac;
  const KeyedPair k = keys_for(secret, auth);
  std::vector<std::uint8_t> payload(5000, 3);
  auto sealed = [&](FrameSealer& tx) {
    auto hdr = header_of(static_cast<std::uint32_t>(payload.size()));
    tx.seal(hdr, payload, nullptr);
    return hdr;
  };
  {  // a header field changed (and its CRC recomputed): the header tag fails
    FrameSealer tx(auth, k.connector.send);
    FrameOpener rx(auth, k.acceptor.recv);
    auto hdr = sealed(tx);
    hdr[16] ^= 1;
    const std::uint32_t crc = crc32c(hdr.data(), 52);
    std::memcpy(hdr.data() + 52, &crc, 4);
    EXPECT_THAT(rx.open_header(hdr), AllOf(HasSubstr("frame #0 of this connection fails its header "
                                                     "authentication tag"),
                                           HasSubstr("wan.auth = mac")));
  }
  {  // a payload byte changed: the header holds, the payload tag fails
    FrameSealer tx(auth, k.connector.send);
    FrameOpener rx(auth, k.acceptor.recv);
    auto hdr = sealed(tx);
    ASSERT_EQ(rx.open_header(hdr), "");
    auto bad = payload;
    bad[4000] ^= 0x80;
    EXPECT_THAT(rx.open_payload(bad.data(), bad.size()),
                HasSubstr("payload of frame #0 of this connection (5000 bytes) fails its "
                          "authentication tag"));
  }
  {  // replayed, then reordered
    FrameSealer tx(auth, k.connector.send);
    FrameOpener rx(auth, k.acceptor.recv);
    const auto f0 = sealed(tx);
    const auto f1 = sealed(tx);
    ASSERT_EQ(rx.open_header(f0), "");
    EXPECT_THAT(rx.open_header(f0), HasSubstr("frame #1 of this connection fails"));
    FrameOpener rx2(auth, k.acceptor.recv);
    EXPECT_THAT(rx2.open_header(f1), HasSubstr("frame #0 of this connection fails"));
  }
  {  // a frame of the other direction, or of another connection
    FrameSealer back(auth, k.acceptor.send);
    FrameOpener rx(auth, k.acceptor.recv);
    EXPECT_THAT(rx.open_header(sealed(back)), HasSubstr("fails its header authentication tag"));
    const KeyedPair other = keys_for(secret, auth);
    FrameSealer foreign(auth, other.connector.send);
    FrameOpener rx2(auth, k.acceptor.recv);
    EXPECT_THAT(rx2.open_header(sealed(foreign)), HasSubstr("fails its header authentication tag"));
  }
  {  // the test hook: a wrong payload tag under a valid header tag
    FrameSealer tx(auth, k.connector.send);
    FrameOpener rx(auth, k.acceptor.recv);
    auto hdr = header_of(static_cast<std::uint32_t>(payload.size()));
    tx.seal(hdr, payload, nullptr, /*corrupt_payload_tag=*/true);
    ASSERT_EQ(rx.open_header(hdr), "");
    EXPECT_THAT(rx.open_payload(payload.data(), payload.size()), HasSubstr("fails its authentication tag"));
  }
}

TEST(WanFrameAuth, CrcModeChecksNothingAndLeavesTheTagsZero) {
  FrameSealer tx(FrameAuth::Crc, FrameKey{});
  FrameOpener rx(FrameAuth::Crc, FrameKey{});
  std::vector<std::uint8_t> payload(100, 1);
  auto hdr = header_of(100);
  tx.seal(hdr, payload, nullptr);
  EXPECT_EQ(std::count(hdr.begin() + kPayloadTagAt, hdr.end(), 0), static_cast<long>(2 * kTagBytes));
  payload[3] ^= 1;
  EXPECT_EQ(rx.open_header(hdr), "");
  EXPECT_EQ(rx.open_payload(payload.data(), payload.size()), "");
}

TEST(WanHandshake, HelloCarriesTheAuthModeAndRejectsAnUnknownOne) {
  Hello hello;
  hello.auth = FrameAuth::Encrypt;
  auto hb = encode_hello(Secret{}, hello);
  Hello back;
  ASSERT_EQ(decode_hello(hb, back), "");
  EXPECT_EQ(back.auth, FrameAuth::Encrypt);
  hb[6] = 7;
  EXPECT_THAT(decode_hello(hb, back), HasSubstr("unknown wan.auth mode 7"));
}

// The Hello proves the pair secret by itself (the acceptor checks it before it answers): a wrong
// secret, any changed byte (field or MAC), or a MAC made for another message type fails.
TEST(WanHandshake, HelloMacProvesTheSecretAndCoversEveryByte) {
  Secret secret{};
  random_bytes(secret);
  Hello hello;
  hello.from_rank = 0;
  hello.to_rank = 1;
  hello.rails = 2;
  random_bytes(hello.nonce);
  const auto hb = encode_hello(secret, hello);
  ASSERT_EQ(check_hello(secret, hb), "");
  Hello back;
  ASSERT_EQ(decode_hello(hb, back), "");
  EXPECT_EQ(std::memcmp(back.mac.data(), hb.data() + kHelloMacAt, back.mac.size()), 0);
  Secret other = secret;
  other[31] ^= 0x80;
  EXPECT_THAT(check_hello(other, hb),
              AllOf(HasSubstr("hello's HMAC-SHA256 does not match the secret"),
                    HasSubstr("a different job or wan.key_file")));
  for (std::size_t i = 0; i < kHelloBytes; ++i) {
    auto bad = hb;
    bad[i] ^= 0x01;
    EXPECT_NE(check_hello(secret, bad), "") << "byte " << i << " is not covered";
  }
  // Not the Challenge's or the Response's MAC: those are domain-separated from it.
  const auto cb = encode_challenge(secret, hb, 1, 1, hello.nonce);
  auto spliced = hb;
  std::memcpy(spliced.data() + kHelloMacAt, cb.data() + 56, 32);
  EXPECT_NE(check_hello(secret, spliced), "");
}

TEST(WanHkdf, MatchesRfc5869TestCase1) {
  std::vector<std::uint8_t> ikm(22, 0x0b);
  std::vector<std::uint8_t> salt = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c};
  std::vector<std::uint8_t> info = {0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9};
  std::array<std::uint8_t, 42> okm{};
  hkdf_sha256(ikm, salt, info, okm);
  const std::uint8_t want[42] = {0x3c, 0xb2, 0x5f, 0x25, 0xfa, 0xac, 0xd5, 0x7a, 0x90, 0x43, 0x4f,
                                 0x64, 0xd0, 0x36, 0x2f, 0x2a, 0x2d, 0x2d, 0x0a, 0x90, 0xcf, 0x1a,
                                 0x5a, 0x4c, 0x5d, 0xb0, 0x2d, 0x56, 0xec, 0xc4, 0xc5, 0xbf, 0x34,
                                 0x00, 0x72, 0x08, 0xd5, 0xb8, 0x87, 0x18, 0x58, 0x65};
  EXPECT_EQ(std::memcmp(okm.data(), want, 42), 0);
}

TEST(WanHandshake, RejectsForeignBytes) {
  std::array<std::uint8_t, kHelloBytes> junk{};
  std::memcpy(junk.data(), "GET / HTTP/1.1\r\n", 16);
  Hello h;
  EXPECT_THAT(decode_hello(junk, h), HasSubstr("not an atlas WAN peer"));
}

}  // namespace
}  // namespace atlas::wan
