// SPDX-License-Identifier: MIT
// Checkpoint pieces shared by writer and reader: naming, descriptor (de)serialization, shard
// validation, collective agreement, and the read-only side that needs no MPI-IO: inspecting a
// file, finding the newest readable checkpoint, resolving run.resume.
#include "atlas/io/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include "atlas/core/check.hpp"
#include "atlas/core/crc32c.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/log.hpp"
#include "atlas/io/hdf5.hpp"
#include "ckpt_internal.hpp"

namespace fs = std::filesystem;

namespace atlas::io {

namespace internal {

// ---- serializer ----

void BlobReader::need(std::size_t n) const {
  ATLAS_ASSERT(m_pos + n <= m_data.size(),
               "checkpoint descriptor blob ends early (" << m_data.size() << " bytes, need "
                                                         << m_pos + n << ")");
}

void put_meta(BlobWriter& w, const CheckpointMeta& m) {
  w.i64(m.step);
  w.str(m.git_sha);
  w.str(m.deck);
  w.i64(m.layout.dc_count);
  w.i64(m.layout.pp_size);
  w.i64(m.layout.dp_size);
  w.i64(m.layout.tp_size);
  w.i64s(m.layout.stages_per_dc);
  w.i64(m.model.layers);
  w.i64(m.model.hidden);
  w.i64(m.model.heads);
  w.i64(m.model.seq_len);
  w.i64(m.model.vocab);
  w.i64(static_cast<std::int64_t>(m.state.size()));
  for (const auto& [name, words] : m.state) {
    w.str(name);
    w.u64s(words);
  }
}

CheckpointMeta get_meta(BlobReader& r) {
  CheckpointMeta m;
  m.step = r.i64();
  m.git_sha = r.str();
  m.deck = r.str();
  m.layout.dc_count = r.i64();
  m.layout.pp_size = r.i64();
  m.layout.dp_size = r.i64();
  m.layout.tp_size = r.i64();
  m.layout.stages_per_dc = r.i64s();
  m.model.layers = r.i64();
  m.model.hidden = r.i64();
  m.model.heads = r.i64();
  m.model.seq_len = r.i64();
  m.model.vocab = r.i64();
  const auto n = r.i64();
  for (std::int64_t i = 0; i < n; ++i) {
    std::string name = r.str();
    m.state[name] = r.u64s();
  }
  return m;
}

void put_contents(BlobWriter& w, const CheckpointContents& c) {
  w.str(c.path);
  put_meta(w, c.meta);
  w.i64(static_cast<std::int64_t>(c.tensors.size()));
  for (const auto& t : c.tensors) {
    w.str(t.name);
    w.i64s(t.shape);
    w.i64(t.has_adam ? 1 : 0);
    for (const auto& boxes : t.checksums) {
      w.i64(static_cast<std::int64_t>(boxes.size()));
      for (const auto& b : boxes) {
        w.i64s(b.offset);
        w.i64s(b.shape);
        w.u64(b.crc);
      }
    }
  }
  w.i64(c.checksummed ? 1 : 0);
}

CheckpointContents get_contents(BlobReader& r) {
  CheckpointContents c;
  c.path = r.str();
  c.meta = get_meta(r);
  const auto n = r.i64();
  for (std::int64_t i = 0; i < n; ++i) {
    TensorEntry t;
    t.name = r.str();
    t.shape = r.i64s();
    t.has_adam = r.i64() != 0;
    for (auto& boxes : t.checksums) {
      boxes.resize(static_cast<std::size_t>(r.i64()));
      for (auto& b : boxes) {
        b.offset = r.i64s();
        b.shape = r.i64s();
        b.crc = static_cast<std::uint32_t>(r.u64());
      }
    }
    c.tensors.push_back(std::move(t));
  }
  c.checksummed = r.i64() != 0;
  return c;
}

// ---- shards ----

std::int64_t volume(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

bool contiguous_box(const std::vector<std::int64_t>& full, const std::vector<std::int64_t>& shape) {
  std::size_t d = 0;
  while (d < shape.size() && shape[d] == 1) ++d;  // leading unit extents
  ++d;                                            // the one partial dimension
  for (; d < shape.size(); ++d) {
    if (shape[d] != full[d]) return false;
  }
  return true;
}

std::string dims_str(const std::vector<std::int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

std::vector<std::string> shard_problems(const std::string& name,
                                        const std::vector<std::int64_t>& full_shape,
                                        const std::vector<std::int64_t>& offset,
                                        const std::vector<std::int64_t>& shape) {
  std::vector<std::string> out;
  if (name.empty() || name == "." || name == ".." ||
      name.find_first_of(std::string("/\t\n\0", 4)) != std::string::npos) {
    out.push_back(fmt::format("tensor name '{}' is not usable as an HDF5 dataset name "
                              "(it must be non-empty and contain no '/', tab, newline or NUL)",
                              name));
    return out;
  }
  if (full_shape.empty()) {
    out.push_back(fmt::format("tensor '{}' has an empty full_shape (rank 0 is not supported)", name));
    return out;
  }
  if (offset.size() != full_shape.size() || shape.size() != full_shape.size()) {
    out.push_back(fmt::format("tensor '{}': full_shape {}, offset {} and shape {} must have the "
                              "same number of dimensions",
                              name, dims_str(full_shape), dims_str(offset), dims_str(shape)));
    return out;
  }
  for (std::size_t d = 0; d < full_shape.size(); ++d) {
    if (full_shape[d] < 0 || offset[d] < 0 || shape[d] < 0 ||
        offset[d] + shape[d] > full_shape[d]) {
      out.push_back(fmt::format("tensor '{}': shard offset {} + shape {} does not fit in the "
                                "full shape {} (dimension {})",
                                name, dims_str(offset), dims_str(shape), dims_str(full_shape), d));
      break;
    }
  }
  return out;
}

Plan gather_plan(const mpi::Comm& comm, const std::vector<ShardDesc>& mine,
                 std::vector<std::string>& problems) {
  BlobWriter w;
  w.i64(static_cast<std::int64_t>(mine.size()));
  for (const auto& d : mine) {
    w.str(d.name);
    w.i64s(d.full_shape);
    w.i64s(d.offset);
    w.i64s(d.shape);
    w.i64((d.writer ? 1 : 0) | (d.want_m ? 2 : 0) | (d.want_v ? 4 : 0));
  }
  const auto all = comm.allgather_strings(w.data());
  Plan plan;
  for (std::size_t r = 0; r < all.size(); ++r) {
    BlobReader rd(all[r]);
    const auto n = rd.i64();
    for (std::int64_t i = 0; i < n; ++i) {
      Piece p;
      p.rank = static_cast<int>(r);
      p.local_index = static_cast<int>(i);
      const std::string name = rd.str();
      auto full = rd.i64s();
      p.offset = rd.i64s();
      p.shape = rd.i64s();
      const auto flags = rd.i64();
      p.writer = (flags & 1) != 0;
      p.want_m = (flags & 2) != 0;
      p.want_v = (flags & 4) != 0;
      auto [it, fresh] = plan.try_emplace(name);
      if (fresh) {
        it->second.full_shape = std::move(full);
      } else if (it->second.full_shape != full) {
        problems.push_back(fmt::format("tensor '{}' has full shape {} on rank {} but {} on rank {}",
                                       name, dims_str(full), r, dims_str(it->second.full_shape),
                                       it->second.pieces.front().rank));
      }
      it->second.pieces.push_back(std::move(p));
    }
  }
  return plan;
}

// ---- collective agreement ----

std::vector<std::string> gather_problems(const mpi::Comm& comm,
                                         const std::vector<std::string>& mine, bool rank_prefix) {
  BlobWriter w;
  w.i64(static_cast<std::int64_t>(mine.size()));
  for (const auto& p : mine) w.str(p);
  const auto all = comm.allgather_strings(w.data());
  std::vector<std::string> out;
  for (std::size_t r = 0; r < all.size(); ++r) {
    BlobReader rd(all[r]);
    const auto n = rd.i64();
    for (std::int64_t i = 0; i < n; ++i) {
      std::string p = rd.str();
      out.push_back(comm.size() > 1 && rank_prefix ? fmt::format("[rank {}] {}", r, p) : p);
    }
  }
  return out;
}

// ---- checksums ----

static_assert(std::endian::native == std::endian::little,
              "checkpoint checksums are taken over the little-endian bytes in memory");

std::uint32_t crc_of(const float* data, std::int64_t n) {
  return crc32c(data, static_cast<std::size_t>(n) * sizeof(float));
}

std::uint32_t crc_of(const std::uint64_t* data, std::size_t n) {
  return crc32c(data, n * sizeof(std::uint64_t));
}

std::string mismatch_text(const std::string& path, const std::string& dataset,
                          const std::string& box, std::uint32_t stored, std::uint32_t computed) {
  return fmt::format("checkpoint '{}': dataset {}{}: checksum mismatch (stored crc32c 0x{:08x}, "
                     "data gives 0x{:08x}): the file changed after it was written\n  hint: use another "
                     "copy of it or an earlier checkpoint (a run: run.resume = latest skips damaged files)",
                     path, dataset, box, stored, computed);
}

// ---- hyperslab transfer ----

void transfer_box(hid_t dset, hid_t dxpl, Direction dir, const std::vector<std::int64_t>* offset,
                  const std::vector<std::int64_t>* shape, void* buf) {
  h5::Space file_space(ATLAS_H5_CHECK(H5Dget_space(dset)));
  h5::Space mem_space;
  float dummy = 0.0F;  // HDF5 wants a buffer even for an empty selection
  if (offset == nullptr || volume(*shape) == 0) {
    const hsize_t one = 1;
    mem_space = h5::simple_space({&one, 1});
    ATLAS_H5_CHECK(H5Sselect_none(mem_space.get()));
    ATLAS_H5_CHECK(H5Sselect_none(file_space.get()));
    buf = &dummy;
  } else {
    const std::vector<hsize_t> start(offset->begin(), offset->end());
    const std::vector<hsize_t> count(shape->begin(), shape->end());
    ATLAS_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                       count.data(), nullptr));
    mem_space = h5::simple_space(count);
  }
  if (dir == Direction::Write) {
    ATLAS_H5_CHECK(H5Dwrite(dset, H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), dxpl, buf));
  } else {
    ATLAS_H5_CHECK(H5Dread(dset, H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), dxpl, buf));
  }
}

}  // namespace internal

using internal::BlobReader;
using internal::BlobWriter;

// ---- naming ----

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  const std::string file = fmt::format("step-{:06d}.h5", step);
  return dir.empty() ? file : (fs::path(dir) / file).string();
}

std::optional<internal::CheckpointName> internal::parse_checkpoint_name(const std::string& name) {
  static const std::regex kName(R"(^step-([0-9]+)\.h5(\.tmp)?$)");
  std::smatch m;
  if (!std::regex_match(name, m, kName)) return std::nullopt;
  CheckpointName out;
  out.tmp = m[2].matched;
  const std::string digits = m[1].str();
  if (std::from_chars(digits.data(), digits.data() + digits.size(), out.step).ec != std::errc()) out.step = -1;
  // Only the name atlas gives a step (checkpoint_path: six digits, more without a leading zero):
  // step-0000150.h5 is not step 150's second file, which resume and pruning would tie with it.
  else if (digits != fmt::format("{:06d}", out.step))
    return std::nullopt;
  return out;
}

std::vector<std::string> model_mismatches(const std::string& path, const ModelShape& in_file,
                                          const ModelShape& in_deck) {
  std::vector<std::string> out;
  auto cmp = [&](const char* field, std::int64_t f, std::int64_t d) {
    if (f != d) {
      out.push_back(fmt::format("checkpoint '{}': model.{} is {} in the checkpoint but {} in the "
                                "deck\n  hint: set model.{} = {} as the run that wrote it had, or start "
                                "fresh without run.resume (atlas import reads weights of another shape "
                                "only from a Hugging Face GPT-2)",
                                path, field, f, d, field, f));
    }
  };
  cmp("layers", in_file.layers, in_deck.layers);
  cmp("hidden", in_file.hidden, in_deck.hidden);
  cmp("heads", in_file.heads, in_deck.heads);
  cmp("seq_len", in_file.seq_len, in_deck.seq_len);
  cmp("vocab", in_file.vocab, in_deck.vocab);
  return out;
}

// ---- inspect ----

namespace {

/// The longest /state vector a checkpoint may hold (atlas keeps a few words per entry: the data
/// loader's position, the step counters); a longer one is a damaged or foreign file.
constexpr std::uint64_t kMaxStateWords = std::uint64_t{1} << 24;

std::string stack_item_with(const std::string& stack, const std::string& needle) {
  const auto at = stack.find(needle);
  if (at == std::string::npos) return stack;
  auto begin = stack.rfind("; ", at);
  begin = begin == std::string::npos ? 0 : begin + 2;
  auto end = stack.find("; ", at);
  return stack.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

h5::File open_for_inspection(const std::string& path) {
  h5::init();
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw ConfigError(fmt::format("checkpoint '{}' does not exist", path));
  }
  if (fs::is_directory(status)) {
    // A run's checkpoint directory where its file was meant: name the newest one in it.
    std::string newest;
    std::int64_t newest_step = -1;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const auto n = internal::parse_checkpoint_name(e.path().filename().string());
      if (n && !n->tmp && n->step > newest_step) {
        newest_step = n->step;
        newest = e.path().string();
      }
    }
    throw ConfigError(fmt::format("checkpoint '{}' is a directory, not a checkpoint file\n  hint: {}", path,
                                  newest.empty() ? "name a step-NNNNNN.h5 file (this directory holds none)"
                                                 : "its newest checkpoint is " + newest));
  }
  if (!fs::is_regular_file(status)) {
    throw ConfigError(fmt::format("checkpoint '{}' is not a regular file", path));
  }
  const auto bytes = fs::file_size(path, ec);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id >= 0) return h5::File(id);
  const std::string stack = h5::error_stack();
  H5Eclear2(H5E_DEFAULT);
  if (stack.find("truncated file") != std::string::npos) {
    throw ConfigError(fmt::format("checkpoint '{}' is truncated: the file has {} bytes, less "
                                  "than HDF5 recorded when it was written (HDF5: {})",
                                  path, bytes, stack_item_with(stack, "truncated file")));
  }
  if (stack.find("signature") != std::string::npos) {
    throw ConfigError(fmt::format("checkpoint '{}' is not an HDF5 file ({} bytes, no HDF5 "
                                  "signature): it is corrupt or was never completed",
                                  path, bytes));
  }
  throw ConfigError(fmt::format("checkpoint '{}' cannot be opened by HDF5: {}", path, stack));
}

void check_format(hid_t root, const std::string& path) {
  if (!h5::has_attr(root, "format")) {
    throw ConfigError(fmt::format("'{}' is not an atlas checkpoint: it has no 'format' attribute",
                                  path));
  }
  const std::string format = h5::read_attr_string(root, "format");
  if (format != kCkptFormatName) {
    throw ConfigError(fmt::format("'{}' is not an atlas checkpoint: its format is '{}', "
                                  "expected '{}'",
                                  path, format, kCkptFormatName));
  }
  if (!h5::has_attr(root, "format_version")) {
    throw ConfigError(fmt::format("checkpoint '{}' has no 'format_version' attribute", path));
  }
  const std::int64_t version = h5::read_attr_int(root, "format_version");
  if (version != kCkptFormatVersion) {
    throw ConfigError(fmt::format(
        "checkpoint '{}' has format version {}, but this build of atlas reads version {}\n"
        "  hint: use an atlas build of the matching version, or start without run.resume",
        path, version, kCkptFormatVersion));
  }
}

struct StateVisit {
  hid_t group = -1;
  std::vector<std::string> datasets;
};

herr_t visit_state(hid_t group, const char* name, const H5L_info_t* /*info*/, void* data) {
  auto* v = static_cast<StateVisit*>(data);
  const hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
  if (obj < 0) return -1;
  if (H5Iget_type(obj) == H5I_DATASET) v->datasets.emplace_back(name);
  H5Oclose(obj);
  return 0;
}

/// The stored `crc32c` of a whole (one-box) dataset. Throws atlas::Error when it is missing or
/// not one value (the file is corrupt: it declares checksums).
std::uint32_t stored_crc(hid_t obj, const std::string& dataset) {
  if (!h5::has_attr(obj, internal::kCrcAttr)) {
    ATLAS_THROW(Io, "dataset " << dataset << " has no '" << internal::kCrcAttr
                               << "' attribute although the file declares checksums");
  }
  const auto v = h5::read_attr_ints(obj, internal::kCrcAttr);
  if (v.size() != 1) {
    ATLAS_THROW(Io, "dataset " << dataset << ": '" << internal::kCrcAttr << "' holds " << v.size()
                               << " values, expected 1");
  }
  return static_cast<std::uint32_t>(v[0]);
}

/// Throws atlas::Error (the file is corrupt) naming the first two of `boxes` (all of one rank)
/// that share an element. Empty boxes share none. A sweep along dimension 0: n log n for boxes
/// that split it (row blocks), n^2 at worst (n, the writer shards of one tensor, is small).
void check_boxes_disjoint(const std::vector<BoxChecksum>& boxes, const std::string& dataset) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    if (internal::volume(boxes[i].shape) > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(boxes[a].offset[0], a) < std::pair(boxes[b].offset[0], b);
  });
  const auto overlap = [&](const BoxChecksum& a, const BoxChecksum& b) {
    for (std::size_t d = 0; d < a.offset.size(); ++d) {
      if (a.offset[d] + a.shape[d] <= b.offset[d] || b.offset[d] + b.shape[d] <= a.offset[d]) {
        return false;
      }
    }
    return true;
  };
  for (std::size_t k = 0; k < order.size(); ++k) {
    const BoxChecksum& a = boxes[order[k]];
    // Later boxes start at or after a's start along dimension 0; only those starting before
    // a's end there can meet it.
    for (std::size_t j = k + 1;
         j < order.size() && boxes[order[j]].offset[0] < a.offset[0] + a.shape[0]; ++j) {
      if (!overlap(a, boxes[order[j]])) continue;
      const std::size_t lo = std::min(order[k], order[j]);
      const std::size_t hi = std::max(order[k], order[j]);
      ATLAS_THROW(Io, "dataset " << dataset << ": checksum boxes " << lo << " (offset "
                                 << internal::dims_str(boxes[lo].offset) << ", shape "
                                 << internal::dims_str(boxes[lo].shape) << ") and " << hi
                                 << " (offset " << internal::dims_str(boxes[hi].offset)
                                 << ", shape " << internal::dims_str(boxes[hi].shape)
                                 << ") overlap: part of the tensor would never be verified");
    }
  }
}

/// The stored box checksums of a tensor dataset of `shape`; they must tile it: each box inside
/// it, no two overlapping, and no gap.
std::vector<BoxChecksum> stored_boxes(hid_t d, const std::string& dataset,
                                      const std::vector<std::int64_t>& shape) {
  if (!h5::has_attr(d, internal::kCrcAttr)) {
    ATLAS_THROW(Io, "dataset " << dataset << " has no '" << internal::kCrcAttr
                               << "' attribute although the file declares checksums");
  }
  const auto crcs = h5::read_attr_ints(d, internal::kCrcAttr);
  const auto rank = shape.size();
  std::vector<std::int64_t> flat;
  if (h5::has_attr(d, internal::kCrcBoxesAttr)) {
    flat = h5::read_attr_ints(d, internal::kCrcBoxesAttr);
  } else {  // one box: the whole dataset
    flat.assign(rank, 0);
    flat.insert(flat.end(), shape.begin(), shape.end());
  }
  if (crcs.empty() || flat.size() != crcs.size() * 2 * rank) {
    ATLAS_THROW(Io, "dataset " << dataset << ": " << crcs.size() << " checksums but "
                               << flat.size() << " box coordinates (expected " << 2 * rank
                               << " per checksum)");
  }
  std::vector<BoxChecksum> out(crcs.size());
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto row = flat.begin() + static_cast<std::ptrdiff_t>(i * 2 * rank);
    out[i].offset.assign(row, row + static_cast<std::ptrdiff_t>(rank));
    out[i].shape.assign(row + static_cast<std::ptrdiff_t>(rank),
                        row + static_cast<std::ptrdiff_t>(2 * rank));
    out[i].crc = static_cast<std::uint32_t>(crcs[i]);
    if (!internal::shard_problems("box", shape, out[i].offset, out[i].shape).empty()) {
      ATLAS_THROW(Io, "dataset " << dataset << ": checksum box " << i << " (offset "
                                 << internal::dims_str(out[i].offset) << ", shape "
                                 << internal::dims_str(out[i].shape) << ") lies outside "
                                 << internal::dims_str(shape));
    }
    covered += internal::volume(out[i].shape);
  }
  // Inside the dataset and pairwise disjoint, the boxes cover it exactly once if and only if
  // their volumes add up; a sum alone would pass boxes that overlap and leave a gap unverified.
  check_boxes_disjoint(out, dataset);
  if (covered != internal::volume(shape)) {
    ATLAS_THROW(Io, "dataset " << dataset << ": the checksum boxes cover " << covered << " of "
                               << internal::volume(shape) << " elements");
  }
  return out;
}

/// Checks one tensor dataset's type and that its bytes lie inside the file; with `boxes`, reads
/// its stored checksums.
std::vector<std::int64_t> check_tensor_dataset(hid_t parent, const std::string& group,
                                               const std::string& name, std::uintmax_t file_bytes,
                                               std::vector<BoxChecksum>* boxes = nullptr) {
  h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(parent, name.c_str(), H5P_DEFAULT)));
  h5::Type t(ATLAS_H5_CHECK(H5Dget_type(d.get())));
  if (H5Tget_class(t.get()) != H5T_FLOAT || H5Tget_size(t.get()) != 4) {
    ATLAS_THROW(Io, "dataset /" << group << "/" << name << " is not float32");
  }
  std::vector<std::int64_t> shape;
  for (auto v : h5::dataset_dims(d.get())) shape.push_back(static_cast<std::int64_t>(v));
  const std::uint64_t need = static_cast<std::uint64_t>(internal::volume(shape)) * 4U;
  if (need > 0) {
    const haddr_t off = H5Dget_offset(d.get());
    if (off == HADDR_UNDEF) {
      ATLAS_THROW(Io, "dataset /" << group << "/" << name << " has no storage allocated");
    }
    if (off + need > file_bytes) {
      ATLAS_THROW(Io, "dataset /" << group << "/" << name << " ends at byte " << off + need
                                  << " but the file has " << file_bytes << " bytes");
    }
  }
  if (boxes) *boxes = stored_boxes(d.get(), "/" + group + "/" + name, shape);
  return shape;
}

}  // namespace

CheckpointContents inspect_checkpoint(const std::string& path) {
  h5::File file = open_for_inspection(path);
  h5::FileContext ctx(path);
  const hid_t root = file.get();
  CheckpointContents c;
  c.path = path;
  try {
    check_format(root, path);  // ConfigError passes through; atlas::Error means corrupt
    if (h5::has_attr(root, "checksum")) {
      const std::string algo = h5::read_attr_string(root, "checksum");
      if (algo != kCkptChecksum) {
        throw ConfigError(fmt::format("checkpoint '{}' uses checksum '{}', but this build of "
                                      "atlas knows only '{}'",
                                      path, algo, kCkptChecksum));
      }
      c.checksummed = true;
    }
    // Files written before checksums have none anywhere; a file whose datasets carry crc32c but
    // whose root attribute is gone was altered after it was written (deleting that one attribute
    // would otherwise switch every check off).
    if (!c.checksummed && h5::exists(root, "deck")) {
      h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(root, "deck", H5P_DEFAULT)));
      if (h5::has_attr(d.get(), "crc32c"))
        throw ChecksumMismatch(fmt::format(
            "checkpoint '{}': its datasets carry CRC32C checksums but the root attribute 'checksum' is missing: "
            "the file was changed after atlas wrote it (checksum mismatch)\n  hint: use another copy of the "
            "checkpoint, or an earlier one",
            path));
    }
    const bool sums = c.checksummed;
    std::error_code ec;
    const auto file_bytes = fs::file_size(path, ec);
    CheckpointMeta& m = c.meta;
    m.step = h5::read_attr_int(root, "step");
    m.git_sha = h5::read_attr_string(root, "git_sha");
    m.deck = h5::read_string_dataset(root, "deck");
    if (sums) {
      h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(root, "deck", H5P_DEFAULT)));
      const std::uint32_t want = stored_crc(d.get(), "/deck");
      const std::uint32_t got = crc32c(m.deck.data(), m.deck.size());
      if (want != got) throw ChecksumMismatch(internal::mismatch_text(path, "/deck", "", want, got));
    }
    {
      h5::Group g = h5::open_group(root, "layout");
      m.layout.dc_count = h5::read_attr_int(g.get(), "dc_count");
      m.layout.pp_size = h5::read_attr_int(g.get(), "pp_size");
      m.layout.dp_size = h5::read_attr_int(g.get(), "dp_size");
      m.layout.tp_size = h5::read_attr_int(g.get(), "tp_size");
      m.layout.stages_per_dc = h5::read_attr_ints(g.get(), "stages_per_dc");
    }
    {
      h5::Group g = h5::open_group(root, "model");
      m.model.layers = h5::read_attr_int(g.get(), "layers");
      m.model.hidden = h5::read_attr_int(g.get(), "hidden");
      m.model.heads = h5::read_attr_int(g.get(), "heads");
      m.model.seq_len = h5::read_attr_int(g.get(), "seq_len");
      m.model.vocab = h5::read_attr_int(g.get(), "vocab");
    }
    {
      h5::Group g = h5::open_group(root, "state");
      StateVisit visit{g.get(), {}};
      ATLAS_H5_CHECK(H5Lvisit(g.get(), H5_INDEX_NAME, H5_ITER_INC, visit_state, &visit));
      for (const auto& name : visit.datasets) {
        h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(g.get(), name.c_str(), H5P_DEFAULT)));
        const auto dims = h5::dataset_dims(d.get());
        // atlas writes each state entry as one vector of words: anything else (another rank, a
        // size past any state atlas keeps) is a damaged or foreign file, read into nothing.
        if (dims.size() > 1 || (!dims.empty() && dims[0] > kMaxStateWords))
          ATLAS_THROW(Io, fmt::format("dataset /state/{} has shape [{}]; atlas writes a vector of at most {} words "
                                      "there",
                                      name, fmt::join(dims, ", "), kMaxStateWords));
        std::vector<std::uint64_t> words(dims.empty() ? 1 : dims[0]);
        if (!words.empty()) {
          ATLAS_H5_CHECK(
              H5Dread(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, words.data()));
        }
        if (sums) {
          const std::string where = "/state/" + name;
          const std::uint32_t want = stored_crc(d.get(), where);
          const std::uint32_t got = internal::crc_of(words.data(), words.size());
          if (want != got) throw ChecksumMismatch(internal::mismatch_text(path, where, "", want, got));
        }
        m.state[name] = std::move(words);
      }
    }
    h5::Group params = h5::open_group(root, "params");
    h5::Group adam_m = h5::open_group(root, "adam_m");
    h5::Group adam_v = h5::open_group(root, "adam_v");
    for (const auto& name : h5::list_links(params.get())) {
      TensorEntry t;
      t.name = name;
      t.shape = check_tensor_dataset(params.get(), "params", name, file_bytes,
                                     sums ? &t.checksums[0] : nullptr);
      const bool has_m = h5::exists(adam_m.get(), name);
      const bool has_v = h5::exists(adam_v.get(), name);
      if (has_m != has_v) ATLAS_THROW(Io, "tensor '" << name << "' has only one AdamW moment");
      if (has_m) {
        int kind = 1;
        for (auto [g, gname] : {std::pair{adam_m.get(), "adam_m"}, std::pair{adam_v.get(), "adam_v"}}) {
          if (check_tensor_dataset(g, gname, name, file_bytes,
                                   sums ? &t.checksums[kind++] : nullptr) != t.shape) {
            ATLAS_THROW(Io, "/" << gname << "/" << name << " and /params/" << name
                                << " have different shapes");
          }
        }
      }
      t.has_adam = has_m;
      c.tensors.push_back(std::move(t));
    }
  } catch (const ChecksumMismatch&) {
    throw;  // already names the file and the dataset; exit code 5, not a config error
  } catch (const Error& e) {
    throw ConfigError(
        fmt::format("checkpoint '{}' is corrupt or incomplete: {}", path, e.what()));
  }
  return c;
}

CheckpointContents inspect_checkpoint(const mpi::Comm& comm, const std::string& path) {
  const std::string bytes = internal::run_on_root(comm, [&] {
    BlobWriter w;
    internal::put_contents(w, inspect_checkpoint(path));
    return std::move(w.data());
  });
  BlobReader r(bytes);
  return internal::get_contents(r);
}

// ---- set_aside_checkpoints / find_latest / resolve_resume ----

std::optional<std::int64_t> checkpoint_step_of(const std::string& path) {
  const auto n = internal::parse_checkpoint_name(fs::path(path).filename().string());
  if (!n || n->tmp || n->step < 0) return std::nullopt;
  return n->step;
}

MovedAside set_aside_checkpoints(const std::string& dir, const std::string& why, std::int64_t after_step) {
  // Links too: run.resume = latest and pruning follow a linked step-*.h5 as this run's.
  return move_aside(
      dir,
      [after_step](const std::string& name) {
        const auto n = internal::parse_checkpoint_name(name);
        return n.has_value() && (n->step < 0 || n->step > after_step);
      },
      why, /*links_too=*/true);
}

LatestCheckpoint find_latest(const std::string& dir, std::int64_t before_step) {
  LatestCheckpoint out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    // Missing is a first run; unreadable (EACCES, EIO) must not look like one.
    if (ec && ec != std::errc::no_such_file_or_directory)
      ATLAS_THROW(Io, "run.resume = latest: cannot look into checkpoint directory '"
                          << dir << "': " << ec.message()
                          << "\n  hint: fix its permissions or its file system; starting from step 0 would train over "
                             "the run that is there");
    return out;
  }
  struct Candidate {
    std::int64_t step;
    bool tmp;
    std::string path;
  };
  std::vector<Candidate> found;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = internal::parse_checkpoint_name(it->path().filename().string());
    if (!name) continue;
    if (name->step < 0) {
      out.skipped.push_back({it->path().string(), "its step number does not fit 64 bits: not a checkpoint atlas wrote"});
      continue;
    }
    if (name->step < before_step) found.push_back({name->step, name->tmp, it->path().string()});
  }
  if (ec)
    ATLAS_THROW(Io, "run.resume = latest: cannot list checkpoint directory '"
                        << dir << "': " << ec.message()
                        << "\n  hint: fix its permissions or its file system; starting from step 0 would train over "
                           "the run that is there");
  // Newest first; for one step the .tmp (a later, interrupted rewrite) is reported first.
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.tmp > b.tmp;
  });
  for (const auto& c : found) {
    if (c.tmp) {
      out.skipped.push_back({c.path, "temporary file of an interrupted write (never renamed)"});
      continue;
    }
    // A file this process cannot open (permissions, an I/O error) is not a damaged one to step
    // over: resuming from an older file, or from step 0, would silently fork the run.
    // (O_NONBLOCK: a FIFO named step-*.h5 must not block rank 0; inspect then refuses it.)
    if (const int fd = ::open(c.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK); fd >= 0) {
      ::close(fd);
    } else if (errno != ENOENT) {
      ATLAS_THROW(Io, "run.resume = latest: cannot open checkpoint '"
                          << c.path << "': " << std::strerror(errno)
                          << "\n  hint: fix its permissions or its file system and start again (it is the newest "
                             "checkpoint; an older one would repeat steps), or move it away to resume from the one "
                             "before it");
    } else {
      continue;  // removed since the listing (another job pruning): not a candidate
    }
    try {
      const CheckpointContents contents = inspect_checkpoint(c.path);
      if (contents.meta.step != c.step) {
        out.skipped.push_back({c.path, fmt::format("its step attribute says step {}, its name step {}: renamed by hand, "
                                                   "or damaged",
                                                   contents.meta.step, c.step)});
        continue;
      }
      out.path = c.path;
      out.step = contents.meta.step;
      return out;
    } catch (const ConfigError& e) {
      out.skipped.push_back({c.path, e.what()});
    } catch (const ChecksumMismatch& e) {
      out.skipped.push_back({c.path, e.what()});
    }
  }
  return out;
}

LatestCheckpoint find_latest(const mpi::Comm& comm, const std::string& dir,
                             std::int64_t before_step) {
  const std::string bytes = internal::run_on_root(comm, [&] {
    const LatestCheckpoint l = find_latest(dir, before_step);
    BlobWriter w;
    w.str(l.path);
    w.i64(l.step);
    w.i64(static_cast<std::int64_t>(l.skipped.size()));
    for (const auto& s : l.skipped) {
      w.str(s.path);
      w.str(s.reason);
    }
    return std::move(w.data());
  });
  BlobReader r(bytes);
  LatestCheckpoint l;
  l.path = r.str();
  l.step = r.i64();
  const auto n = r.i64();
  for (std::int64_t i = 0; i < n; ++i) {
    SkippedCheckpoint s;
    s.path = r.str();
    s.reason = r.str();
    l.skipped.push_back(std::move(s));
  }
  return l;
}

namespace {

/// Logs what find_latest found (rank 0): each skipped file with its reason, then the choice.
void log_latest(const mpi::Comm& comm, const LatestCheckpoint& l, const std::string& ckpt_dir) {
  if (comm.rank() == 0) {
    for (const auto& s : l.skipped) {
      log::warn("run.resume = latest: skipping '{}': {}", s.path, s.reason);
    }
  }
  if (!l.found()) {
    log::info("run.resume = latest: no readable checkpoint in '{}'; starting from step 0",
              ckpt_dir);
    return;
  }
  log::info("run.resume = latest: resuming from '{}' (step {}){}", l.path, l.step,
            l.skipped.empty() ? std::string()
                              : fmt::format(", the newest readable one ({} newer file(s) "
                                            "skipped)",
                                            l.skipped.size()));
}

}  // namespace

std::string resolve_resume(const mpi::Comm& comm, const std::string& resume,
                           const std::string& ckpt_dir) {
  if (resume.empty()) return "";
  if (resume == "latest") {
    const LatestCheckpoint l = find_latest(comm, ckpt_dir);
    log_latest(comm, l, ckpt_dir);
    return l.path;
  }
  try {
    (void)inspect_checkpoint(comm, resume);  // throws a ConfigError naming the file
  } catch (const ConfigError& e) {
    std::vector<std::string> problems = e.problems();
    if (!problems.empty())
      problems.back() += "\n  hint: name another checkpoint (an older step-*.h5), or use run.resume = latest (it "
                         "passes over damaged files in ckpt.dir), or start fresh without run.resume";
    throw ConfigError(problems);
  }
  return resume;
}

std::optional<Resumed> resume_checkpoint(const mpi::Comm& comm, const std::string& resume,
                                         const std::string& ckpt_dir,
                                         std::span<const ReadShard> shards,
                                         const ReadOptions& options) {
  if (resume != "latest") {
    const std::string path = resolve_resume(comm, resume, ckpt_dir);
    if (path.empty()) return std::nullopt;
    return Resumed{path, read_checkpoint(comm, path, shards, options)};
  }
  std::int64_t before = INT64_MAX;
  std::vector<std::string> damaged;
  for (;;) {
    const LatestCheckpoint l = find_latest(comm, ckpt_dir, before);
    const auto unreadable = std::count_if(l.skipped.begin(), l.skipped.end(), [](const SkippedCheckpoint& s) {
      return !s.path.ends_with(".tmp");
    });
    if (!l.found() && damaged.empty() && unreadable > 0) {
      if (comm.rank() == 0)
        for (const auto& sk : l.skipped) log::warn("run.resume = latest: cannot use '{}': {}", sk.path, sk.reason);
      throw ConfigError(fmt::format(
          "run.resume = latest: '{}' holds {} checkpoint(s), and none can be read (each is named above with its "
          "reason): starting from step 0 would train over the run that is there\n  hint: fix the files (or the "
          "file system) and start again, name a good copy in run.resume, or move them away to start afresh",
          ckpt_dir, unreadable));
    }
    if (!l.found() && !damaged.empty()) {
      throw ChecksumMismatch(fmt::format(
          "run.resume = latest: no intact checkpoint left in '{}': the data of {} failed its "
          "checksum and no older one is readable; the model was partly loaded from it, so the "
          "job cannot start from step 0 either\n  hint: move the damaged file(s) away to start "
          "afresh, or name a good copy in run.resume",
          ckpt_dir, fmt::join(damaged, ", ")));
    }
    log_latest(comm, l, ckpt_dir);
    if (!l.found()) return std::nullopt;
    try {
      return Resumed{l.path, read_checkpoint(comm, l.path, shards, options)};
    } catch (const ChecksumMismatch& e) {
      if (comm.rank() == 0) log::warn("run.resume = latest: skipping '{}': {}", l.path, e.what());
      damaged.push_back(l.path);
      before = l.step;
    }
  }
}

}  // namespace atlas::io
