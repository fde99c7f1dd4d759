// SPDX-License-Identifier: MIT
// A toy GPT-like parameter set for checkpoint tests: given a virtual layout (pp, dp, tp) and a
// virtual rank, the shards that rank holds (TP-sharded along dim 0 or 1, uneven splits, a 3-D
// tensor, TP-replicated vectors), filled with values that are a pure function of
// (tensor, kind, global index) so any reader can verify any element bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "atlas/io/checkpoint.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::io::testing {

struct VLayout {
  int pp = 1;
  int dp = 1;
  int tp = 1;
  [[nodiscard]] int size() const { return pp * dp * tp; }
};

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  int split_dim = -1;  ///< dimension sharded over TP; -1 = replicated over TP
  int stage_of_layer = -1;  ///< layer index (stage derived), or -1 = first, -2 = last stage
};

inline constexpr std::int64_t kLayers = 3;
inline constexpr std::int64_t kHidden = 8;
inline constexpr std::int64_t kVocab = 13;  // odd: TP splits are uneven

inline std::vector<TensorSpec> toy_model() {
  std::vector<TensorSpec> t;
  t.push_back({"wte", {kVocab, kHidden}, 0, -1});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    t.push_back({p + "ln_1.weight", {kHidden}, -1, l});
    t.push_back({p + "attn.qkv.weight", {3, kHidden, kHidden}, 1, l});  // as the GPT stores it
    t.push_back({p + "attn.proj.weight", {kHidden, kHidden}, 0, l});
    t.push_back({p + "attn.proj.bias", {kHidden}, -1, l});
    t.push_back({p + "mlp.fc.weight", {kHidden, 4 * kHidden}, 1, l});
    t.push_back({p + "rope.table", {2, 6, 5}, 1, l});
  }
  t.push_back({"ln_f.weight", {kHidden}, -1, -2});
  return t;
}

inline int stage_of(const TensorSpec& t, int pp) {
  if (t.stage_of_layer == -1) return 0;
  if (t.stage_of_layer == -2) return pp - 1;
  return static_cast<int>(t.stage_of_layer * pp / kLayers);
}

/// Bits of element `index` of `kind` (0 value, 1 adam_m, 2 adam_v) of tensor number `tensor`:
/// any 32-bit pattern, NaNs and denormals included, to prove the copy is bit-exact.
inline std::uint32_t element_bits(std::uint64_t seed, std::size_t tensor, int kind,
                                  std::int64_t index) {
  std::uint64_t x = seed ^ (tensor * 0x9E3779B97F4A7C15ULL) ^
                    (static_cast<std::uint64_t>(kind) << 56) ^ static_cast<std::uint64_t>(index);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

/// One shard with owned buffers.
struct OwnedShard {
  std::size_t tensor = 0;  ///< index in toy_model()
  std::string name;
  std::vector<std::int64_t> full, offset, shape;
  bool writer = false;
  std::vector<float> buf[3];  ///< value, adam_m, adam_v
};

/// Row-major flat index in the full tensor of element `local` of the box.
inline std::int64_t global_index(const OwnedShard& s, std::int64_t local) {
  const std::size_t n = s.full.size();
  std::vector<std::int64_t> idx(n);
  for (std::size_t d = n; d-- > 0;) {
    idx[d] = local % s.shape[d] + s.offset[d];
    local /= s.shape[d];
  }
  std::int64_t g = 0;
  for (std::size_t d = 0; d < n; ++d) g = g * s.full[d] + idx[d];
  return g;
}

/// Shards held by virtual rank `v` of `layout`; filled with the expected values when `fill`,
/// else with a sentinel (so a read that misses elements shows up).
inline std::vector<OwnedShard> shards_of(const VLayout& layout, int v, std::uint64_t seed,
                                         bool fill) {
  const int tp = v % layout.tp;
  const int dp = (v / layout.tp) % layout.dp;
  const int stage = v / (layout.tp * layout.dp);
  std::vector<OwnedShard> out;
  const auto model = toy_model();
  for (std::size_t i = 0; i < model.size(); ++i) {
    const TensorSpec& t = model[i];
    if (stage_of(t, layout.pp) != stage) continue;
    OwnedShard s;
    s.tensor = i;
    s.name = t.name;
    s.full = t.shape;
    s.offset.assign(t.shape.size(), 0);
    s.shape = t.shape;
    s.writer = dp == 0;
    if (t.split_dim >= 0) {
      const auto d = static_cast<std::size_t>(t.split_dim);
      const std::int64_t len = t.shape[d];
      const std::int64_t begin = len * tp / layout.tp;
      const std::int64_t end = len * (tp + 1) / layout.tp;
      s.offset[d] = begin;
      s.shape[d] = end - begin;
    } else {
      s.writer = s.writer && tp == 0;
    }
    std::int64_t n = 1;
    for (auto x : s.shape) n *= x;
    for (int k = 0; k < 3; ++k) {
      s.buf[k].resize(static_cast<std::size_t>(n));
      for (std::int64_t e = 0; e < n; ++e) {
        const std::uint32_t bits =
            fill ? element_bits(seed, i, k, global_index(s, e)) : 0xDEADBEEFU;
        std::memcpy(&s.buf[k][static_cast<std::size_t>(e)], &bits, 4);
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

/// Shards of every virtual rank this real rank plays (v % comm.size() == comm.rank()).
inline std::vector<OwnedShard> my_shards(const mpi::Comm& comm, const VLayout& layout,
                                         std::uint64_t seed, bool fill) {
  std::vector<OwnedShard> out;
  for (int v = comm.rank(); v < layout.size(); v += comm.size()) {
    auto s = shards_of(layout, v, seed, fill);
    for (auto& x : s) out.push_back(std::move(x));
  }
  return out;
}

inline std::vector<WriteShard> write_views(const std::vector<OwnedShard>& shards) {
  std::vector<WriteShard> out;
  for (const auto& s : shards) {
    out.push_back({s.name, s.full, s.offset, s.shape, s.writer, s.buf[0].data(), s.buf[1].data(),
                   s.buf[2].data()});
  }
  return out;
}

inline std::vector<ReadShard> read_views(std::vector<OwnedShard>& shards, bool moments = true) {
  std::vector<ReadShard> out;
  for (auto& s : shards) {
    out.push_back({s.name, s.full, s.offset, s.shape, false, s.buf[0].data(),
                   moments ? s.buf[1].data() : nullptr, moments ? s.buf[2].data() : nullptr});
  }
  return out;
}

/// Number of elements (over value/m/v, or value only) whose bits differ from the expected ones.
inline std::int64_t count_wrong(const std::vector<OwnedShard>& shards, std::uint64_t seed,
                                int kinds = 3) {
  std::int64_t wrong = 0;
  for (const auto& s : shards) {
    for (int k = 0; k < kinds; ++k) {
      for (std::size_t e = 0; e < s.buf[k].size(); ++e) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &s.buf[k][e], 4);
        if (bits != element_bits(seed, s.tensor, k, global_index(s, static_cast<std::int64_t>(e))))
          ++wrong;
      }
    }
  }
  return wrong;
}

inline ModelShape toy_shape() { return {kLayers, kHidden, 2, 16, kVocab}; }

inline CheckpointMeta toy_meta(std::int64_t step, const VLayout& l) {
  CheckpointMeta m;
  m.step = step;
  m.git_sha = "0123456789ab";
  m.deck = "# resolved deck\nrun.name = toy\nmodel.hidden = 8\n";
  m.layout = {1, l.pp, l.dp, l.tp, {l.pp}};
  m.model = toy_shape();
  return m;
}

/// A fresh directory shared by all ranks, removed by the destructor (rank 0). Collective.
class SharedTempDir {
 public:
  explicit SharedTempDir(const mpi::Comm& comm) : m_comm(comm.dup()) {
    std::string path;
    if (comm.rank() == 0) {
      std::string templ = (std::filesystem::temp_directory_path() / "atlas_io_XXXXXX").string();
      if (mkdtemp(templ.data()) != nullptr) path = templ;
    }
    comm.bcast_string(path, 0);
    m_path = path;
  }
  ~SharedTempDir() {
    m_comm.barrier();
    if (m_comm.rank() == 0 && !m_path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(m_path, ec);
    }
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return m_path; }

 private:
  mpi::Comm m_comm;
  std::string m_path;
};

}  // namespace atlas::io::testing
