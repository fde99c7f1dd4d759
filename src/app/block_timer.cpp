// SPDX-License-Identifier: MIT
// The real model's block timer: `atlas profile --timer model` and `atlas bench fidelity`'s fresh
// profile of a deck's own block.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "atlas/app/commands.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/model/gpt.hpp"

namespace atlas::app {

namespace {

/// TP "group" of one: the rank computes its 1/tp share and the sums are skipped (profiles time a
/// rank's compute; communication is modelled separately).
class NoCollective final : public device::Collective {
 public:
  explicit NoCollective(int size) : m_size(size) {}
  void allreduce_sum(device::Buffer&, std::size_t) override {}
  [[nodiscard]] int size() const override { return m_size; }
  [[nodiscard]] int rank() const override { return 0; }

 private:
  int m_size;
};

}  // namespace

/// Times the real model: one transformer block (the middle stage of a 3-stage, 3-block model,
/// so no embedding or head) forward and backward on the host backend, median of `repeats` after
/// a warm-up.
sim::BlockTimer model_block_timer(int repeats, int threads) {
  return [repeats, threads](const sim::BlockShape& s) {
    DeviceCfg dev;
    dev.backend = Backend::Host;
    dev.threads = threads;
    auto backend = device::make_backend(dev);
    ModelCfg m;
    m.layers = 3;
    m.hidden = s.hidden;
    m.heads = s.heads;
    m.seq_len = s.seq_len;
    m.vocab = 256;
    NoCollective tp(s.tp);
    model::StageModel stage(m, s.micro_batch_size, model::StageSpec{1, 3, 0, s.tp}, *backend,
                            s.tp > 1 ? &tp : nullptr, 1234);
    const std::size_t n = stage.boundary_floats();
    device::Buffer in = backend->alloc_floats(n), out = backend->alloc_floats(n);
    device::Buffer gout = backend->alloc_floats(n), gin = backend->alloc_floats(n);
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    backend->upload(in.data(), host.data(), n * 4);
    backend->upload(gout.data(), host.data(), n * 4);
    std::vector<double> f, b;
    for (int r = 0; r <= repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      stage.forward(r, nullptr, nullptr, &in, &out);
      backend->synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      stage.backward(r, &gout, &gin);
      backend->synchronize();
      const auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;  // warm-up
      f.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      b.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(f.begin(), f.end());
    std::sort(b.begin(), b.end());
    return sim::BlockTiming{f[f.size() / 2], b[b.size() / 2]};
  };
}

}  // namespace atlas::app
