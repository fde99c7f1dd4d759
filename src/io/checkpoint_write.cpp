// SPDX-License-Identifier: MIT
// The checkpoint writer: validate and gather every rank's shard descriptors, write the full
// tensors to step-NNNNNN.h5.tmp with MPI-IO (one hyperslab per shard) with the CRC32C of each
// writer's box beside them, close and fsync, then rank 0 renames it into place and prunes old
// checkpoints. Layout: docs/formats.md.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <utility>

#include "atlas/core/check.hpp"
#include "atlas/core/crc32c.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/io/hdf5.hpp"
#include "atlas/mpi/tags.hpp"
#include "ckpt_internal.hpp"

namespace fs = std::filesystem;

namespace atlas::io {

namespace {

using internal::BlobReader;
using internal::BlobWriter;
using internal::Piece;
using internal::Plan;
using internal::TensorPlan;

// ---- validation ----

std::vector<std::string> state_name_problems(const std::string& name) {
  std::vector<std::string> out;
  bool bad = name.empty() || name.front() == '/' || name.back() == '/' ||
             name.find("//") != std::string::npos ||
             name.find_first_of(std::string("\t\n\0", 3)) != std::string::npos;
  for (std::size_t start = 0; !bad && start <= name.size();) {
    const auto slash = name.find('/', start);
    const auto part = name.substr(start, slash == std::string::npos ? slash : slash - start);
    bad = part == "." || part == "..";
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (bad) {
    out.push_back(fmt::format("state name '{}' is not usable: use non-empty '/'-separated parts "
                              "such as 'dp0/rng'",
                              name));
  }
  return out;
}

std::vector<std::string> local_problems(std::span<const WriteShard> shards,
                                        const CheckpointMeta& meta) {
  std::vector<std::string> out;
  for (const auto& s : shards) {
    auto p = internal::shard_problems(s.name, s.full_shape, s.offset, s.shape);
    if (p.empty() && s.writer && s.numel() > 0 &&
        (s.value == nullptr || s.adam_m == nullptr || s.adam_v == nullptr)) {
      p.push_back(fmt::format("tensor '{}': a writer shard needs value, adam_m and adam_v buffers "
                              "(got {}, {}, {})",
                              s.name, s.value ? "set" : "null", s.adam_m ? "set" : "null",
                              s.adam_v ? "set" : "null"));
    }
    out.insert(out.end(), p.begin(), p.end());
  }
  for (const auto& [name, words] : meta.state) {
    auto p = state_name_problems(name);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

bool boxes_overlap(const Piece& a, const Piece& b) {
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] + a.shape[d] <= b.offset[d] || b.offset[d] + b.shape[d] <= a.offset[d]) {
      return false;
    }
  }
  return true;
}

/// The writer pieces of each tensor must tile it: no overlap, and volumes that add up.
void coverage_problems(const Plan& plan, std::vector<std::string>& out) {
  for (const auto& [name, t] : plan) {
    std::vector<const Piece*> writers;
    std::int64_t covered = 0;
    for (const auto& p : t.pieces) {
      if (!p.writer || internal::volume(p.shape) == 0) continue;
      for (const Piece* w : writers) {
        if (boxes_overlap(*w, p)) {
          out.push_back(fmt::format("tensor '{}': writer shards on rank {} (offset {}, shape {}) "
                                    "and rank {} (offset {}, shape {}) overlap; mark one of them "
                                    "writer = false",
                                    name, w->rank, internal::dims_str(w->offset),
                                    internal::dims_str(w->shape), p.rank,
                                    internal::dims_str(p.offset), internal::dims_str(p.shape)));
        }
      }
      writers.push_back(&p);
      covered += internal::volume(p.shape);
    }
    const std::int64_t full = internal::volume(t.full_shape);
    if (covered != full) {
      out.push_back(fmt::format("tensor '{}' (shape {}): writer shards cover {} of {} elements",
                                name, internal::dims_str(t.full_shape), covered, full));
    }
  }
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32] = {};
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// Rank 0's metadata fields (and creation time) on every rank, with `state` the union of every
/// rank's entries. Collective over comm.
CheckpointMeta merged_meta(const mpi::Comm& comm, const CheckpointMeta& meta, std::string& created,
                           std::vector<std::string>& problems) {
  BlobWriter head;
  if (comm.rank() == 0) {
    CheckpointMeta copy = meta;
    copy.state.clear();
    internal::put_meta(head, copy);
    head.str(utc_now());
  }
  comm.bcast_string(head.data(), 0);
  BlobReader hr(head.data());
  CheckpointMeta m = internal::get_meta(hr);
  created = hr.str();

  BlobWriter mine;
  mine.i64(static_cast<std::int64_t>(meta.state.size()));
  for (const auto& [name, words] : meta.state) {
    mine.str(name);
    mine.u64s(words);
  }
  const auto all = comm.allgather_strings(mine.data());
  std::map<std::string, int> first_rank;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    BlobReader r(all[rank]);
    const auto n = r.i64();
    for (std::int64_t i = 0; i < n; ++i) {
      std::string name = r.str();
      auto words = r.u64s();
      auto [it, fresh] = m.state.try_emplace(name, words);
      if (fresh) {
        first_rank[name] = static_cast<int>(rank);
      } else if (it->second != words) {
        problems.push_back(fmt::format("state '{}' differs between rank {} and rank {}", name,
                                       first_rank[name], rank));
      }
    }
  }
  return m;
}

// ---- file body ----

/// A one-value `crc32c` attribute on the dataset `name` below `loc` (metadata: every rank).
void write_whole_crc(hid_t loc, const std::string& name, std::uint32_t crc) {
  h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  h5::write_attr(d.get(), internal::kCrcAttr, std::span<const std::uint32_t>(&crc, 1));
}

void write_metadata(hid_t root, const CheckpointMeta& m, const std::string& created,
                    bool is_root_rank) {
  h5::write_attr(root, "format", std::string(kCkptFormatName));
  h5::write_attr(root, "format_version", kCkptFormatVersion);
  h5::write_attr(root, "checksum", std::string(kCkptChecksum));
  h5::write_attr(root, "step", m.step);
  h5::write_attr(root, "git_sha", m.git_sha);
  h5::write_attr(root, "created_utc", created);
  h5::write_string_dataset(root, "deck", m.deck, is_root_rank);
  write_whole_crc(root, "deck", crc32c(m.deck.data(), m.deck.size()));
  {
    h5::Group g = h5::create_group(root, "layout");
    h5::write_attr(g.get(), "dc_count", m.layout.dc_count);
    h5::write_attr(g.get(), "pp_size", m.layout.pp_size);
    h5::write_attr(g.get(), "dp_size", m.layout.dp_size);
    h5::write_attr(g.get(), "tp_size", m.layout.tp_size);
    h5::write_attr(g.get(), "stages_per_dc", std::span<const std::int64_t>(m.layout.stages_per_dc));
  }
  {
    h5::Group g = h5::create_group(root, "model");
    h5::write_attr(g.get(), "layers", m.model.layers);
    h5::write_attr(g.get(), "hidden", m.model.hidden);
    h5::write_attr(g.get(), "heads", m.model.heads);
    h5::write_attr(g.get(), "seq_len", m.model.seq_len);
    h5::write_attr(g.get(), "vocab", m.model.vocab);
  }
  h5::Group state = h5::create_group(root, "state");
  h5::PropList lcpl(ATLAS_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  ATLAS_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  for (const auto& [name, words] : m.state) {
    const hsize_t n = words.size();
    h5::Space space = h5::simple_space({&n, 1});
    h5::Dataset d(ATLAS_H5_CHECK(H5Dcreate2(state.get(), name.c_str(), H5T_STD_U64LE, space.get(),
                                            lcpl.get(), H5P_DEFAULT, H5P_DEFAULT)));
    if (is_root_rank && n > 0) {
      ATLAS_H5_CHECK(
          H5Dwrite(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, words.data()));
    }
    const std::uint32_t crc = internal::crc_of(words.data(), words.size());
    h5::write_attr(d.get(), internal::kCrcAttr, std::span<const std::uint32_t>(&crc, 1));
  }
}

// ---- checksums of the writer shards ----

/// CRC32C of each writer piece's value, adam_m and adam_v, keyed by (rank, local index): every
/// writer checksums its own buffers, then an allgather gives every rank the whole table, since
/// the attributes that hold it are metadata (written identically by every rank). Collective.
using CrcTable = std::map<std::pair<int, int>, std::array<std::uint32_t, 3>>;

CrcTable gather_crcs(const mpi::Comm& comm, std::span<const WriteShard> shards) {
  BlobWriter w;
  std::int64_t n = 0;
  for (const auto& s : shards) n += s.writer && s.numel() > 0 ? 1 : 0;
  w.i64(n);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const WriteShard& s = shards[i];
    if (!s.writer || s.numel() == 0) continue;
    w.i64(static_cast<std::int64_t>(i));
    for (const float* buf : {s.value, s.adam_m, s.adam_v}) w.u64(internal::crc_of(buf, s.numel()));
  }
  const auto all = comm.allgather_strings(w.data());
  CrcTable table;
  for (std::size_t r = 0; r < all.size(); ++r) {
    BlobReader rd(all[r]);
    const auto count = rd.i64();
    for (std::int64_t k = 0; k < count; ++k) {
      const auto local = static_cast<int>(rd.i64());
      auto& crcs = table[{static_cast<int>(r), local}];
      for (auto& c : crcs) c = static_cast<std::uint32_t>(rd.u64());
    }
  }
  return table;
}

/// The `crc32c` and `crc32c_boxes` attributes of one tensor dataset: one box per non-empty
/// writer piece, in plan order (identical on every rank).
void write_box_crcs(hid_t dset, const TensorPlan& t, const CrcTable& crcs, int kind) {
  std::vector<std::uint32_t> values;
  std::vector<std::int64_t> boxes;
  for (const auto& p : t.pieces) {
    if (!p.writer || internal::volume(p.shape) == 0) continue;
    values.push_back(crcs.at({p.rank, p.local_index})[static_cast<std::size_t>(kind)]);
    boxes.insert(boxes.end(), p.offset.begin(), p.offset.end());
    boxes.insert(boxes.end(), p.shape.begin(), p.shape.end());
  }
  const hsize_t dims[2] = {values.size(), 2 * t.full_shape.size()};
  h5::write_attr(dset, internal::kCrcAttr, std::span<const std::uint32_t>(values));
  h5::write_attr(dset, internal::kCrcBoxesAttr, std::span<const std::int64_t>(boxes),
                 std::span<const hsize_t>(dims, 2));
}

// ---- strided shards: redistribute into contiguous row blocks, then write ----

struct Box {
  std::vector<std::int64_t> off;
  std::vector<std::int64_t> shape;
};

bool intersect(const Box& a, const Box& b, Box& out) {
  out.off.resize(a.off.size());
  out.shape.resize(a.off.size());
  for (std::size_t d = 0; d < a.off.size(); ++d) {
    const std::int64_t lo = std::max(a.off[d], b.off[d]);
    const std::int64_t hi = std::min(a.off[d] + a.shape[d], b.off[d] + b.shape[d]);
    if (hi <= lo) return false;
    out.off[d] = lo;
    out.shape[d] = hi - lo;
  }
  return true;
}

/// Copies the global-coordinate box `part` from `src` (holding box `from`, row-major) to `dst`
/// (holding box `to`). memcpy per innermost run.
void copy_box(const float* src, const Box& from, float* dst, const Box& to, const Box& part) {
  const std::size_t n = part.off.size();
  const auto run = static_cast<std::size_t>(part.shape[n - 1]);
  std::vector<std::int64_t> idx(part.off);  // current global index; last dim fixed at start
  const std::int64_t rows = internal::volume(part.shape) / part.shape[n - 1];
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t s = 0;
    std::int64_t t = 0;
    for (std::size_t d = 0; d < n; ++d) {
      s = s * from.shape[d] + (idx[d] - from.off[d]);
      t = t * to.shape[d] + (idx[d] - to.off[d]);
    }
    std::memcpy(dst + t, src + s, run * sizeof(float));
    for (std::size_t d = n - 1; d-- > 0;) {  // odometer over all but the last dimension
      if (++idx[d] < part.off[d] + part.shape[d]) break;
      idx[d] = part.off[d];
    }
  }
}

/// Two-phase write of one strided tensor kind done with plain MPI: the k writer ranks each own
/// one block of whole rows (dimension 0) of the full tensor, receive the pieces of it from the
/// other writers, and write it as one contiguous run with independent I/O. Small strided writes
/// (a column-parallel TP shard is one short run per row) become large sequential ones, without
/// MPI-IO's collective machinery (measured 2-3x slower on local disks). Point-to-point over
/// `comm` among the tensor's writers only; tags are piece indices, all complete before return.
void write_redistributed(hid_t dset, hid_t dxpl, const mpi::Comm& comm, const TensorPlan& t,
                         std::span<const WriteShard> shards, int kind) {
  const int me = comm.rank();
  std::vector<int> targets;
  for (const auto& p : t.pieces) {
    if (p.writer && internal::volume(p.shape) > 0) targets.push_back(p.rank);
  }
  std::sort(targets.begin(), targets.end());
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
  const auto k = static_cast<std::int64_t>(targets.size());
  const std::int64_t rows = t.full_shape[0];
  auto block_of = [&](std::int64_t j) {
    Box b{std::vector<std::int64_t>(t.full_shape.size(), 0), t.full_shape};
    b.off[0] = rows * j / k;
    b.shape[0] = rows * (j + 1) / k - b.off[0];
    return b;
  };
  const auto mine_it = std::find(targets.begin(), targets.end(), me);
  const bool is_target = mine_it != targets.end();
  const Box my_block = is_target ? block_of(mine_it - targets.begin()) : Box{};
  std::vector<float> block(is_target ? static_cast<std::size_t>(internal::volume(my_block.shape))
                                     : 0);

  std::vector<std::vector<float>> inbox;
  std::vector<Box> inbox_boxes;
  std::vector<std::vector<float>> outbox;
  // After the buffers: while an error unwinds, the requests are cancelled (mpi::Request::cancel)
  // before the buffers they name are freed.
  std::vector<mpi::Request> requests;
  // Every rank holds the same plan, so every rank refuses the same way.
  if (t.pieces.size() > static_cast<std::size_t>(mpi::tag_upper_bound()) + 1)
    ATLAS_THROW(Io, "checkpoint: a tensor in " << t.pieces.size() << " pieces needs MPI tags up to "
                                               << t.pieces.size() - 1 << ", above this MPI's MPI_TAG_UB = "
                                               << mpi::tag_upper_bound());
  for (std::size_t pi = 0; pi < t.pieces.size(); ++pi) {
    const Piece& p = t.pieces[pi];
    if (!p.writer || internal::volume(p.shape) == 0) continue;
    const Box pbox{p.offset, p.shape};
    const int tag = mpi::tags::checkpoint_piece(static_cast<int>(pi));
    Box part;
    if (is_target && p.rank != me && intersect(pbox, my_block, part)) {
      inbox.emplace_back(static_cast<std::size_t>(internal::volume(part.shape)));
      inbox_boxes.push_back(part);
      requests.push_back(comm.irecv(std::span<float>(inbox.back()), p.rank, tag));
    }
    if (p.rank != me) continue;
    const WriteShard& s = shards[static_cast<std::size_t>(p.local_index)];
    const float* src = kind == 0 ? s.value : kind == 1 ? s.adam_m : s.adam_v;
    for (std::int64_t j = 0; j < k; ++j) {
      const Box target = block_of(j);
      if (!intersect(pbox, target, part)) continue;
      if (targets[static_cast<std::size_t>(j)] == me) {
        copy_box(src, pbox, block.data(), my_block, part);
        continue;
      }
      outbox.emplace_back(static_cast<std::size_t>(internal::volume(part.shape)));
      copy_box(src, pbox, outbox.back().data(), part, part);
      requests.push_back(comm.isend(std::span<const float>(outbox.back()),
                                    targets[static_cast<std::size_t>(j)], tag));
    }
  }
  for (auto& r : requests) r.wait();
  for (std::size_t i = 0; i < inbox.size(); ++i) {
    copy_box(inbox[i].data(), inbox_boxes[i], block.data(), my_block, inbox_boxes[i]);
  }
  if (is_target && !block.empty()) {
    internal::transfer_box(dset, dxpl, internal::Direction::Write, &my_block.off,
                           &my_block.shape, block.data());
  }
}

void write_tensors(hid_t root, const mpi::Comm& comm, const Plan& plan,
                   std::span<const WriteShard> shards, const CrcTable& crcs, Transfer transfer) {
  h5::Group groups[3] = {h5::create_group(root, internal::kKindGroups[0]),
                         h5::create_group(root, internal::kKindGroups[1]),
                         h5::create_group(root, internal::kKindGroups[2])};
  // Contiguous, allocated at creation, never filled: every element is written by its owner, so
  // a fill pass would only double the I/O.
  h5::PropList dcpl(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  ATLAS_H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  ATLAS_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  ATLAS_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  h5::PropList coll_xfer(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  ATLAS_H5_CHECK(H5Pset_dxpl_mpio(coll_xfer.get(), H5FD_MPIO_COLLECTIVE));
  h5::PropList ind_xfer(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  ATLAS_H5_CHECK(H5Pset_dxpl_mpio(ind_xfer.get(), H5FD_MPIO_INDEPENDENT));
  auto is_writer = [](const Piece& p) { return p.writer; };
  const mpi::Comm exchange = comm.dup();  // own tag space for the redistribution messages
  const int me = comm.rank();
  for (const auto& [name, t] : plan) {
    const std::vector<hsize_t> dims(t.full_shape.begin(), t.full_shape.end());
    h5::Space space = h5::simple_space(dims);
    std::vector<const WriteShard*> mine;
    for (const auto& p : t.pieces) {
      if (p.rank == me && p.writer && internal::volume(p.shape) > 0) {
        mine.push_back(&shards[static_cast<std::size_t>(p.local_index)]);
      }
    }
    const bool strided = internal::has_strided_piece(t, is_writer);
    const bool redistribute = transfer == Transfer::Auto && strided;
    const bool collective = transfer == Transfer::Collective;
    const hid_t dxpl = collective ? coll_xfer.get() : ind_xfer.get();
    const int rounds = collective ? internal::max_pieces_per_rank(t, comm.size(), is_writer)
                                  : static_cast<int>(mine.size());
    for (int kind = 0; kind < 3; ++kind) {
      // Dataset creation is a metadata change: every rank makes it, identically, in plan order.
      h5::Dataset d(ATLAS_H5_CHECK(H5Dcreate2(groups[kind].get(), name.c_str(), H5T_IEEE_F32LE,
                                              space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
      write_box_crcs(d.get(), t, crcs, kind);
      if (redistribute) {
        write_redistributed(d.get(), ind_xfer.get(), exchange, t, shards, kind);
        continue;
      }
      for (int i = 0; i < rounds; ++i) {
        if (i < static_cast<int>(mine.size())) {
          const WriteShard& s = *mine[static_cast<std::size_t>(i)];
          const float* buf = kind == 0 ? s.value : kind == 1 ? s.adam_m : s.adam_v;
          internal::transfer_box(d.get(), dxpl, internal::Direction::Write, &s.offset,
                                 &s.shape, const_cast<float*>(buf));
        } else {
          internal::transfer_box(d.get(), dxpl, internal::Direction::Write, nullptr, nullptr,
                                 nullptr);
        }
      }
    }
  }
}

// ---- after the rename ----

struct OnDisk {
  std::int64_t step;
  bool tmp;
  std::string path;
};

std::vector<OnDisk> list_checkpoints(const std::string& dir) {
  std::vector<OnDisk> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    // A step past int64 (a stray file's name) is no checkpoint of ours: skipped, as find_latest
    // skips it (std::stoll threw out_of_range here and failed every later save).
    const auto name = internal::parse_checkpoint_name(entry.path().filename().string());
    if (name && name->step >= 0) out.push_back({name->step, name->tmp, entry.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const OnDisk& a, const OnDisk& b) { return a.step > b.step; });
  return out;
}

/// Keeps the checkpoint just written plus the keep_last - 1 newest older ones; removes .tmp
/// leftovers of steps up to this one. Never touches newer checkpoints (another timeline's, e.g.
/// after resuming from an older step): it warns about them instead, since `latest` would pick
/// them.
std::vector<std::string> prune(const std::string& dir, std::int64_t step, int keep_last) {
  std::vector<std::string> removed;
  int kept = 0;
  for (const auto& c : list_checkpoints(dir)) {
    if (c.tmp) {
      if (c.step <= step) {
        std::error_code ec;
        if (fs::remove(c.path, ec)) removed.push_back(c.path);
      }
      continue;
    }
    if (c.step > step) {
      log::warn("checkpoint '{}' (step {}) is newer than the one just written (step {}); "
                "run.resume = latest would pick it: remove it if it belongs to an abandoned run",
                c.path, c.step, step);
      continue;
    }
    if (keep_last <= 0 || kept < keep_last) {
      ++kept;
      continue;
    }
    std::error_code ec;
    if (!fs::remove(c.path, ec)) {
      log::warn("could not delete old checkpoint '{}': {}", c.path, ec.message());
    } else {
      removed.push_back(c.path);
    }
  }
  return removed;
}

}  // namespace

WriteResult write_checkpoint(const mpi::Comm& comm, const std::string& dir,
                             const CheckpointMeta& meta, std::span<const WriteShard> shards,
                             const WriteOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  h5::init();

  // ---- validate descriptors (every rank reaches the same verdict) ----
  std::vector<std::string> problems = internal::gather_problems(comm, local_problems(shards, meta));
  if (!problems.empty()) {
    ATLAS_THROW(Internal, "checkpoint step " << meta.step << ": bad shard descriptors:\n  "
                                             << fmt::format("{}", fmt::join(problems, "\n  ")));
  }
  std::vector<internal::ShardDesc> descs;
  descs.reserve(shards.size());
  for (const auto& s : shards) {
    descs.push_back({s.name, s.full_shape, s.offset, s.shape, s.writer, false, false});
  }
  Plan plan = internal::gather_plan(comm, descs, problems);
  coverage_problems(plan, problems);

  // ---- metadata: rank 0's fields, the union of every rank's state ----
  std::string created;
  CheckpointMeta m = merged_meta(comm, meta, created, problems);
  const CrcTable crcs = gather_crcs(comm, shards);
  if (!problems.empty()) {
    ATLAS_THROW(Internal, "checkpoint step " << meta.step << ": inconsistent shard descriptors:\n  "
                                             << fmt::format("{}", fmt::join(problems, "\n  ")));
  }
  const std::string final_path = checkpoint_path(dir, m.step);
  const std::string tmp_path = final_path + ".tmp";
  const std::string dir_or_cwd = dir.empty() ? "." : dir;

  // ---- directory ----
  (void)internal::run_on_root(comm, [&] {
    std::error_code ec;
    fs::create_directories(dir_or_cwd, ec);
    if (ec) ATLAS_THROW(Io, "cannot create checkpoint directory '" << dir << "': " << ec.message());
    // Creating the .tmp truncates what is there: through a symbolic link, another file.
    if (fs::is_symlink(fs::symlink_status(tmp_path, ec)))
      ATLAS_THROW(Io, "checkpoint '" << tmp_path << "' is a symbolic link: refused, never written through\n  "
                                     "hint: remove it (atlas writes a .tmp there, then renames it into place)");
    return std::string();
  });

  // ---- write the .tmp (collective) ----
  std::uint64_t tensor_bytes = 0;
  for (const auto& [name, t] : plan) {
    tensor_bytes += 3U * 4U * static_cast<std::uint64_t>(internal::volume(t.full_shape));
  }
  // Who fsyncs the .tmp: every rank that wrote tensor data, and one rank per node besides. A rank
  // without a shard writes too: parallel HDF5 spreads its metadata writes over all ranks at the
  // close, and MPI-IO's collective-buffering aggregators write other ranks' data; one fsync per
  // node flushes that node's page cache for the file.
  const bool node_first = comm.split_shared().rank() == 0;  // collective: never behind a short circuit
  bool wrote = comm.rank() == 0 || node_first;
  for (const auto& s : shards) wrote = wrote || (s.writer && s.numel() > 0);
  WriteResult result;
  auto lap = [clock = std::chrono::steady_clock::now()]() mutable {
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(now - std::exchange(clock, now)).count();
  };
  {
    h5::FileContext ctx(tmp_path);
    (void)lap();
    h5::File file = h5::create_file(tmp_path, comm);
    try {
      write_metadata(file.get(), m, created, comm.rank() == 0);
      write_tensors(file.get(), comm, plan, shards, crcs, options.transfer);
    } catch (const Error& e) {
      // A failure here is local to this rank (STYLE.md §5: the job aborts). Closing the file is
      // collective and the other ranks may never join it, so leave it open rather than hang
      // during unwinding. The .tmp stays behind (unlinked below on an I/O error) and find_latest
      // skips it.
      (void)file.release();
      if (e.code() != ExitCode::Io) throw;  // a peer's failure, an internal error: as they are
      // The HDF5 error stack names the call, not the cause: say what the user can do (a full
      // file system is the usual one) and that nothing written before is lost. The partial .tmp
      // is unlinked (a rank still writing keeps its inode until the job ends): its space comes
      // back when the job does.
      std::error_code ec;
      fs::remove(tmp_path, ec);
      const fs::space_info space = fs::space(fs::path(tmp_path).parent_path(), ec);
      throw Error(ExitCode::Io,
                  fmt::format("writing checkpoint '{}' failed{}\n  hint: the cause below says why (a full file "
                              "system is the usual one: free space or point ckpt.dir elsewhere); the checkpoints "
                              "written before are intact and run.resume = latest resumes from the newest (it skips "
                              "this .tmp)\n  cause: {}",
                              tmp_path,
                              ec ? std::string()
                                 : fmt::format(" ({} free on its file system)",
                                               units::format_bytes_human(static_cast<double>(space.available))),
                              e.what()));
    } catch (...) {
      (void)file.release();
      throw;
    }
    result.data_seconds = lap();
    file.close();  // collective; flushes metadata and data
    result.close_seconds = lap();
  }
  // MPI_File_close does not promise durability; fsync from every rank that wrote and one per node
  // (on a parallel file system each client holds its own dirty pages).
  if (wrote) fsync_path(tmp_path, false);
  result.sync_seconds = lap();

  // ---- test hook: a "crash" between the complete .tmp and the rename ----
  std::exception_ptr hook_error;
  std::vector<std::string> hook_problem;
  if (options.before_rename) {
    try {
      options.before_rename(tmp_path);
    } catch (const std::exception& e) {
      hook_error = std::current_exception();
      hook_problem.push_back(e.what());
    }
  }
  // Doubles as the barrier: nobody renames before every rank has closed and synced.
  const auto hook_problems = internal::gather_problems(comm, hook_problem);
  if (hook_error) std::rethrow_exception(hook_error);
  if (!hook_problems.empty()) {
    ATLAS_THROW(Io, "checkpoint '" << tmp_path << "' was not renamed: another rank failed before "
                                   << "the rename: " << hook_problems.front());
  }

  // ---- rename into place, prune (rank 0; the verdict reaches everyone) ----
  const std::string payload = internal::run_on_root(comm, [&] {
    std::error_code ec;
    fs::rename(tmp_path, final_path, ec);
    if (ec) {
      ATLAS_THROW(Io, "cannot rename '" << tmp_path << "' to '" << final_path << "': " << ec.message()
                                        << "\n  hint: the checkpoint is whole in the .tmp (run.resume = PATH of it "
                                           "after renaming it by hand); fix the directory (permissions, a directory "
                                           "of that name); the checkpoints written before are intact");
    }
    try {
      fsync_path(dir_or_cwd, true);  // makes the rename itself durable
    } catch (const Error& e) {
      ATLAS_THROW(Io, e.what() << "\n  hint: '" << final_path
                               << "' was renamed into place but the directory could not be synced (a crash of the "
                                  "machine may lose the name); older checkpoints were not pruned");
    }
    BlobWriter w;
    w.u64(fs::file_size(final_path, ec));
    const auto removed = prune(dir_or_cwd, m.step, options.keep_last);
    w.i64(static_cast<std::int64_t>(removed.size()));
    for (const auto& p : removed) w.str(p);
    return std::move(w.data());
  });
  BlobReader pr(payload);
  result.path = final_path;
  result.file_bytes = pr.u64();
  result.tensor_bytes = tensor_bytes;
  const auto n_removed = pr.i64();
  for (std::int64_t i = 0; i < n_removed; ++i) result.pruned.push_back(pr.str());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace atlas::io
