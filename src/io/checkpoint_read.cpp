// SPDX-License-Identifier: MIT
// The checkpoint reader: rank 0 inspects the file (format, version, tensor list) and broadcasts
// the verdict, every rank checks its requests against it, then each rank reads its shards as
// hyperslabs of the stored full tensors through MPI-IO (resharding needs nothing more), then the
// stored CRC32C of every box read from is verified before the data is handed back.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
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
      out.push_back(fmt::format("checkpoint '{}' has no tensor '{}'\n  hint: it was written for another model "
                                "(its deck is in the file: h5dump -d /deck {}); resume with that deck, or start "
                                "fresh without run.resume",
                                path, s.name, path));
      continue;
    }
    const TensorEntry& t = *it->second;
    if (t.shape != s.full_shape) {
      out.push_back(fmt::format("tensor '{}' has shape {} in checkpoint '{}' but {} in the model\n  hint: "
                                "it was written for another model (its deck: h5dump -d /deck {}); resume with "
                                "that deck, or start fresh without run.resume",
                                s.name, internal::dims_str(t.shape), path,
                                internal::dims_str(s.full_shape), path));
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

bool wants(int kind, const internal::Piece& p) {
  return kind == 0 || (kind == 1 && p.want_m) || (kind == 2 && p.want_v);
}

/// Verifies the stored checksum of every box of every dataset that some rank read from. A box
/// that some rank read exactly (same offset and shape: the same layout as the writer's) is
/// checked from that rank's buffer, at no extra I/O; every other box is read once more, by one
/// rank, round robin. Every rank walks the same plan and contents, so all agree on who checks
/// what without talking. Returns this rank's mismatches. Independent reads only.
std::vector<std::string> verify_checksums(hid_t file, hid_t dxpl, const std::string& path,
                                          const CheckpointContents& contents,
                                          const internal::Plan& plan,
                                          std::span<const ReadShard> shards, int me, int ranks) {
  std::map<std::string, const TensorEntry*> stored;
  for (const auto& t : contents.tensors) stored[t.name] = &t;
  std::vector<std::string> bad;
  int next = 0;
  std::vector<float> extra;
  for (int kind = 0; kind < 3; ++kind) {
    std::optional<h5::Group> group;
    for (const auto& [name, t] : plan) {
      bool used = false;
      for (const auto& p : t.pieces) used = used || (wants(kind, p) && internal::volume(p.shape) > 0);
      if (!used) continue;
      const std::string dataset = fmt::format("/{}/{}", internal::kKindGroups[kind], name);
      for (const BoxChecksum& box : stored.at(name)->checksums[kind]) {
        const internal::Piece* exact = nullptr;
        for (const auto& p : t.pieces) {
          if (wants(kind, p) && p.offset == box.offset && p.shape == box.shape) {
            exact = &p;
            break;
          }
        }
        const int checker = exact ? exact->rank : next++ % ranks;
        if (checker != me) continue;
        const std::int64_t n = internal::volume(box.shape);
        const float* data = nullptr;
        if (exact) {
          const ReadShard& s = shards[static_cast<std::size_t>(exact->local_index)];
          data = kind == 0 ? s.value : kind == 1 ? s.adam_m : s.adam_v;
        } else {
          if (!group) group = h5::open_group(file, internal::kKindGroups[kind]);
          h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(group->get(), name.c_str(), H5P_DEFAULT)));
          extra.resize(static_cast<std::size_t>(n));
          internal::transfer_box(d.get(), dxpl, internal::Direction::Read, &box.offset,
                                 &box.shape, extra.data());
          data = extra.data();
        }
        const std::uint32_t got = internal::crc_of(data, n);
        if (got != box.crc) {
          bad.push_back(internal::mismatch_text(
              path, dataset,
              fmt::format(" (box offset {} shape {})", internal::dims_str(box.offset),
                          internal::dims_str(box.shape)),
              box.crc, got));
        }
      }
    }
  }
  return bad;
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
    // ---- checksums: every box of every dataset read from, before anyone uses the data ----
    std::vector<std::string> bad;
    if (contents.checksummed) {
      bad = verify_checksums(file.get(), ind_xfer.get(), path, contents, plan, shards, me,
                             comm.size());
    } else if (me == 0) {
      log::warn("checkpoint '{}' holds no checksums (written before atlas stored them): its "
                "data is read unverified",
                path);
    }
    bad = internal::gather_problems(comm, bad, /*rank_prefix=*/false);
    if (!bad.empty()) {
      constexpr std::size_t kShown = 4;
      std::string text = bad.front();
      for (std::size_t i = 1; i < std::min(bad.size(), kShown); ++i) text += "\n  " + bad[i];
      if (bad.size() > kShown) text += fmt::format("\n  ... and {} more", bad.size() - kShown);
      file.close();
      throw ChecksumMismatch(text);
    }
  } catch (const ChecksumMismatch&) {
    throw;  // thrown by every rank alike, after the collective close
  } catch (...) {
    // Local failure (the job aborts): closing is collective, so do not risk a hang unwinding.
    (void)file.release();
    throw;
  }
  file.close();
  return contents.meta;
}

}  // namespace atlas::io
