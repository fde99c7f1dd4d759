// SPDX-License-Identifier: MIT
// The job key file (wan.key_file) and the pair secrets: every way a key file is refused, with the
// fix in the message, and what a pair secret depends on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <new>
#include <fstream>

#include "atlas/core/error.hpp"
#include "atlas/wan/framing.hpp"
#include "atlas/wan/multirail.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::wan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class KeyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/atlas_wan_keys_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    m_dir = dir;
  }
  void TearDown() override { std::filesystem::remove_all(m_dir); }
  std::string make(const std::string& name, std::size_t bytes, mode_t mode) {
    const std::string path = m_dir + "/" + name;
    std::ofstream(path, std::ios::binary) << std::string(bytes, 'k');
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string error_of(const std::string& path) {
    try {
      read_key_file(path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::string m_dir;
};

TEST_F(KeyFile, AnOwnerOnlyFileIsRead) {
  const std::string p = make("ok.key", 32, 0600);
  EXPECT_EQ(read_key_file(p), std::vector<std::uint8_t>(32, 'k'));
  EXPECT_EQ(read_key_file(make("ro.key", 4096, 0400)).size(), 4096u);
}

TEST_F(KeyFile, OthersCanReadIt) {
  const std::string p = make("open.key", 32, 0640);
  EXPECT_THAT(error_of(p), AllOf(HasSubstr("wan.key_file = '" + p + "'"),
                                 HasSubstr("its mode 0640 lets other users read or change it"),
                                 HasSubstr("run `chmod 600 " + p + "`")));
}

TEST_F(KeyFile, TooShortOrTooLong) {
  EXPECT_THAT(error_of(make("short.key", 31, 0600)),
              AllOf(HasSubstr("31 bytes; it needs 32 to 65536 random bytes"), HasSubstr("/dev/urandom")));
  EXPECT_THAT(error_of(make("long.key", 65537, 0600)), HasSubstr("65537 bytes; it needs 32 to 65536"));
}

TEST_F(KeyFile, MissingFifoOrDirectory) {
  EXPECT_THAT(error_of(m_dir + "/none.key"),
              AllOf(HasSubstr("cannot open it: No such file or directory"), HasSubstr("umask 077")));
  const std::string fifo = m_dir + "/fifo.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_of(fifo), HasSubstr("not a regular file"));  // and it did not block
  EXPECT_THAT(error_of(m_dir), HasSubstr("not a regular file"));
}

TEST_F(KeyFile, AnotherUsersFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  const std::string p = make("theirs.key", 32, 0600);
  ASSERT_EQ(::chown(p.c_str(), 12345, 12345), 0);
  EXPECT_THAT(error_of(p), AllOf(HasSubstr("it belongs to uid 12345, not to this job's user"),
                                 HasSubstr("make the key file as the user who runs the job")));
}

TEST(WanPairSecret, IsSymmetricAndDependsOnEverythingItBinds) {
  std::array<std::uint8_t, 32> shared{}, pa{}, pb{};
  shared.fill(1);
  pa.fill(2);
  pb.fill(3);
  const std::vector<std::uint8_t> key(32, 9), other_key(32, 8);
  const Secret s = derive_pair_secret(shared, key, 0, pa, 5, pb);
  EXPECT_EQ(derive_pair_secret(shared, key, 5, pb, 0, pa), s) << "both ranks of the pair agree";
  EXPECT_NE(derive_pair_secret(shared, {}, 0, pa, 5, pb), s) << "the key file counts";
  EXPECT_NE(derive_pair_secret(shared, other_key, 0, pa, 5, pb), s) << "another job's key file";
  EXPECT_NE(derive_pair_secret(shared, key, 0, pa, 6, pb), s) << "another pair of ranks";
  auto shared2 = shared;
  shared2[0] ^= 1;
  EXPECT_NE(derive_pair_secret(shared2, key, 0, pa, 5, pb), s) << "another exchange";
  EXPECT_NE(s, shared) << "never the raw X25519 output";
}

// What holds a secret wipes it when it ends (a core dump, a page reused by the next allocation).
// The object is built in raw storage, destroyed, and the storage searched for the secret's bytes.
template <typename T, typename Fill>
bool storage_keeps_after_destruction(Fill fill, const Secret& pattern) {
  alignas(T) std::byte raw[sizeof(T)];
  T* t = new (raw) T();
  fill(*t);
  // A compiler barrier: the stores of `fill` must reach the storage (a plain array's would
  // otherwise be dropped as dead, and the control below would pass for the wrong reason).
  asm volatile("" : : "r"(raw) : "memory");
  t->~T();
  asm volatile("" : : "r"(raw) : "memory");
  const auto* b = reinterpret_cast<const std::uint8_t*>(raw);
  return std::search(b, b + sizeof(T), pattern.begin(), pattern.end()) != b + sizeof(T);
}

TEST(WanSecrets, AreWipedWhenTheirHolderEnds) {
  Secret pattern{};
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(0xA0 + i);
  Secret copy = pattern;
  wipe_secret(copy);
  EXPECT_EQ(copy, Secret{});
  // The check itself finds a secret left behind: a plain array is not wiped.
  EXPECT_TRUE(storage_keeps_after_destruction<Secret>([&](Secret& s) { s = pattern; }, pattern));
  EXPECT_FALSE(storage_keeps_after_destruction<MultirailOptions>([&](MultirailOptions& o) { o.secret = pattern; },
                                                                 pattern));
  EXPECT_FALSE(storage_keeps_after_destruction<FrameKeys>(
      [&](FrameKeys& k) {
        std::copy(pattern.begin(), pattern.end(), k.send.begin());
        std::copy(pattern.begin(), pattern.end(), k.recv.begin());
      },
      pattern));
  // pair_secrets' values live in the map's nodes: the destructor wipes them (wipe_secrets)
  // before the map frees them. A copy (make_transport's options, copied into the transport)
  // keeps its own until it ends.
  MultirailOptions o;
  o.secret = pattern;
  o.pair_secrets[3] = pattern;
  o.pair_secrets[7] = pattern;
  const MultirailOptions kept = o;
  o.wipe_secrets();
  EXPECT_EQ(o.secret, Secret{});
  EXPECT_EQ(o.pair_secrets.at(3), Secret{});
  EXPECT_EQ(o.pair_secrets.at(7), Secret{});
  EXPECT_EQ(kept.pair_secrets.at(3), pattern);
}

}  // namespace
}  // namespace atlas::wan
