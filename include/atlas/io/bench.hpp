// SPDX-License-Identifier: MIT
// `atlas bench ckpt`: the real checkpoint writer across the job's ranks next to a plain
// sequential POSIX write of the same number of bytes to the same directory, both including
// their fsync, so the checkpoint's cost over raw disk speed is one number (goal: ratio >= 0.5).
#pragma once

#include "atlas/bench/harness.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "atlas/io/checkpoint.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::io {

struct CkptBenchOptions {
  std::uint64_t size_bytes = 128ULL << 20;  ///< tensor bytes per checkpoint (value + m + v)
  int tensors = 24;                         ///< parameter tensors the bytes are spread over
  int repeat = 3;                           ///< timed rounds of each write (median reported)
  std::string dir = "runs/bench-ckpt";      ///< where both writers write (same file system)
  Transfer transfer = Transfer::Auto;       ///< MPI-IO transfer mode of the writer
  bool keep = false;                        ///< keep the last checkpoint file afterwards
  /// How TP cuts the synthetic tensors: "mixed" (even-numbered by columns, i.e. strided in the
  /// file, odd by rows), "rows" (every shard contiguous) or "cols" (every shard strided).
  std::string split = "mixed";
};

/// Timings of one round: seconds for each writer (as seen by every rank, barrier to barrier).
struct CkptBenchRound {
  double ckpt_s = 0.0;
  double posix_s = 0.0;
  double data_s = 0.0;   ///< slowest rank's create + metadata + tensor transfers
  double close_s = 0.0;  ///< slowest rank's H5Fclose
  double sync_s = 0.0;   ///< slowest rank's fsync of the .tmp
};

struct CkptBenchReport {
  std::uint64_t bytes = 0;  ///< bytes each writer wrote per round (the checkpoint file size)
  int tp_size = 1;          ///< synthetic layout the shards were cut for
  int pp_size = 1;
  std::vector<CkptBenchRound> rounds;
  double ckpt_mb_s = 0.0;   ///< median over rounds, MB = 1e6 bytes
  double posix_mb_s = 0.0;  ///< median over rounds
  [[nodiscard]] double ratio() const { return posix_mb_s > 0 ? ckpt_mb_s / posix_mb_s : 0.0; }
};

/// Runs the benchmark. **Collective over `comm`.** The synthetic model has `tensors` fp32
/// matrices with 1024 columns, cut for (tp = 2 when the job size is even, else 1; pp = size/tp)
/// as `split` says. The
/// POSIX baseline is written by rank 0 alone with write() in 8 MiB blocks, then fsync + close.
/// The checkpoint time covers the whole write_checkpoint() call (create, write, H5Fclose, fsync
/// on every writing rank, barrier, rename, directory fsync). Files are removed afterwards unless
/// `keep`. Throws atlas::Error on I/O failure.
[[nodiscard]] CkptBenchReport bench_ckpt(const mpi::Comm& comm, const CkptBenchOptions& options);

/// `atlas bench ckpt`'s options: --size 128M, --tensors 24, --repeat 3, --dir DIR,
/// --split mixed|rows|cols, --keep; the writer's MPI-IO transfers are the deck key ckpt.transfer
/// (`atlas bench ckpt ckpt.transfer=collective`), as in training.
[[nodiscard]] const atlas::bench::Spec& ckpt_bench_spec();

/// Runs the benchmark with parsed options: prints the table and the verdict on world rank 0.
/// Returns 0; a bad option value throws ConfigError (on every rank). **Collective over
/// MPI_COMM_WORLD.**
int run_ckpt_bench(mpi::Environment& env, const atlas::bench::Args& args);

/// The same from the words after `ckpt`: returns 1 (usage) for an unknown or malformed option,
/// with the reason on stderr. **Collective over MPI_COMM_WORLD.**
int run_ckpt_bench(mpi::Environment& env, const std::vector<std::string>& words);

}  // namespace atlas::io
