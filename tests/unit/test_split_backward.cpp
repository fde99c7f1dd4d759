// SPDX-License-Identifier: MIT
// The zero-bubble split of the backward (issue 24 item 5), model and runtime side:
//  - Backend: linear_backward without dweight/dbias (B) plus linear_backward_weight (W) is bit
//    for bit one linear_backward, fp32 and bf16;
//  - StageModel: backward_input + backward_weight, W's deferred past later B's and forwards,
//    give bit for bit backward()'s gradients, grad_in and losses (fp32 and bf16; first, middle
//    and last stage and the one-stage model; one and two chunks), and hold what the docs say;
//  - the misuses (W before its B, W twice, B twice, W's out of micro order, zero_grad with a W
//    pending) are Internal errors;
//  - the runtime's row check of the slot contract, and the test tables' rewriter
//    (tests/support/split_backward.hpp) that the training test uses.
// TP > 1: tests/mpi/test_model_split_tp.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "atlas/core/error.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/runtime/trainer.hpp"
#include "split_backward_driver.hpp"
#include "support/split_backward.hpp"
#include "test_model_util.hpp"

namespace atlas {
namespace {

using ::testing::HasSubstr;
using device::Buffer;
using testutil::download;
using testutil::random_vec;
using testutil::upload;

constexpr int kBatch = 2;

ModelCfg tiny_cfg() {
  ModelCfg cfg;
  cfg.layers = 6;
  cfg.hidden = 8;
  cfg.heads = 2;
  cfg.seq_len = 4;
  cfg.vocab = 11;
  cfg.init_std = 0.2;  // large enough that every gradient is far from zero
  return cfg;
}

const char* name(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

// ---- backend ----

TEST(SplitBackward, LinearBackwardIsItsInputHalfPlusItsWeightHalfBitwise) {
  for (Precision prec : {Precision::Fp32, Precision::Bf16}) {
    auto be = device::make_host_backend(2, prec);
    const int rows = 6, in_f = 5, out_f = 7;
    for (const bool gelu : {false, true}) {
      for (const bool bias : {false, true}) {
        const auto dout = upload(*be, random_vec(rows * out_f, 1));
        const auto in = upload(*be, random_vec(rows * in_f, 2));
        const auto w = upload(*be, random_vec(out_f * in_f, 3));
        const auto pre = upload(*be, random_vec(rows * in_f, 4));
        const auto dw0 = random_vec(out_f * in_f, 5);  // gradients accumulate: start non-zero
        const auto db0 = random_vec(out_f, 6);
        Buffer din_a = be->alloc_floats(rows * in_f), din_b = be->alloc_floats(rows * in_f);
        Buffer dw_a = upload(*be, dw0), dw_b = upload(*be, dw0);
        Buffer db_a = upload(*be, db0), db_b = upload(*be, db0);
        const auto act = gelu ? device::Activation::Gelu : device::Activation::None;
        be->linear_backward(din_a.f32(), dw_a.f32(), bias ? db_a.f32() : nullptr, dout.f32(), in.f32(), w.f32(),
                            pre.f32(), rows, in_f, out_f, act);
        be->linear_backward(din_b.f32(), nullptr, nullptr, dout.f32(), in.f32(), w.f32(), pre.f32(), rows, in_f,
                            out_f, act);
        be->linear_backward_weight(dw_b.f32(), bias ? db_b.f32() : nullptr, dout.f32(), in.f32(), rows, in_f,
                                   out_f);
        const std::string what = std::string(name(prec)) + (gelu ? " gelu" : "") + (bias ? " bias" : "");
        EXPECT_EQ(download(*be, din_b), download(*be, din_a)) << what;
        EXPECT_EQ(download(*be, dw_b), download(*be, dw_a)) << what;
        EXPECT_EQ(download(*be, db_b), download(*be, db_a)) << what;
        EXPECT_NE(download(*be, dw_b), dw0) << what << ": the weight gradient was added";
      }
    }
  }
}

TEST(SplitBackward, ABiasGradientWithoutAWeightGradientIsAnInternalError) {
  auto be = device::make_host_backend(1);
  Buffer a = be->alloc_floats(4), w = be->alloc_floats(4), b = be->alloc_floats(2), d = be->alloc_floats(4);
  try {
    be->linear_backward(d.f32(), nullptr, b.f32(), a.f32(), a.f32(), w.f32(), nullptr, 2, 2, 2,
                        device::Activation::None);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    EXPECT_THAT(e.what(), HasSubstr("a bias gradient but no weight gradient"));
  }
  // the same with the input stored as bf16 (bf16 activation storage)
  auto be16 = device::make_host_backend(1, Precision::Bf16);
  Buffer a16 = be16->alloc_floats(4), w16 = be16->alloc_floats(4), b16 = be16->alloc_floats(2), d16 = be16->alloc_floats(4);
  try {
    be16->linear_backward_bf16_in(d16.f32(), nullptr, b16.f32(), a16.f32(), a16.bf16(), w16.f32(), nullptr, 2, 2, 2,
                                  device::Activation::None);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    EXPECT_THAT(e.what(), HasSubstr("linear_backward_bf16_in with a bias gradient but no weight gradient"));
  }
}

// ---- model ----

TEST(SplitBackward, InputThenDeferredWeightHalvesEqualTheWholeBackwardBitwise) {
  const ModelCfg cfg = tiny_cfg();
  constexpr int kMicros = 3;
  struct Case {
    int stage, pp;
    const char* what;
  };
  const Case cases[] = {{0, 1, "one stage"}, {0, 3, "first stage"}, {1, 3, "middle stage"}, {2, 3, "last stage"}};
  for (Precision prec : {Precision::Fp32, Precision::Bf16}) {
    auto be = device::make_host_backend(2, prec);
    for (const Case& c : cases) {
      for (int chunks : {1, 2}) {
        const model::StageSpec spec{c.stage, c.pp, 0, 1, chunks};
        const std::string what = std::string(c.what) + " " + name(prec) + " v " + std::to_string(chunks);
        const auto whole = testutil::run_stage(cfg, kBatch, spec, *be, nullptr, false, kMicros);
        const auto split = testutil::run_stage(cfg, kBatch, spec, *be, nullptr, true, kMicros);
        testutil::expect_bitwise(split, whole, what);

        // Memory: right after the first B two units are in flight: the first's activations stay
        // until its W, and what W needs beyond them is written over activations B consumed.
        model::StageModel m(cfg, kBatch, spec, *be, nullptr, 1);
        model::StageSpec split_spec = spec;
        split_spec.split_backward = true;
        model::StageModel ms(cfg, kBatch, split_spec, *be, nullptr, 1);
        // (the first B is micro 0's chunk 0; in flight after it: the next unit, micro 0's chunk 1
        // with chunks, else micro 1; the last stage's chunk 0 holds no head slots)
        const int next_chunk = chunks > 1 ? 1 : 0;
        EXPECT_EQ(whole.bytes_after_first_b, m.activation_bytes_per_micro(next_chunk)) << what;
        EXPECT_EQ(split.bytes_after_first_b,
                  ms.activation_bytes_per_micro(0) + ms.activation_bytes_per_micro(next_chunk)) << what;
        // bf16 storage: a split model reserves the q/k/v slot at fp32 size (the other half of
        // n * 3C floats, in 16-float units, per layer of a chunk); fp32: the same arena.
        const std::size_t qkv_half = (m.tokens_per_micro() * 3 * static_cast<std::size_t>(cfg.hidden) / 2 + 15) / 16 * 16 * 4;
        const auto layers = static_cast<std::size_t>(m.n_layers() / chunks);
        EXPECT_EQ(ms.activation_bytes_per_micro() - m.activation_bytes_per_micro(),
                  prec == Precision::Bf16 ? layers * qkv_half : 0U) << what;
      }
    }
  }
}

class SplitMisuse : public ::testing::Test {
 protected:
  void SetUp() override {
    model.set_loss_scale(0.5F);
    for (int m = 0; m < 3; ++m) model.forward(m, tok.data(), tok.data(), nullptr, nullptr);
  }
  void expect_internal(const std::function<void()>& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error; expected: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Internal) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  }
  std::unique_ptr<device::Backend> be = device::make_host_backend(1);
  model::StageModel model{tiny_cfg(), kBatch, model::StageSpec{}, *be, nullptr, 7};
  std::vector<std::int32_t> tok = testutil::seeded_ids(kBatch * 4, 11, 3);
};

TEST(SplitBackward, Bf16StorageWithoutTheSplitSpecIsAnInternalError) {
  auto be = device::make_host_backend(1, Precision::Bf16);
  model::StageModel model{tiny_cfg(), kBatch, model::StageSpec{}, *be, nullptr, 7};
  const std::vector<std::int32_t> tok = testutil::seeded_ids(kBatch * 4, 11, 3);
  model.set_loss_scale(0.5F);
  model.forward(0, tok.data(), tok.data(), nullptr, nullptr);
  try {
    model.backward_input(0, nullptr, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("built without StageSpec::split_backward"));
  }
}

TEST_F(SplitMisuse, WBeforeItsBIsAnInternalError) {
  expect_internal([&] { model.backward_weight(0); }, "backward_weight of micro-batch 0 (chunk 0) without a pending backward_input");
  expect_internal([&] { model.backward_weight(9); }, "W before its B, or W twice");
}

TEST_F(SplitMisuse, WTwiceIsAnInternalError) {
  model.backward_input(0, nullptr, nullptr);
  model.backward_weight(0);
  expect_internal([&] { model.backward_weight(0); }, "its W already ran (W twice)");
}

TEST_F(SplitMisuse, BTwiceOrBThenAWholeBackwardIsAnInternalError) {
  model.backward_input(0, nullptr, nullptr);
  expect_internal([&] { model.backward_input(0, nullptr, nullptr); }, "backward_input of micro-batch 0 (chunk 0) after its backward_input");
  expect_internal([&] { model.backward(0, nullptr, nullptr); }, "backward of micro-batch 0 (chunk 0) after its backward_input");
  expect_internal([&] { model.backward_input(7, nullptr, nullptr); }, "backward_input of micro-batch 7 without its forward");
  model.backward_weight(0);  // the state is intact: W still runs
  EXPECT_TRUE(model.weight_grads_pending().empty());
}

TEST_F(SplitMisuse, WOutOfMicroOrderIsAnInternalError) {
  model.backward_input(0, nullptr, nullptr);
  model.backward_input(1, nullptr, nullptr);
  model.backward_weight(1);
  expect_internal([&] { model.backward_weight(0); },
                  "backward_weight of micro-batch 0 (chunk 0) after that of micro-batch 1: the W's of a chunk must run in "
                  "increasing micro order");
  EXPECT_EQ(model.weight_grads_pending(), std::vector<int>{0});
}

TEST_F(SplitMisuse, ZeroGradWithAWPendingIsAnInternalErrorAndTheOrderRestartsAfterIt) {
  model.backward_input(2, nullptr, nullptr);
  expect_internal([&] { model.zero_grad(); }, "zero_grad with 1 backward_weight call(s) pending (micro-batch 2, chunk 0 first)");
  model.backward_weight(2);
  model.zero_grad();  // a new step: micro-batch 0 may follow 2 again
  model.backward_input(0, nullptr, nullptr);
  model.backward_weight(0);
  EXPECT_EQ(model.activation_bytes(), model.activation_bytes_per_micro()) << "micro-batch 1 is still in flight";
}

// ---- runtime: the row check, and the test rewriter ----

sched::Slot slot(sched::SlotKind k, int micro = -1, int chunk = 0) {
  sched::Slot s;
  s.kind = k;
  s.micro = micro;
  s.chunk = chunk;
  s.duration_ms = 4.0;
  return s;
}

std::string kinds(const std::vector<sched::Slot>& row) {
  std::string out;
  for (const auto& s : row) {
    switch (s.kind) {
      case sched::SlotKind::Forward: out += "F"; break;
      case sched::SlotKind::Backward: out += "B!"; break;
      case sched::SlotKind::BackwardInput: out += "B"; break;
      case sched::SlotKind::BackwardWeight: out += "W"; break;
      case sched::SlotKind::LocalSend: out += "s"; break;
      case sched::SlotKind::LocalRecv: out += "r"; break;
      case sched::SlotKind::AllReduce: out += "A"; break;
      case sched::SlotKind::Optimizer: out += "O"; break;
      default: out += "?"; break;
    }
    if (s.micro >= 0) out += std::to_string(s.micro);
    out += " ";
  }
  return out;
}

TEST(SplitBackward, TheTestRewriterDefersEachWPastTheNextBAndItsSends) {
  using K = sched::SlotKind;
  sched::ScheduleTable t;
  t.rows.push_back({slot(K::Forward, 0), slot(K::Forward, 1), slot(K::LocalRecv, 0), slot(K::Backward, 0),
                    slot(K::LocalSend, 0), slot(K::Forward, 2), slot(K::LocalRecv, 1), slot(K::Backward, 1),
                    slot(K::LocalSend, 1), slot(K::LocalRecv, 2), slot(K::Backward, 2), slot(K::LocalSend, 2),
                    slot(K::AllReduce), slot(K::Optimizer)});
  const sched::ScheduleTable s = testing::split_backwards(t, 0.25);
  EXPECT_EQ(kinds(s.rows[0]), "F0 F1 r0 B0 s0 F2 r1 B1 s1 W0 r2 B2 s2 W1 W2 A O ");
  EXPECT_NO_THROW(runtime::check_split_backward_row(s.rows[0], 0, 0));
  double b = 0.0, w = 0.0;
  for (const auto& x : s.rows[0]) {
    if (x.kind == K::BackwardInput) b += x.duration_ms;
    if (x.kind == K::BackwardWeight) w += x.duration_ms;
  }
  EXPECT_DOUBLE_EQ(b, 3 * 1.0);
  EXPECT_DOUBLE_EQ(w, 3 * 3.0);
  EXPECT_NO_THROW(runtime::check_split_backward_row(t.rows[0], 0, 0)) << "an unsplit row";
}

TEST(SplitBackward, TheRuntimeRefusesRowsThatBreakTheSlotContract) {
  using K = sched::SlotKind;
  auto expect_refused = [](const std::vector<sched::Slot>& row, const std::string& text) {
    try {
      runtime::check_split_backward_row(row, 1, 0);
      ADD_FAILURE() << "accepted; expected: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Internal) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  expect_refused({slot(K::BackwardWeight, 0), slot(K::BackwardInput, 0)},
                 "stage 1 (dp 0) slot 0: backward_weight of micro-batch 0 chunk 0 without a B before it");
  expect_refused({slot(K::BackwardInput, 0), slot(K::BackwardWeight, 0), slot(K::BackwardWeight, 0)},
                 "slot 2: backward_weight of micro-batch 0 chunk 0 without a B before it");
  expect_refused({slot(K::BackwardInput, 0), slot(K::BackwardInput, 0)}, "while the previous B of it has no W yet");
  expect_refused({slot(K::BackwardInput, 0), slot(K::BackwardInput, 1), slot(K::BackwardWeight, 1), slot(K::BackwardWeight, 0)},
                 "slot 3: backward_weight of micro-batch 0 chunk 0 after the W of micro-batch 1");
  expect_refused({slot(K::BackwardInput, 0), slot(K::AllReduce), slot(K::BackwardWeight, 0)}, "after the AllReduce slot");
  expect_refused({slot(K::BackwardInput, 0), slot(K::AllReduce)}, "slot 0: backward_input of micro-batch 0 chunk 0 has no W after it");
  expect_refused({slot(K::Backward, 0), slot(K::BackwardInput, 1), slot(K::BackwardWeight, 1)},
                 "the row mixes Backward with BackwardInput/BackwardWeight slots");
  // W's of different chunks interleave freely; each chunk's are in micro order
  EXPECT_NO_THROW(runtime::check_split_backward_row({slot(K::BackwardInput, 0, 1), slot(K::BackwardInput, 0, 0),
                                                     slot(K::BackwardWeight, 0, 0), slot(K::BackwardInput, 1, 1),
                                                     slot(K::BackwardWeight, 0, 1), slot(K::BackwardWeight, 1, 1)},
                                                    1, 0));
}

}  // namespace
}  // namespace atlas
