// SPDX-License-Identifier: MIT
// Private helpers shared by the checkpoint writer and reader: a tiny byte serializer for
// gathering descriptors over MPI, shard validation, the gathered per-tensor plan, and helpers
// that make one rank's verdict (or every rank's problems) the same on every rank.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <hdf5.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::io::internal {

// ---- byte serializer (same binary on every rank, so no endianness concerns) ----

class BlobWriter {
 public:
  void i64(std::int64_t v) { append(&v, sizeof v); }
  void u64(std::uint64_t v) { append(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    m_data += s;
  }
  void i64s(const std::vector<std::int64_t>& v) {
    i64(static_cast<std::int64_t>(v.size()));
    for (auto x : v) i64(x);
  }
  void u64s(const std::vector<std::uint64_t>& v) {
    i64(static_cast<std::int64_t>(v.size()));
    for (auto x : v) u64(x);
  }
  [[nodiscard]] std::string& data() { return m_data; }

 private:
  void append(const void* p, std::size_t n) { m_data.append(static_cast<const char*>(p), n); }
  std::string m_data;
};

class BlobReader {
 public:
  explicit BlobReader(const std::string& data) : m_data(data) {}
  [[nodiscard]] bool done() const { return m_pos >= m_data.size(); }
  std::int64_t i64() {
    std::int64_t v = 0;
    take(&v, sizeof v);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    take(&v, sizeof v);
    return v;
  }
  std::string str() {
    const auto n = static_cast<std::size_t>(i64());
    need(n);
    std::string s = m_data.substr(m_pos, n);
    m_pos += n;
    return s;
  }
  std::vector<std::int64_t> i64s() {
    std::vector<std::int64_t> v(static_cast<std::size_t>(i64()));
    for (auto& x : v) x = i64();
    return v;
  }
  std::vector<std::uint64_t> u64s() {
    std::vector<std::uint64_t> v(static_cast<std::size_t>(i64()));
    for (auto& x : v) x = u64();
    return v;
  }

 private:
  void need(std::size_t n) const;
  void take(void* p, std::size_t n) {
    need(n);
    std::memcpy(p, m_data.data() + m_pos, n);
    m_pos += n;
  }
  const std::string& m_data;
  std::size_t m_pos = 0;
};

void put_meta(BlobWriter& w, const CheckpointMeta& m);
CheckpointMeta get_meta(BlobReader& r);
void put_contents(BlobWriter& w, const CheckpointContents& c);
CheckpointContents get_contents(BlobReader& r);

// ---- shards ----

/// Problems with one shard descriptor's own fields (name, ranks of the vectors, bounds).
std::vector<std::string> shard_problems(const std::string& name,
                                        const std::vector<std::int64_t>& full_shape,
                                        const std::vector<std::int64_t>& offset,
                                        const std::vector<std::int64_t>& shape);

std::int64_t volume(const std::vector<std::int64_t>& dims);
std::string dims_str(const std::vector<std::int64_t>& dims);

/// One shard of one tensor as every rank sees it after the gather.
struct Piece {
  int rank = 0;
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> shape;
  bool writer = false;
  bool want_m = false;  ///< reader: this piece asks for adam_m
  bool want_v = false;  ///< reader: this piece asks for adam_v
  int local_index = 0;  ///< index into that rank's own shard list
};

/// Everything the job says about one tensor.
struct TensorPlan {
  std::vector<std::int64_t> full_shape;
  std::vector<Piece> pieces;
};

/// Name -> plan, in name order (the order every rank creates/visits datasets in).
using Plan = std::map<std::string, TensorPlan>;

/// One rank's descriptor of one of its shards, as gathered.
struct ShardDesc {
  std::string name;
  std::vector<std::int64_t> full_shape;
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> shape;
  bool writer = false;
  bool want_m = false;
  bool want_v = false;
};

/// Allgathers every rank's descriptors into one Plan (identical on every rank) and appends to
/// `problems` each tensor whose ranks disagree on its full shape. Collective over comm.
Plan gather_plan(const mpi::Comm& comm, const std::vector<ShardDesc>& mine,
                 std::vector<std::string>& problems);

/// Largest number of non-empty pieces that one rank holds of `t` (pieces filtered by `use`):
/// the number of transfers each rank joins for that tensor in collective mode.
template <class Pred>
int max_pieces_per_rank(const TensorPlan& t, int ranks, Pred use) {
  std::vector<int> count(static_cast<std::size_t>(ranks), 0);
  int best = 0;
  for (const auto& p : t.pieces) {
    if (use(p) && volume(p.shape) > 0) best = std::max(best, ++count[static_cast<std::size_t>(p.rank)]);
  }
  return best;
}

/// True when the box [offset, offset + shape) is one contiguous run of a row-major tensor of
/// `full` shape: leading dimensions of extent 1, then one partial dimension, then full ones.
bool contiguous_box(const std::vector<std::int64_t>& full, const std::vector<std::int64_t>& shape);

/// True when some non-empty piece selected by `use` is strided in the file. Every rank gets the
/// same answer: it reads only the gathered plan.
template <class Pred>
bool has_strided_piece(const TensorPlan& t, Pred use) {
  for (const auto& p : t.pieces) {
    if (use(p) && volume(p.shape) > 0 && !contiguous_box(t.full_shape, p.shape)) return true;
  }
  return false;
}

// ---- collective agreement ----

/// Every rank passes its own problems; every rank returns all of them, in rank order, each
/// prefixed "[rank N] " when the communicator has more than one rank and `rank_prefix` (off for
/// problems that do not depend on who found them). Collective over comm.
std::vector<std::string> gather_problems(const mpi::Comm& comm,
                                         const std::vector<std::string>& mine,
                                         bool rank_prefix = true);

/// Runs `work` on rank 0 and agrees on its outcome (mpi::agree_on_root): on every rank returns
/// its payload or throws the same exception (ConfigError, ChecksumMismatch, atlas::Error with the
/// root's message; any other exception as Error (Internal)). Collective.
template <class F>
std::string run_on_root(const mpi::Comm& comm, F&& work) {
  return mpi::agree_on_root(
      comm, 0,
      [&]() -> std::string {
        try {
          return work();
        } catch (const ConfigError&) {
          throw;
        } catch (const ChecksumMismatch&) {
          throw;
        } catch (const CollectiveError& e) {  // no other collective class crosses this boundary
          ATLAS_THROW(Internal, e.what());
        }
      },
      [](const CollectiveError& e) {
        throw ChecksumMismatch(e.problems().empty() ? "checksum mismatch" : e.problems().front());
      });
}

}  // namespace atlas::io::internal

namespace atlas::io::internal {

/// Group names of the three tensor kinds, in the order datasets are visited.
inline constexpr const char* kKindGroups[3] = {"params", "adam_m", "adam_v"};

enum class Direction { Write, Read };

/// Moves one box [offset, offset + shape) of dataset `dset` from (Write) or into (Read) `buf`,
/// which holds the box row-major and contiguous. offset == nullptr joins a collective
/// transfer with an empty selection. float32 in memory and in the file: no conversion, so the
/// bytes are copied exactly (NaN payloads included).
void transfer_box(hid_t dset, hid_t dxpl, Direction dir, const std::vector<std::int64_t>* offset,
                  const std::vector<std::int64_t>* shape, void* buf);

// ---- checksums (docs/formats.md, "Checksums") ----

/// Name of the per-dataset attribute holding the CRC32C of each box (uint32, one per box).
inline constexpr const char* kCrcAttr = "crc32c";
/// Name of the tensor datasets' attribute holding the boxes: int64 [n, 2 * rank], each row the
/// box's offset then its shape. Absent: one box, the whole dataset.
inline constexpr const char* kCrcBoxesAttr = "crc32c_boxes";

/// CRC32C of `n` float32 or uint64 values as the file stores them (little-endian; atlas's hosts
/// are little-endian, so these are the bytes in memory).
std::uint32_t crc_of(const float* data, std::int64_t n);
std::uint32_t crc_of(const std::uint64_t* data, std::size_t n);

/// The text of a checksum mismatch (one line).
std::string mismatch_text(const std::string& path, const std::string& dataset,
                          const std::string& box, std::uint32_t stored, std::uint32_t computed);

// ---- file names (checkpoint_path) ----

/// A checkpoint file name: step-N.h5, or step-N.h5.tmp (a write not yet renamed).
struct CheckpointName {
  std::int64_t step = -1;  ///< -1: the digits do not fit 64 bits (no checkpoint atlas wrote)
  bool tmp = false;
};
/// `name` (a file name, no directory) read as a checkpoint name; nullopt for any other file.
std::optional<CheckpointName> parse_checkpoint_name(const std::string& name);

}  // namespace atlas::io::internal
