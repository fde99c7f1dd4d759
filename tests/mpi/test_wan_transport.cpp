// SPDX-License-Identifier: MIT
// make_transport over MPI: world ranks split into two DCs (first half, second half), every rank
// exchanging verifiable payloads with every rank of the other DC, for both transports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "atlas/core/error.hpp"
#include "atlas/wan/transport.hpp"
#include "unit/test_wan_payload.hpp"

namespace atlas::wan {
namespace {

using ::testing::HasSubstr;
using testing::check_payload;
using testing::fill_payload;

struct Split {
  int my_dc = 0;
  std::vector<int> peers;  // every rank of the other DC
};

Split split_two_dcs(const mpi::Comm& world) {
  const int half = world.size() / 2;
  Split s;
  s.my_dc = world.rank() < half ? 0 : 1;
  for (int r = 0; r < world.size(); ++r)
    if ((r < half ? 0 : 1) != s.my_dc) s.peers.push_back(r);
  return s;
}

WanCfg wan_cfg(WanTransport kind) {
  WanCfg w;
  w.transport = kind;
  w.rails = 4;
  w.chunk_bytes = 64 * 1024;
  w.max_frame_bytes = 64u << 20;
  w.recv_timeout_s = 20;
  w.connect_timeout_s = 10;
  return w;
}

ClusterCfg two_dcs() {
  ClusterCfg c;
  c.dcs = {"east", "west"};
  c.bind_hosts = {"127.0.0.1", "127.0.0.2"};  // one listen address per DC, both loopback
  return c;
}

class WanTransportMpi : public ::testing::TestWithParam<WanTransport> {};

TEST_P(WanTransportMpi, PayloadsCrossTwoDcsIntact) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs two DCs (np >= 2)";
  const Split s = split_two_dcs(world);
  auto t = make_transport(wan_cfg(GetParam()), two_dcs(), world, s.my_dc, s.peers);
  EXPECT_STREQ(t->name(), GetParam() == WanTransport::Mpi ? "mpi" : "multirail");

  const std::vector<std::size_t> sizes = {0, 1, 65536, 65537, (1u << 20) + 3, 3u << 20};
  constexpr std::uint64_t kSeed = 77;
  const int me = world.rank();
  std::vector<std::vector<std::uint8_t>> out, in;
  std::vector<Handle> handles;
  std::vector<std::pair<int, std::size_t>> what;  // (peer, message) of each receive buffer
  for (int p : s.peers)
    for (std::size_t m = 0; m < sizes.size(); ++m) {
      in.emplace_back(sizes[m], std::uint8_t{0});
      what.emplace_back(p, m);
      handles.push_back(t->irecv(p, static_cast<int>(m % 2), in.back().data(), sizes[m]));
    }
  for (int p : s.peers)
    for (std::size_t m = 0; m < sizes.size(); ++m) {
      out.emplace_back(sizes[m]);
      fill_payload(out.back().data(), sizes[m], kSeed, me, p, m);
      handles.push_back(t->isend(p, static_cast<int>(m % 2), out.back().data(), sizes[m]));
    }
  wait_all(*t, handles);
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto [p, m] = what[i];
    EXPECT_EQ(check_payload(in[i].data(), sizes[m], kSeed, p, me, m), SIZE_MAX)
        << "from rank " << p << " message " << m;
  }
  std::uint64_t total = 0;
  for (auto b : sizes) total += b;
  const TransportStats st = t->stats();
  ASSERT_EQ(st.peers.size(), s.peers.size());
  for (const auto& ps : st.peers) {
    EXPECT_EQ(ps.bytes_sent, total) << "to rank " << ps.peer;
    EXPECT_EQ(ps.bytes_received, total) << "from rank " << ps.peer;
    EXPECT_EQ(ps.messages_received, sizes.size());
  }
  world.barrier();  // every rank done before transports say goodbye
}

INSTANTIATE_TEST_SUITE_P(BothTransports, WanTransportMpi,
                         ::testing::Values(WanTransport::Multirail, WanTransport::Mpi),
                         [](const ::testing::TestParamInfo<WanTransport>& i) {
                           return std::string(to_string(i.param));
                         });

TEST(WanTransportMpi, OneSidedPeerListIsACollectiveError) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs np >= 2";
  std::vector<int> peers;
  if (world.rank() == 0) peers = {1};  // rank 1 does not list rank 0
  try {
    auto t = make_transport(wan_cfg(WanTransport::Multirail), two_dcs(), world,
                            world.rank() == 0 ? 0 : 1, peers);
    FAIL() << "expected an error on every rank";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0 lists WAN peer 1 but rank 1 does not list 0"));
  }
}

}  // namespace
}  // namespace atlas::wan
