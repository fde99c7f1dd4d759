// SPDX-License-Identifier: MIT
// Host backend basics: Buffer ownership, copies, element-wise ops, reductions, GEMM in every
// transpose combination against a double-precision reference, thread-count independence, and
// the backend factory (CUDA refused with a rebuild hint unless a factory is registered).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "atlas/core/error.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "test_model_util.hpp"

namespace atlas::device {
namespace {

using testutil::download;
using testutil::random_vec;
using testutil::upload;

TEST(HostBackend, AllocIsZeroedAlignedAndMoveOnly) {
  auto be = make_host_backend(2);
  Buffer b = be->alloc(1000);
  EXPECT_EQ(b.bytes(), 1000U);
  EXPECT_EQ(b.floats(), 250U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 64, 0U);
  EXPECT_EQ(b.backend(), be.get());
  for (float v : download(*be, b)) ASSERT_EQ(v, 0.0F);
  void* ptr = b.data();
  Buffer moved = std::move(b);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b.bytes(), 0U);
  EXPECT_EQ(moved.data(), ptr);
  EXPECT_TRUE(be->alloc(0).empty());
}

TEST(HostBackend, UploadCopyDownloadRoundTrip) {
  auto be = make_host_backend(1);
  const auto host = random_vec(777, 1);
  Buffer a = upload(*be, host);
  Buffer b = be->alloc_floats(host.size());
  be->copy(b.data(), a.data(), host.size() * sizeof(float));
  EXPECT_EQ(download(*be, b), host);
}

TEST(HostBackend, ElementwiseOpsAndSquaredNorm) {
  auto be = make_host_backend(2);
  const std::size_t n = 100'003;  // crosses several reduction blocks
  const auto x = random_vec(n, 2);
  const auto y = random_vec(n, 3);
  Buffer bx = upload(*be, x);
  Buffer by = upload(*be, y);
  be->add(bx.f32(), bx.f32(), by.f32(), n);  // aliasing out == a is allowed
  auto sum = download(*be, bx);
  for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(sum[i], x[i] + y[i]) << i;
  be->scale(bx.f32(), -2.0F, n);
  sum = download(*be, bx);
  double want = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(sum[i], -2.0F * (x[i] + y[i])) << i;
    want += static_cast<double>(sum[i]) * sum[i];
  }
  EXPECT_NEAR(be->sq_norm(bx.f32(), n), want, 1e-9 * want);
  be->fill(bx.f32(), 0.5F, n);
  EXPECT_DOUBLE_EQ(be->sq_norm(bx.f32(), n), 0.25 * static_cast<double>(n));
}

TEST(HostBackend, GemmMatchesDoubleReferenceForAllTransposesAndStrides) {
  auto be = make_host_backend(2);
  const int m = 7, n = 5, k = 6;
  const int pad = 3;  // leading dimensions larger than the logical width
  for (Trans ta : {Trans::No, Trans::Yes}) {
    for (Trans tb : {Trans::No, Trans::Yes}) {
      const int a_rows = ta == Trans::Yes ? k : m, a_cols = ta == Trans::Yes ? m : k;
      const int b_rows = tb == Trans::Yes ? n : k, b_cols = tb == Trans::Yes ? k : n;
      const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
      const auto a = random_vec(static_cast<std::size_t>(a_rows * lda), 10);
      const auto b = random_vec(static_cast<std::size_t>(b_rows * ldb), 11);
      const auto c0 = random_vec(static_cast<std::size_t>(m * ldc), 12);
      Buffer ba = upload(*be, a), bb = upload(*be, b), bc = upload(*be, c0);
      be->gemm(ta, tb, m, n, k, 0.5F, ba.f32(), lda, bb.f32(), ldb, 1.0F, bc.f32(), ldc);
      const auto c = download(*be, bc);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double acc = 0.0;
          for (int p = 0; p < k; ++p) {
            const double av = ta == Trans::Yes ? a[static_cast<std::size_t>(p * lda + i)]
                                               : a[static_cast<std::size_t>(i * lda + p)];
            const double bv = tb == Trans::Yes ? b[static_cast<std::size_t>(j * ldb + p)]
                                               : b[static_cast<std::size_t>(p * ldb + j)];
            acc += av * bv;
          }
          const double want = 0.5 * acc + c0[static_cast<std::size_t>(i * ldc + j)];
          EXPECT_NEAR(c[static_cast<std::size_t>(i * ldc + j)], want, 1e-5)
              << "ta " << (ta == Trans::Yes) << " tb " << (tb == Trans::Yes) << " at " << i
              << "," << j;
        }
        for (int j = n; j < ldc; ++j) {  // padding untouched
          EXPECT_EQ(c[static_cast<std::size_t>(i * ldc + j)],
                    c0[static_cast<std::size_t>(i * ldc + j)]);
        }
      }
    }
  }
}

TEST(HostBackend, BiasAddAndBiasGradient) {
  auto be = make_host_backend(2);
  const int rows = 9, cols = 70;  // more than one column block
  const auto x = random_vec(static_cast<std::size_t>(rows * cols), 20);
  const auto bias = random_vec(static_cast<std::size_t>(cols), 21);
  Buffer bx = upload(*be, x), bb = upload(*be, bias);
  be->add_bias(bx.f32(), bb.f32(), rows, cols);
  const auto y = download(*be, bx);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      ASSERT_EQ(y[i], x[i] + bias[static_cast<std::size_t>(c)]);
    }
  }
  be->bias_grad(bb.f32(), bx.f32(), rows, cols);  // accumulates onto the bias values
  const auto g = download(*be, bb);
  for (int c = 0; c < cols; ++c) {
    double want = bias[static_cast<std::size_t>(c)];
    for (int r = 0; r < rows; ++r) want += y[static_cast<std::size_t>(r * cols + c)];
    EXPECT_NEAR(g[static_cast<std::size_t>(c)], want, 1e-5) << c;
  }
}

// The loss of a row is log(sum exp(z - max)) - (z[t] - max), however far below the max the
// target's logit is: -log of the normalised probability, floored at 1e-30, capped it at 69.08, so a
// diverging model's loss looked bounded. The probabilities (here written over the logits, as the
// model calls it) are unchanged.
TEST(HostBackend, CrossEntropyIsNotCappedWhenTheTargetsProbabilityUnderflows) {
  auto be = make_host_backend(1);
  const int vocab = 4;
  const std::vector<float> logits = {0.0F, -200.0F, 1.0F, -1.0F,   // target 1: 200+ nats down
                                     2.0F, 0.5F, -3.0F, 0.25F};    // target 0: the max
  const std::vector<std::int32_t> targets = {1, 0};
  Buffer z = upload(*be, logits);
  Buffer t = testutil::upload_ids(*be, targets);
  Buffer losses = be->alloc_floats(2);
  be->softmax_xent_forward(losses.f32(), z.f32(), z.f32(), t.i32(), 2, vocab);
  const auto got = download(*be, losses);
  auto want = [&](int r, int target) {
    const float* row = logits.data() + r * vocab;
    const double m = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - m);
    return std::log(sum) - (row[target] - m);
  };
  EXPECT_NEAR(got[0], want(0, 1), 1e-4);
  EXPECT_GT(got[0], 200.0F);
  EXPECT_NEAR(got[1], want(1, 0), 1e-6);
  const auto p = download(*be, z);
  EXPECT_EQ(p[1], 0.0F);  // underflowed, as before: the gradient p - onehot is right
  EXPECT_NEAR(p[2], std::exp(-want(0, 2)), 1e-6);  // the row's max: 1 / sum
}

TEST(HostBackend, EveryKernelGivesTheSameBitsWithOneAndThreeThreads) {
  // Shapes above the parallel threshold, so the 3-thread backend really runs OpenMP regions.
  auto one = make_host_backend(1);
  auto three = make_host_backend(3);
  const int batch = 4, seq = 48, heads = 4, hd = 16, c = heads * hd, vocab = 96;
  const int rows = batch * seq;
  const std::size_t nc = static_cast<std::size_t>(rows) * c;
  const auto x = random_vec(nc, 30, -2.0F, 2.0F);
  const auto dy = random_vec(nc, 31);
  const auto w = random_vec(static_cast<std::size_t>(c), 32, 0.5F, 1.5F);
  const auto qkv = random_vec(3 * nc, 33);
  const auto logits = random_vec(static_cast<std::size_t>(rows) * vocab, 34, -4.0F, 4.0F);
  const auto big = random_vec(300'000, 35);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37) % 96);
  std::vector<std::vector<float>> results;
  for (Backend* be : {one.get(), three.get()}) {
    std::vector<float> all;
    auto keep = [&](const Buffer& b) {
      const auto v = download(*be, b);
      all.insert(all.end(), v.begin(), v.end());
    };
    Buffer bx = upload(*be, x), bdy = upload(*be, dy), bw = upload(*be, w);
    Buffer out = be->alloc_floats(nc), mean = be->alloc_floats(rows), rstd = be->alloc_floats(rows),
           din = be->alloc_floats(nc), dw = be->alloc_floats(c), db = be->alloc_floats(c);
    be->layernorm_forward(out.f32(), mean.f32(), rstd.f32(), bx.f32(), bw.f32(), bw.f32(), rows,
                          c);
    be->layernorm_backward(din.f32(), dw.f32(), db.f32(), bdy.f32(), bx.f32(), bw.f32(),
                           mean.f32(), rstd.f32(), rows, c);
    be->bias_grad(db.f32(), bdy.f32(), rows, c);
    for (const Buffer* b : {&out, &din, &dw, &db}) keep(*b);

    Buffer bq = upload(*be, qkv), att = be->alloc_floats(nc), dq = be->alloc_floats(3 * nc);
    Buffer saved = be->alloc_floats(be->attention_saved_floats(batch, seq, heads, hd));
    be->attention_forward(att.f32(), saved.f32(), bq.f32(), batch, seq, heads, hd, nullptr);
    be->attention_backward(dq.f32(), bdy.f32(), bq.f32(), att.f32(), saved.f32(), batch, seq,
                           heads, hd, nullptr);
    keep(att);
    keep(dq);

    Buffer bids = testutil::upload_ids(*be, ids), wte = upload(*be, random_vec(96 * 64, 36));
    Buffer dwte = be->alloc_floats(96 * 64), dwpe = be->alloc_floats(nc / batch);
    be->embedding_forward(out.f32(), bids.i32(), wte.f32(), bx.f32(), batch, seq, c);
    be->embedding_backward(dwte.f32(), dwpe.f32(), bdy.f32(), bids.i32(), batch, seq, c);
    for (const Buffer* b : {&out, &dwte, &dwpe}) keep(*b);

    Buffer z = upload(*be, logits), losses = be->alloc_floats(rows);
    be->softmax_xent_forward(losses.f32(), z.f32(), z.f32(), bids.i32(), rows, vocab);
    keep(losses);
    be->softmax_xent_backward(z.f32(), z.f32(), bids.i32(), rows, vocab, 0.5F);
    keep(z);

    Buffer g = upload(*be, big), p = upload(*be, big), m = be->alloc_floats(big.size()),
           v = be->alloc_floats(big.size());
    be->gelu_forward(g.f32(), g.f32(), big.size());
    be->gelu_backward(g.f32(), p.f32(), g.f32(), big.size());
    be->adamw_update(p.f32(), g.f32(), m.f32(), v.f32(), big.size(), AdamWArgs{.lr = 0.01F});
    for (const Buffer* b : {&g, &p, &m, &v}) keep(*b);
    all.push_back(static_cast<float>(be->sq_norm(p.f32(), big.size())));
    results.push_back(all);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_TRUE(results[0] == results[1]) << "bitwise different results with 1 and 3 threads";
}

TEST(BackendFactory, HostIsAlwaysAvailable) {
  DeviceCfg cfg;
  cfg.backend = atlas::Backend::Host;
  cfg.threads = 3;
  auto be = make_backend(cfg);
  EXPECT_EQ(be->kind(), atlas::Backend::Host);
  EXPECT_TRUE(be->host_accessible());
  EXPECT_THAT(be->describe(), ::testing::HasSubstr("3 threads"));
  EXPECT_TRUE(backend_available(atlas::Backend::Host));
}

TEST(BackendFactory, CudaWithoutTheCudaBuildIsAConfigErrorWithAHint) {
  ASSERT_FALSE(backend_available(atlas::Backend::Cuda)) << "this test binary has no CUDA library";
  DeviceCfg cfg;
  cfg.backend = atlas::Backend::Cuda;
  try {
    (void)make_backend(cfg);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("built without CUDA"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("-DATLAS_ENABLE_CUDA=ON"));
  }
}

TEST(BackendFactory, RegisteredFactoryIsUsedAndCanBeRemoved) {
  static int calls = 0;
  register_backend_factory(atlas::Backend::Cuda, [](const DeviceCfg& c) {
    ++calls;
    return make_host_backend(c.threads);
  });
  DeviceCfg cfg;
  cfg.backend = atlas::Backend::Cuda;
  cfg.threads = 1;
  auto be = make_backend(cfg);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(be, nullptr);
  register_backend_factory(atlas::Backend::Cuda, nullptr);
  EXPECT_FALSE(backend_available(atlas::Backend::Cuda));
  EXPECT_THROW((void)make_backend(cfg), ConfigError);
}

TEST(BackendFactory, AutoThreadsSplitTheCoresBetweenLocalRanks) {
  EXPECT_EQ(resolve_host_threads(5), 5);
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string saved_value = saved ? saved : "";
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  EXPECT_EQ(resolve_host_threads(0), hw);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(hw * 4).c_str(), 1);
  EXPECT_EQ(resolve_host_threads(0), 1);  // never below one thread
  if (saved) ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", saved_value.c_str(), 1);
  else ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

// The emulated WAN puts each DC in a namespace that Open MPI takes for a node: one rank per
// "node" there must still count every rank sharing these cores (run_emulated.sh exports it).
TEST(BackendFactory, HostRanksOverridesTheNodeLocalSize) {
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const char* saved_local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string local_value = saved_local ? saved_local : "";
  ASSERT_EQ(std::getenv("ATLAS_HOST_RANKS"), nullptr) << "the test environment sets ATLAS_HOST_RANKS";
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  ::setenv("ATLAS_HOST_RANKS", std::to_string(hw).c_str(), 1);
  EXPECT_EQ(resolve_host_threads(0), 1);  // hw ranks on hw cores: one thread each, not hw
  // A value that is not a rank count is the user's to fix: it fell through to the local size (and
  // 4294967297 was cast to 1) silently.
  for (const char* bad : {"not-a-number", "4x", "0", "4294967297"}) {
    ::setenv("ATLAS_HOST_RANKS", bad, 1);
    try {
      (void)resolve_host_threads(0);
      ADD_FAILURE() << "ATLAS_HOST_RANKS = " << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string("ATLAS_HOST_RANKS = '") + bad + "' is not a rank count"));
    }
  }
  ::unsetenv("ATLAS_HOST_RANKS");
  if (saved_local) ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", local_value.c_str(), 1);
  else ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

// Oversubscribed CPU hosts run under SCHED_BATCH (no wake-up preemption between ranks); an
// undersubscribed one keeps its policy; device.sched_batch = false / true override.
TEST(HostScheduling, BatchOnlyWhenRanksOutnumberTheCores) {
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ASSERT_EQ(std::getenv("ATLAS_HOST_RANKS"), nullptr);
  const int before = ::sched_getscheduler(0);
  ASSERT_NE(before, SCHED_BATCH) << "the test starts under the default policy";
  sched_param p{};
  ::setenv("ATLAS_HOST_RANKS", std::to_string(hw).c_str(), 1);
  EXPECT_EQ(prepare_host_scheduling(), "");
  EXPECT_EQ(::sched_getscheduler(0), before);
  ::setenv("ATLAS_HOST_RANKS", std::to_string(4 * hw).c_str(), 1);
  EXPECT_EQ(prepare_host_scheduling(SchedBatch::Off), "");
  EXPECT_EQ(::sched_getscheduler(0), before);
  const std::string note = prepare_host_scheduling();
  EXPECT_NE(note.find(std::to_string(4 * hw) + " ranks share " + std::to_string(hw)), std::string::npos) << note;
  EXPECT_EQ(::sched_getscheduler(0), SCHED_BATCH);
  EXPECT_EQ(host_scheduling_note(), note);
  ::unsetenv("ATLAS_HOST_RANKS");
  ASSERT_EQ(::sched_setscheduler(0, before, &p), 0);  // back to the default for the other tests
}

// device.sched_batch reaches the process through make_backend: true switches to SCHED_BATCH even
// with cores to spare, false switches back; auto leaves main's choice alone.
TEST(HostScheduling, DeckKeyReachesMakeBackend) {
  const int before = ::sched_getscheduler(0);
  ASSERT_NE(before, SCHED_BATCH) << "the test starts under the default policy";
  DeviceCfg cfg;
  cfg.threads = 1;
  cfg.sched_batch = SchedBatch::On;
  (void)make_backend(cfg);
  EXPECT_EQ(::sched_getscheduler(0), SCHED_BATCH);
  EXPECT_NE(host_scheduling_note().find("SCHED_BATCH"), std::string::npos) << host_scheduling_note();
  cfg.sched_batch = SchedBatch::Auto;
  (void)make_backend(cfg);
  EXPECT_EQ(::sched_getscheduler(0), SCHED_BATCH);
  cfg.sched_batch = SchedBatch::Off;
  (void)make_backend(cfg);
  EXPECT_EQ(::sched_getscheduler(0), before);
  EXPECT_EQ(host_scheduling_note(), "");
}

// The deck's switch is applied after MPI_Init and the BLAS pool started their threads, so it must
// reach threads that already run, not only the caller (sched_setscheduler changes one thread).
TEST(HostScheduling, DeckKeyReachesThreadsStartedBefore) {
  const int before = ::sched_getscheduler(0);
  ASSERT_NE(before, SCHED_BATCH) << "the test starts under the default policy";
  std::atomic<int> ask{0}, seen{-1};
  std::thread early([&] {  // started before make_backend, like MPI's progress thread
    for (int asked = 0; asked < 2;) {
      if (ask.load() > asked) {
        ++asked;
        seen.store(::sched_getscheduler(0));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const auto policy_of_early_thread = [&](int round) {
    seen.store(-1);
    ask.store(round);
    while (seen.load() < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return seen.load();
  };
  DeviceCfg cfg;
  cfg.threads = 1;
  cfg.sched_batch = SchedBatch::On;
  (void)make_backend(cfg);
  EXPECT_EQ(policy_of_early_thread(1), SCHED_BATCH);
  cfg.sched_batch = SchedBatch::Off;
  (void)make_backend(cfg);
  EXPECT_EQ(policy_of_early_thread(2), before);
  early.join();
  EXPECT_EQ(::sched_getscheduler(0), before);
}

// Ranks on one machine (same boot id) in several autogroups that fill its hardware threads get a
// run-header note; one group, too few ranks, another machine's ranks or autogrouping off: none.
TEST(HostScheduling, AutogroupNoteOnlyForSeveralGroupsFillingTheMachine) {
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto ranks = [](int n, const std::string& machine, const std::vector<std::string>& groups) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back(machine + " /autogroup-" + groups[static_cast<std::size_t>(i) % groups.size()]);
    return v;
  };
  const auto two_groups = ranks(hw, "boot-a", {"7", "9"});
  const std::string note = autogroup_note(two_groups, 0);
  if (hw >= 2) {
    EXPECT_NE(note.find("sched_autogroup_enabled = 1"), std::string::npos) << note;
    EXPECT_NE(note.find(fmt::format("the {} ranks on this machine", hw)), std::string::npos) << note;
    EXPECT_NE(note.find("in 2 session groups"), std::string::npos) << note;
    EXPECT_EQ(note.back(), '\n');
  }
  EXPECT_EQ(autogroup_note(ranks(hw, "boot-a", {"7"}), 0), "");                      // one group
  EXPECT_EQ(autogroup_note(ranks(std::max(1, hw - 1), "boot-a", {"7", "9"}), 0), "");  // cores to spare
  std::vector<std::string> elsewhere = ranks(hw, "boot-b", {"7", "9"});
  elsewhere[0] = "boot-a /autogroup-7";  // rank 0 alone on its machine
  EXPECT_EQ(autogroup_note(elsewhere, 0), "");
  std::vector<std::string> off = two_groups;
  off[0] = "";  // autogrouping off where rank 0 runs
  EXPECT_EQ(autogroup_note(off, 0), "");
}

}  // namespace
}  // namespace atlas::device
