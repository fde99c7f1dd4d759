// SPDX-License-Identifier: MIT
// Wire format of the WAN transport: CRC32C, frame header checks, handshake proofs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "atlas/wan/framing.hpp"

namespace atlas::wan {
namespace {

using ::testing::HasSubstr;

TEST(WanCrc32c, MatchesTheCastagnoliCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);  // the standard CRC-32C check value
  EXPECT_EQ(crc32c(s, 0), 0u);
  std::uint8_t zeros[32] = {};
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
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
  const auto hb = encode_hello(hello);
  Hello back;
  ASSERT_EQ(decode_hello(hb, back), "");
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
  const auto mb = encode_hello(moved);
  EXPECT_THAT(check_challenge(secret, mb, cb, ch), HasSubstr("does not match"));
  EXPECT_THAT(check_response(secret, mb, cb, rb), HasSubstr("does not match"));
}

TEST(WanHandshake, RejectsForeignBytes) {
  std::array<std::uint8_t, kHelloBytes> junk{};
  std::memcpy(junk.data(), "GET / HTTP/1.1\r\n", 16);
  Hello h;
  EXPECT_THAT(decode_hello(junk, h), HasSubstr("not an atlas WAN peer"));
}

}  // namespace
}  // namespace atlas::wan
