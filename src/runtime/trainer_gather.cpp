// SPDX-License-Identifier: MIT
// The full tensors of a run gathered on world rank 0 (Trainer::gather_full), for the parallel
// equivalence tests: each rank's shards serialised, gathered and scattered into full tensors.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "atlas/core/check.hpp"

namespace atlas::runtime {

std::vector<std::pair<std::string, std::vector<float>>> Trainer::gather_full(bool gradients) const {
  // Every rank of pipeline replica 0 serialises its shards; rank 0 assembles full tensors.
  std::vector<char> blob;
  auto put = [&blob](const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    blob.insert(blob.end(), c, c + n);
  };
  if (m_me.dp == 0) {
    for (const auto& p : m_model->params()) {
      if (p.tied_copy) continue;
      const auto numel = static_cast<std::size_t>(p.shard_numel());
      std::vector<float> v(numel);
      m_backend.download(v.data(), (gradients ? p.grad : p.value).data(), numel * sizeof(float));
      const auto nlen = static_cast<std::uint32_t>(p.name.size());
      const auto nd = static_cast<std::uint32_t>(p.full_shape.size());
      put(&nlen, 4);
      put(p.name.data(), nlen);
      put(&nd, 4);
      put(p.full_shape.data(), nd * 8);
      put(p.shard_offset.data(), nd * 8);
      put(p.shard_shape.data(), nd * 8);
      put(v.data(), numel * sizeof(float));
    }
  }
  const int mine = detail::mpi_count(blob.size());  // throws past INT_MAX (MPI-3 counts), never wraps
  const int n = m_comms.world.size();
  std::vector<int> sizes(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n), 0);
  ATLAS_MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, m_comms.world.get()));
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    displs[static_cast<std::size_t>(i)] = detail::mpi_count(static_cast<std::size_t>(total));
    total += sizes[static_cast<std::size_t>(i)];
  }
  std::vector<char> all(m_comms.world.rank() == 0 ? static_cast<std::size_t>(total) : 0);
  ATLAS_MPI_CHECK(MPI_Gatherv(blob.data(), mine, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0,
                              m_comms.world.get()));
  std::vector<std::pair<std::string, std::vector<float>>> out;
  if (m_comms.world.rank() != 0) return out;
  std::size_t at = 0;
  auto get = [&](void* p, std::size_t k) {
    std::memcpy(p, all.data() + at, k);
    at += k;
  };
  std::map<std::string, std::size_t> index;
  while (at < all.size()) {
    std::uint32_t nlen = 0, nd = 0;
    get(&nlen, 4);
    std::string name(nlen, '\0');
    get(name.data(), nlen);
    get(&nd, 4);
    std::vector<std::int64_t> full(nd), off(nd), shape(nd);
    get(full.data(), nd * 8);
    get(off.data(), nd * 8);
    get(shape.data(), nd * 8);
    std::size_t numel = 1, full_numel = 1;
    for (std::uint32_t d = 0; d < nd; ++d) {
      numel *= static_cast<std::size_t>(shape[d]);
      full_numel *= static_cast<std::size_t>(full[d]);
    }
    std::vector<float> v(numel);
    get(v.data(), numel * sizeof(float));
    if (!index.count(name)) {
      index[name] = out.size();
      out.emplace_back(name, std::vector<float>(full_numel, 0.0F));
    }
    auto& dst = out[index[name]].second;
    // Scatter the shard (a dense row-major hyperslab) into the full tensor.
    std::vector<std::int64_t> idx(nd, 0);
    for (std::size_t e = 0; e < numel; ++e) {
      std::size_t flat = 0;
      for (std::uint32_t d = 0; d < nd; ++d) flat = flat * static_cast<std::size_t>(full[d]) + static_cast<std::size_t>(off[d] + idx[d]);
      dst[flat] = v[e];
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < shape[static_cast<std::size_t>(d)]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace atlas::runtime
