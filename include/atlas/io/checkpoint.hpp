// SPDX-License-Identifier: MIT
// Checkpoints: one HDF5 file per step holding every parameter and both AdamW moments as the full
// logical tensor (each rank writes/reads its shard as a hyperslab, so any layout can read any
// other's file), plus the metadata needed to resume, every dataset with its CRC32C (verified on
// read). Layout of the file: docs/formats.md.
// Takes plain descriptors (names, shapes, host pointers); knows nothing about the model classes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/core/file.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::io {

/// Value of the root attribute `format`.
inline constexpr const char* kCkptFormatName = "atlas-checkpoint";
/// Value of the root attribute `format_version`; bump it (and docs/formats.md) on any change of
/// the layout. A reader accepts exactly this version.
inline constexpr std::int64_t kCkptFormatVersion = 1;
/// Value of the root attribute `checksum`: every dataset of such a file carries a `crc32c`
/// attribute (docs/formats.md, "Checksums"). Files written before checksums have no such root
/// attribute; they are read with a warning and their data is not verified.
inline constexpr const char* kCkptChecksum = "crc32c";

/// A dataset whose data does not match its stored CRC32C: the file changed after it was written
/// (bit rot, a bad copy, a stray write). ExitCode::Io. what() names the file, the dataset (and
/// the box of a tensor) and says "checksum mismatch". Collective: every rank raises it alike (the
/// reads agree on their verdict), so rank 0 prints it once and every rank exits with code 5.
class ChecksumMismatch : public CollectiveError {
 public:
  explicit ChecksumMismatch(const std::string& what) : CollectiveError(ExitCode::Io, {what}) {}
};

/// One rank's piece of one tensor: a box [offset, offset + shape) of the full logical tensor,
/// stored row-major and contiguous in the host buffers. Buffers are fp32, hold shape's product
/// elements each and are not owned (they must stay valid for the call). `T` is `const float`
/// for writing, `float` for reading.
template <class T>
struct Shard {
  std::string name;                      ///< stable tensor name, e.g. "h.3.attn.qkv.weight"
  std::vector<std::int64_t> full_shape;  ///< logical shape of the whole tensor (elements, rank >= 1)
  std::vector<std::int64_t> offset;      ///< first index of this shard in each dimension
  std::vector<std::int64_t> shape;       ///< extent of this shard in each dimension
  /// Writing only. Exactly one rank writes each element: the writer shards of a tensor must tile
  /// the full tensor with no gap and no overlap (checked; a violation throws before any file is
  /// created). Rule for atlas: writer = (dp == 0) && (tp == 0 || the tensor is sharded over TP).
  bool writer = true;
  T* value = nullptr;   ///< parameter values (required)
  T* adam_m = nullptr;  ///< AdamW first moment (required for writing; reading skips it if null)
  T* adam_v = nullptr;  ///< AdamW second moment (required for writing; reading skips it if null)

  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};
using WriteShard = Shard<const float>;
using ReadShard = Shard<float>;

/// Model size fields compared on resume (deck keys model.*).
struct ModelShape {
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t seq_len = 0;
  std::int64_t vocab = 0;
  bool operator==(const ModelShape&) const = default;
};

/// The parallel layout the checkpoint was written under (informational: any layout can read it).
struct LayoutInfo {
  std::int64_t dc_count = 1;
  std::int64_t pp_size = 1;  ///< pipeline stages in total
  std::int64_t dp_size = 1;
  std::int64_t tp_size = 1;
  std::vector<std::int64_t> stages_per_dc;  ///< may be empty
  bool operator==(const LayoutInfo&) const = default;
};

/// Everything in a checkpoint except the tensors.
struct CheckpointMeta {
  std::int64_t step = 0;   ///< optimizer steps completed when the checkpoint was taken
  std::string git_sha;     ///< revision of the writer (atlas::build::kGitSha)
  std::string deck;        ///< the resolved deck text
  LayoutInfo layout;
  ModelShape model;
  /// Small integer arrays keyed by name, written as /state/<name> (uint64, with a CRC32C).
  /// atlas's trainer writes "adam_t" (the AdamW step count) and "loader" (the data-loader
  /// position); '/' in a name makes a subgroup. On write each rank passes the entries it knows;
  /// the file holds the union, and two ranks passing the same name must pass identical words
  /// (checked).
  std::map<std::string, std::vector<std::uint64_t>> state;
  bool operator==(const CheckpointMeta&) const = default;
};

/// How tensor data moves through MPI-IO.
enum class Transfer {
  /// Writing: a tensor that some writer holds as a strided box (split along a dimension other
  /// than the first, e.g. a column-parallel TP weight) is first redistributed with MPI
  /// point-to-point among its writers into blocks of whole rows, each then written as one
  /// contiguous run (atlas's own two-phase I/O); contiguous shards are written directly. All
  /// transfers are independent. Reading: independent. Measured fastest on a local disk
  /// (`atlas bench ckpt`, np 2, tp 2: 908 MB/s vs 654 independent, 641 collective).
  Auto,
  /// Every rank joins every dataset's transfer (empty selection if it has none) and MPI-IO
  /// aggregates. May pay off on a parallel file system; slower than Auto on a local disk.
  Collective,
  Independent,  ///< only ranks holding a piece of a dataset touch it, strided or not
};

/// The deck's ckpt.transfer as a Transfer.
[[nodiscard]] constexpr Transfer transfer_of(CkptTransfer t) {
  return t == CkptTransfer::Collective ? Transfer::Collective
         : t == CkptTransfer::Independent ? Transfer::Independent
                                           : Transfer::Auto;
}

/// "DIR/step-000042.h5" (six digits, more when the step needs them).
[[nodiscard]] std::string checkpoint_path(const std::string& dir, std::int64_t step);

struct WriteOptions {
  /// After a successful write, keep the new file and the keep_last - 1 newest older step-*.h5
  /// and delete the rest of the older ones, plus stale step-*.h5.tmp of earlier or equal steps.
  /// Files of later steps are never deleted (a warning names them). <= 0 keeps everything.
  int keep_last = 3;
  Transfer transfer = Transfer::Auto;
  /// Test hook, called on every rank after the .tmp file is closed and synced and before the
  /// rename. Throwing from it simulates a crash at the worst moment (the .tmp stays behind).
  std::function<void(const std::string& tmp_path)> before_rename;
};

struct WriteResult {
  std::string path;           ///< the final checkpoint file
  std::uint64_t file_bytes = 0;    ///< size of the file on disk
  std::uint64_t tensor_bytes = 0;  ///< bytes of tensor data (params + moments) in the file
  double seconds = 0.0;       ///< wall time of the whole call on this rank
  double data_seconds = 0.0;  ///< this rank: create + metadata + tensor transfers
  double close_seconds = 0.0; ///< this rank: H5Fclose (collective; flushes metadata)
  double sync_seconds = 0.0;  ///< this rank: fsync of the .tmp
  std::vector<std::string> pruned;  ///< files deleted by keep_last
};

/// Writes checkpoint `meta.step` of the shards to DIR/step-NNNNNN.h5 atomically: the data goes to
/// step-NNNNNN.h5.tmp, which is closed and fsync'ed on every rank, and world rank 0 of `comm`
/// renames it once every rank is done (barrier) and fsyncs the directory; then older checkpoints
/// beyond keep_last are deleted. A crash at any point leaves the previous checkpoints intact.
/// **Collective over `comm`** (all ranks of the job, each passing its own shards, possibly none).
/// The step, git_sha, deck, layout and model written are rank 0's; `state` is the union of all
/// ranks' entries. Creates `dir` if needed. Throws atlas::Error (Internal) on every rank if the
/// shard descriptors are inconsistent (gap, overlap, shape mismatch, null buffer), atlas::Error
/// (Io) on an I/O failure.
WriteResult write_checkpoint(const mpi::Comm& comm, const std::string& dir,
                             const CheckpointMeta& meta, std::span<const WriteShard> shards,
                             const WriteOptions& options = {});

/// The stored CRC32C of one box of a tensor dataset: the box [offset, offset + shape) of the full
/// tensor (one writer's shard), its float32 bytes taken row-major within the box.
struct BoxChecksum {
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> shape;
  std::uint32_t crc = 0;
};

/// A tensor as stored: name and full shape.
struct TensorEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  bool has_adam = false;  ///< /adam_m/<name> and /adam_v/<name> exist
  /// Stored checksums of /params, /adam_m, /adam_v/<name> (index as kind 0, 1, 2): boxes that
  /// tile the tensor. Empty in files without checksums (and for absent moments).
  std::vector<BoxChecksum> checksums[3];
};

/// What a checkpoint file holds (metadata + tensor list), read without loading tensor data.
struct CheckpointContents {
  std::string path;
  CheckpointMeta meta;
  std::vector<TensorEntry> tensors;  ///< in name order
  bool checksummed = false;  ///< root attribute checksum = "crc32c" (else: an older file)
};

/// Opens `path` on this process only (serial HDF5) and checks that it is a complete checkpoint
/// of this format version. Not collective. Throws ConfigError naming the file when it is missing,
/// truncated, not HDF5, not an atlas checkpoint, or of another format version; throws
/// ChecksumMismatch when /deck or a /state dataset (the optimizer step count, the loader
/// position, ...) does not match its checksum. Tensor data is not read here (read_checkpoint
/// verifies it).
[[nodiscard]] CheckpointContents inspect_checkpoint(const std::string& path);

/// Collective version of inspect_checkpoint: world rank 0 of `comm` inspects and broadcasts, so
/// every rank returns the same contents or throws the same ConfigError / ChecksumMismatch.
/// **Collective over comm.**
[[nodiscard]] CheckpointContents inspect_checkpoint(const mpi::Comm& comm, const std::string& path);

/// Empty when equal, else one problem per differing field, each like
/// "checkpoint 'F': model.hidden is 128 in the checkpoint but 256 in the deck".
[[nodiscard]] std::vector<std::string> model_mismatches(const std::string& path,
                                                        const ModelShape& in_file,
                                                        const ModelShape& in_deck);

struct ReadOptions {
  /// Compare the file's model shape with this one first (ConfigError naming every mismatching
  /// field). nullopt skips the check (e.g. inference loading a subset).
  std::optional<ModelShape> expect_model;
  Transfer transfer = Transfer::Auto;
};

/// Reads the shards this rank asks for from checkpoint `path`, whatever layout wrote it (each
/// shard is a hyperslab of the stored full tensor), and returns the file's metadata. Checks the
/// format name and version, the model shape (options.expect_model) and that every requested
/// tensor exists with the same full shape, before reading any data: each problem is a
/// ConfigError thrown identically on every rank. After reading, verifies the stored CRC32C of
/// every box of every dataset read from (a rank whose shard is exactly a stored box checks its
/// own buffer; other boxes are read once more by one rank each, round robin): a mismatch throws
/// ChecksumMismatch identically on every rank, and the shards' buffers then hold unverified data.
/// **Collective over `comm`** (every rank calls it with the same path, each with its own shards,
/// possibly none). `writer` is ignored.
CheckpointMeta read_checkpoint(const mpi::Comm& comm, const std::string& path,
                               std::span<const ReadShard> shards, const ReadOptions& options = {});

/// A checkpoint that find_latest passed over, and why.
struct SkippedCheckpoint {
  std::string path;
  std::string reason;
};

struct LatestCheckpoint {
  std::string path;         ///< newest readable checkpoint; "" if none
  std::int64_t step = -1;   ///< its step; -1 if none
  std::vector<SkippedCheckpoint> skipped;  ///< newer files that are temporary or unreadable
  [[nodiscard]] bool found() const { return !path.empty(); }
};

/// Scans `dir` for step-NNNNNN.h5 and returns the newest one that inspect_checkpoint accepts,
/// listing every newer file it skipped (.tmp leftovers of interrupted writes, truncated or
/// corrupt files, checksum mismatches in /state or /deck, other format versions) with the
/// reason. Only files whose name's step is below `before_step` are considered (the default: all).
/// A missing directory means none. Not collective (serial HDF5 on this process).
[[nodiscard]] LatestCheckpoint find_latest(const std::string& dir,
                                           std::int64_t before_step = INT64_MAX);
/// Same, scanned by world rank 0 of `comm` and broadcast. **Collective over `comm`.**
[[nodiscard]] LatestCheckpoint find_latest(const mpi::Comm& comm, const std::string& dir,
                                           std::int64_t before_step = INT64_MAX);

/// The step in the name of checkpoint file `path` (DIR/step-NNNNNN.h5), std::nullopt when its
/// name is not a checkpoint's.
[[nodiscard]] std::optional<std::int64_t> checkpoint_step_of(const std::string& path);

/// A new run (run.resume = "", or a start from a checkpoint outside `dir`) in a checkpoint
/// directory that holds an earlier run's
/// step-NNNNNN.h5 files (and .tmp leftovers): they are moved, not deleted, into a new
/// subdirectory `earlier-run-YYYYmmdd-HHMMSS[-N]` of `dir` (core/file.hpp, move_aside), so
/// run.resume = latest never resumes the earlier run's weights as this run's and pruning
/// (ckpt.keep_last) never counts them or deletes this run's files for them. Not collective
/// (rank 0 alone, as pruning). `why`: what starts the new run, for an error ("a fresh start
/// (run.resume = \"\")", or a start from a checkpoint outside `dir`). Symbolic links named
/// step-*.h5 move too (the links, not their targets). `after_step` >= 0: only the files of later
/// steps move (a run resumed from an older checkpoint of `dir`: its abandoned later steps must not
/// be what run.resume = latest finds after a crash).
MovedAside set_aside_checkpoints(const std::string& dir, const std::string& why, std::int64_t after_step = -1);

/// Resolves the deck key run.resume. "" -> "" (fresh start). "latest" -> the newest readable
/// checkpoint in `ckpt_dir` (each skipped file is logged as a warning with its reason; "" with an
/// info line if there is none). Anything else is a path that must be a readable checkpoint of
/// this format version, else a ConfigError naming the file (a ChecksumMismatch, exit code 5, when
/// its /deck or /state data is damaged). **Collective over `comm`**; every rank returns the same
/// path.
[[nodiscard]] std::string resolve_resume(const mpi::Comm& comm, const std::string& resume,
                                         const std::string& ckpt_dir);

/// A checkpoint read by resume_checkpoint.
struct Resumed {
  std::string path;
  CheckpointMeta meta;
};

/// resolve_resume, then read_checkpoint of the file it names. With "latest", a file whose data
/// fails its checksum (found only when read) is skipped like a truncated one, with a warning
/// giving the reason, and the next older readable checkpoint is read instead; if none is left,
/// ChecksumMismatch (the shards then hold unverified data, so a fresh start is no option
/// either). With an explicit path a damaged file is a ChecksumMismatch (exit code 5). nullopt:
/// start fresh ("" or no checkpoint at all). **Collective over `comm`**, like read_checkpoint.
[[nodiscard]] std::optional<Resumed> resume_checkpoint(const mpi::Comm& comm,
                                                       const std::string& resume,
                                                       const std::string& ckpt_dir,
                                                       std::span<const ReadShard> shards,
                                                       const ReadOptions& options = {});

}  // namespace atlas::io
