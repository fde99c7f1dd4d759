// SPDX-License-Identifier: MIT
// The checkpoint reader: rank 0 inspects the file (format, version, tensor list) and broadcasts
// the verdict, every rank checks its requests against it, then each rank reads its shards as
// hyperslabs of the stored full tensors through MPI-IO. Resharding needs nothing more.
#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/io/hdf5.hpp"
#include "ckpt_internal.hpp"

namespace atlas::io {

namespace {

std::vector<std::string> request_problems(const std::string& path,
                                          const CheckpointContents& contents,
                                          std::span<const ReadShard> shards) {
  std::map<std::string, const TensorEntry*> stored;
  for (const auto& t : contents.tensors) stored[t.name] = &t;
  std::vector<std::string> out;
  for (const auto& s : shards) {
    auto p = internal::shard_problems(s.name, s.full_shape, s.offset, s.shape);
    if (!p.empty()) {
      out.insert(out.end(), p.begin(), p.end());
      continue;
    }
    const auto it = stored.find(s.name);
    if (it == stored.end()) {
      out.push_back(fmt::format("checkpoint '{}' has no tensor '{}'", path, s.name));
      continue;
    }
    const TensorEntry& t = *it->second;
    if (t.shape != s.full_shape) {
      out.push_back(fmt::format("tensor '{}' has shape {} in checkpoint '{}' but {} in the model",
                                s.name, internal::dims_str(t.shape), path,
                                internal::dims_str(s.full_shape)));
    }
    if ((s.adam_m != nullptr || s.adam_v != nullptr) && !t.has_adam) {
      out.push_back(fmt::format("checkpoint '{}' holds no AdamW moments for tensor '{}'", path,
                                s.name));
    }
    if (s.numel() > 0 && s.value == nullptr) {
      out.push_back(fmt::format("tensor '{}': the value buffer is null", s.name));
    }
  }
  return out;
}

}  // namespace

CheckpointMeta read_checkpoint(const mpi::Comm& comm, const std::string& path,
                               std::span<const ReadShard> shards, const ReadOptions& options) {
  h5::init();
  // ---- checks before any data is read; each ends identically on every rank ----
  const CheckpointContents contents = inspect_checkpoint(comm, path);
  if (options.expect_model) {
    auto mismatches = model_mismatches(path, contents.meta.model, *options.expect_model);
    if (!mismatches.empty()) throw ConfigError(mismatches);
  }
  const auto problems =
      internal::gather_problems(comm, request_problems(path, contents, shards));
  if (!problems.empty()) throw ConfigError(problems);

  std::vector<internal::ShardDesc> descs;
  descs.reserve(shards.size());
  for (const auto& s : shards) {
    descs.push_back({s.name, s.full_shape, s.offset, s.shape, false, s.adam_m != nullptr,
                     s.adam_v != nullptr});
  }
  std::vector<std::string> plan_problems;  // shapes already checked against the file
  const internal::Plan plan = internal::gather_plan(comm, descs, plan_problems);

  // ---- data ----
  h5::FileContext ctx(path);
  h5::File file = h5::open_file(path, h5::Access::ReadOnly, comm);
  h5::PropList coll_xfer(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  ATLAS_H5_CHECK(H5Pset_dxpl_mpio(coll_xfer.get(), H5FD_MPIO_COLLECTIVE));
  h5::PropList ind_xfer(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  ATLAS_H5_CHECK(H5Pset_dxpl_mpio(ind_xfer.get(), H5FD_MPIO_INDEPENDENT));
  const int me = comm.rank();
  try {
    for (int kind = 0; kind < 3; ++kind) {
      h5::Group group = h5::open_group(file.get(), internal::kKindGroups[kind]);
      auto wanted = [kind](const internal::Piece& p) {
        return kind == 0 || (kind == 1 && p.want_m) || (kind == 2 && p.want_v);
      };
      for (const auto& [name, t] : plan) {
        std::vector<const internal::Piece*> mine;
        for (const auto& p : t.pieces) {
          if (p.rank == me && wanted(p) && internal::volume(p.shape) > 0) mine.push_back(&p);
        }
        const bool collective = options.transfer == Transfer::Collective;
        const hid_t dxpl = collective ? coll_xfer.get() : ind_xfer.get();
        const int rounds = collective ? internal::max_pieces_per_rank(t, comm.size(), wanted)
                                      : static_cast<int>(mine.size());
        if (rounds == 0) continue;
        h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(group.get(), name.c_str(), H5P_DEFAULT)));
        for (int i = 0; i < rounds; ++i) {
          if (i < static_cast<int>(mine.size())) {
            const internal::Piece& p = *mine[static_cast<std::size_t>(i)];
            const ReadShard& s = shards[static_cast<std::size_t>(p.local_index)];
            float* buf = kind == 0 ? s.value : kind == 1 ? s.adam_m : s.adam_v;
            internal::transfer_box(d.get(), dxpl, internal::Direction::Read, &s.offset,
                                   &s.shape, buf);
          } else {
            internal::transfer_box(d.get(), dxpl, internal::Direction::Read, nullptr, nullptr,
                                   nullptr);
          }
        }
      }
    }
  } catch (...) {
    // Local failure (the job aborts): closing is collective, so do not risk a hang unwinding.
    (void)file.release();
    throw;
  }
  file.close();
  return contents.meta;
}

}  // namespace atlas::io
