// SPDX-License-Identifier: MIT
// The decode worker over real loopback sockets: two "ranks" (each half the layers) send their
// weights, prefill requests split between them, hand off the KV parts and first token; the
// worker's greedy tokens equal the standalone generation. Also a worker that loses a rank before
// Finish fails loudly, and the frame reader rejects corrupt headers.
#include <gmock/gmock.h>
#include <cstring>
#include <limits>
#include <gtest/gtest.h>

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "atlas/bubbletea/decode.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/bubbletea/wire.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::bubbletea {
namespace {

constexpr std::uint64_t kSeed = 5;
const InferShape kShape{4, 16, 2, 40, 29};

wan::Fd connect_to(int port) {
  bool in_progress = false;
  std::string err;
  wan::Fd fd = wan::connect_tcp(wan::resolve("127.0.0.1", port), in_progress, err);
  EXPECT_TRUE(fd.valid()) << err;
  if (in_progress) {
    pollfd p{fd.get(), POLLOUT, 0};
    ::poll(&p, 1, 5000);
  }
  return fd;
}

void send_weights(int fd, const InferenceModel& m, int dc_rank, int dc_size) {
  wire::Hello h;
  h.dc_rank = dc_rank;
  h.dc_size = dc_size;
  h.shape = m.shape();
  h.range = m.range();
  wire::send_frame(fd, wire::Type::Hello, wire::encode(h), 5);
  for (const auto& p : m.params()) {
    std::vector<float> v(p.value.floats());
    m.backend().download(v.data(), p.value.data(), v.size() * 4);
    wire::send_frame(fd, wire::Type::Tensor, wire::encode_tensor(p.name, v), 5);
  }
  wire::send_frame(fd, wire::Type::WeightsDone, {}, 5);
}

TEST(DecodeWorker, TokensAfterKvHandoffEqualStandaloneGeneration) {
  auto be = device::make_host_backend(1);
  int port = 0;
  wan::Fd listener = wan::listen_tcp("127.0.0.1", 0, port);
  DecodeServerOptions opt;
  opt.timeout_s = 20;
  auto server = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return DecodeServer(std::move(l), opt).run();
  });

  std::vector<std::unique_ptr<InferenceModel>> stage;
  std::vector<wan::Fd> fds;
  for (int i = 0; i < 2; ++i) {
    stage.push_back(std::make_unique<InferenceModel>(kShape, split_layers(kShape.layers, 2, i), *be, 8));
    stage.back()->init_random(kSeed, 0.05);
    fds.push_back(connect_to(port));
    send_weights(fds.back().get(), *stage.back(), i, 2);
  }
  wire::Inbox in0;
  ASSERT_EQ(wire::recv_frame(fds[0].get(), in0, 20, "Ready").type, wire::Type::Ready);

  InferenceModel whole(kShape, LayerRange{0, kShape.layers, true, true}, *be, 8);
  whole.init_random(kSeed, 0.05);
  std::map<std::int64_t, std::vector<std::int32_t>> expect;
  const std::vector<int> lengths{5, 8, 19};
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const int p = lengths[r];
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(p));
    for (int i = 0; i < p; ++i)
      prompt[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(model::rng::bits(r + 1, static_cast<std::uint64_t>(i)) % 29);
    const int max_new = 6 + static_cast<int>(r);
    expect[static_cast<std::int64_t>(r)] = generate(whole, prompt, 8, max_new);
    KvCache c0 = stage[0]->make_cache(p), c1 = stage[1]->make_cache(p);
    std::vector<float> act(8 * 16), logits(29);
    int pos = 0;
    for (int n : chunk_sizes(p, 8)) {
      stage[0]->forward(c0, n, prompt.data() + pos, nullptr, act.data(), nullptr);
      stage[1]->forward(c1, n, nullptr, act.data(), nullptr, pos + n == p ? logits.data() : nullptr);
      pos += n;
    }
    // Rank 1 hands off first (the worker waits for every part), then rank 0.
    wire::send_frame(fds[1].get(), wire::Type::Kv, wire::encode_kv(static_cast<std::int64_t>(r), *stage[1], c1), 5);
    wire::FirstToken f;
    f.request = static_cast<std::int64_t>(r);
    f.prompt_tokens = p;
    f.first_token = InferenceModel::argmax(logits);
    f.max_new_tokens = max_new;
    wire::send_frame(fds[1].get(), wire::Type::First, wire::encode(f), 5);
    wire::send_frame(fds[0].get(), wire::Type::Kv, wire::encode_kv(static_cast<std::int64_t>(r), *stage[0], c0), 5);
  }
  // A request whose parts never all arrive is reported as incomplete, not decoded.
  {
    KvCache c0 = stage[0]->make_cache(3);
    std::vector<std::int32_t> prompt{1, 2, 3};
    std::vector<float> act(3 * 16);
    stage[0]->forward(c0, 3, prompt.data(), nullptr, act.data(), nullptr);
    wire::send_frame(fds[0].get(), wire::Type::Kv, wire::encode_kv(99, *stage[0], c0), 5);
  }
  for (auto& fd : fds) wire::send_frame(fd.get(), wire::Type::Finish, {}, 5);

  std::map<std::int64_t, std::vector<std::int32_t>> got;
  while (true) {
    const wire::Frame f = wire::recv_frame(fds[0].get(), in0, 20, "results");
    if (f.type == wire::Type::Done) break;
    ASSERT_EQ(f.type, wire::Type::Result);
    const wire::Result res = wire::decode_result(f.payload);
    EXPECT_GE(res.decode_s, 0.0);
    got[res.request] = res.tokens;
  }
  const DecodeSummary sum = server.get();
  EXPECT_EQ(sum.results, 3);
  EXPECT_EQ(sum.incomplete, 1);
  EXPECT_EQ(got, expect);
}

TEST(DecodeWorker, ARankThatVanishesBeforeFinishIsAnError) {
  auto be = device::make_host_backend(1);
  int port = 0;
  wan::Fd listener = wan::listen_tcp("127.0.0.1", 0, port);
  DecodeServerOptions opt;
  opt.timeout_s = 20;
  auto server = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return DecodeServer(std::move(l), opt).run();
  });
  InferenceModel m(kShape, LayerRange{0, kShape.layers, true, true}, *be, 4);
  {
    wan::Fd fd = connect_to(port);
    send_weights(fd.get(), m, 0, 1);
    wire::Inbox in;
    EXPECT_EQ(wire::recv_frame(fd.get(), in, 20, "Ready").type, wire::Type::Ready);
  }  // closed without Finish
  try {
    (void)server.get();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("closed its connection without Finish"));
  }
}

// The worker shares the training ranks' cores: every one of its threads (OpenBLAS starts a pool
// when the library loads, before main) must run at nice 19 and SCHED_IDLE, or a pool thread at
// nice 0 takes a core from a training rank (seen as 20-170 ms stalls in `perf sched timehist`).
TEST(DecodeWorker, EveryThreadOfTheWorkerRunsAtIdlePriority) {
  WorkerProcess w = WorkerProcess::spawn(ATLAS_DECODE_WORKER_EXE, "127.0.0.1", 2, 19, 10.0);
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(w.pid()) + "/task")) {
    std::ifstream f(task.path() / "stat");
    std::string line;
    std::getline(f, line);
    // Fields after the ")" that ends the command name: state is field 3, nice 19, policy 41.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> fields;
    for (std::string x; rest >> x;) fields.push_back(x);
    ASSERT_GT(fields.size(), 38U) << line;
    EXPECT_EQ(fields[19 - 3], "19") << "thread " << task.path().filename() << " nice";
    EXPECT_EQ(fields[41 - 3], std::to_string(SCHED_IDLE)) << "thread " << task.path().filename() << " policy";
    ++threads;
  }
  EXPECT_GE(threads, 1);
  (void)w.wait(0.1);  // nobody connects: it is stopped
}

TEST(DecodeWorker, TimesOutWhenNoRankConnects) {
  int port = 0;
  wan::Fd listener = wan::listen_tcp("127.0.0.1", 0, port);
  DecodeServerOptions opt;
  opt.timeout_s = 0.3;
  try {
    (void)DecodeServer(std::move(listener), opt).run();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("did not connect and send their weights within"));
  }
}

TEST(Wire, CorruptHeaderIsRejected) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  wan::Fd a(fds[0]), b(fds[1]);
  wire::FrameHeader h;
  h.magic = 0x12345678;
  h.type = 5;
  ASSERT_EQ(::write(a.get(), &h, sizeof h), static_cast<ssize_t>(sizeof h));
  wire::Inbox in;
  in.read_some(b.get());
  EXPECT_THROW((void)in.next(), Error);
  // A truncated payload is reported by the reader.
  wire::Result r;
  r.tokens = {1, 2, 3};
  std::vector<char> p = wire::encode(r);
  p.resize(p.size() - 2);
  EXPECT_THROW((void)wire::decode_result(p), Error);
}

// A count the frame does not hold is refused before the buffer is sized by it (a corrupt frame
// used to make the worker allocate up to 2^64 floats, or 8 GiB of tokens, and die unheard).
TEST(Wire, CountsBeyondTheFrameAreRefusedBeforeAllocating) {
  const std::vector<float> w = {1.5f, -2.0f, 3.25f};
  std::vector<char> t = wire::encode_tensor("blocks.0.w", w);
  const auto [name, values] = wire::decode_tensor(t);
  EXPECT_EQ(name, "blocks.0.w");
  EXPECT_EQ(values, w);
  const std::size_t count_at = sizeof(std::uint32_t) + name.size();
  const std::uint64_t huge = std::uint64_t{1} << 62;
  std::memcpy(t.data() + count_at, &huge, sizeof huge);
  try {
    (void)wire::decode_tensor(t);
    FAIL() << "a tensor frame claiming 2^62 values was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Comm);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("corrupt tensor frame for 'blocks.0.w': 4611686018427387904 values "
                                               "claimed, 12 bytes held"));
  }
  wire::Result r;
  r.tokens = {1, 2, 3};
  std::vector<char> p = wire::encode(r);
  const std::int32_t most = std::numeric_limits<std::int32_t>::max();
  std::memcpy(p.data() + p.size() - 3 * sizeof(std::int32_t) - sizeof most, &most, sizeof most);
  EXPECT_THROW((void)wire::decode_result(p), Error);
}

}  // namespace
}  // namespace atlas::bubbletea
