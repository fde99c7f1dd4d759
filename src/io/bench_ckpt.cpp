// SPDX-License-Identifier: MIT
// `atlas bench ckpt`: times the real checkpoint writer against a sequential POSIX write of the
// same bytes on the same file system. Both include fsync, so the page cache cannot flatter
// either. Not a test: prints numbers, judges nothing beyond the stated goal.
#include "atlas/io/bench.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "atlas/core/check.hpp"
#include "atlas/core/stats.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/io/checkpoint.hpp"

namespace fs = std::filesystem;

namespace atlas::io {

namespace {

constexpr std::int64_t kCols = 1024;
constexpr std::size_t kPosixBlock = 8U << 20;

struct OwnedShard {
  WriteShard view;
  std::vector<float> value, m, v;
};

std::vector<OwnedShard> synthetic_shards(const mpi::Comm& comm, const CkptBenchOptions& o,
                                         int tp_size, int pp_size) {
  // Rows per tensor so that 3 kinds x tensors x rows x kCols x 4 bytes ~= size_bytes.
  const std::int64_t per_kind_elems = static_cast<std::int64_t>(o.size_bytes / 12U);
  const std::int64_t rows_total = std::max<std::int64_t>(per_kind_elems / kCols, o.tensors);
  const int tp = comm.rank() % tp_size;
  const int stage = comm.rank() / tp_size;
  std::vector<OwnedShard> out;
  for (int i = 0; i < o.tensors; ++i) {
    if (i * pp_size / o.tensors != stage) continue;
    const std::int64_t rows = rows_total * (i + 1) / o.tensors - rows_total * i / o.tensors;
    OwnedShard s;
    s.view.name = fmt::format("bench.{}.weight", i);
    s.view.full_shape = {rows, kCols};
    s.view.offset = {0, 0};
    s.view.shape = {rows, kCols};
    const bool by_cols = o.split == "cols" || (o.split == "mixed" && i % 2 == 0);
    const int dim = by_cols ? 1 : 0;  // columns: strided in the file; rows: contiguous
    const std::int64_t len = s.view.full_shape[static_cast<std::size_t>(dim)];
    s.view.offset[static_cast<std::size_t>(dim)] = len * tp / tp_size;
    s.view.shape[static_cast<std::size_t>(dim)] = len * (tp + 1) / tp_size - len * tp / tp_size;
    const auto n = static_cast<std::size_t>(s.view.numel());
    s.value.assign(n, 0.5F + static_cast<float>(i));
    s.m.assign(n, 1e-3F);
    s.v.assign(n, 1e-6F);
    out.push_back(std::move(s));
  }
  for (auto& s : out) {  // after the moves: the vectors' buffers no longer relocate
    s.view.value = s.value.data();
    s.view.adam_m = s.m.data();
    s.view.adam_v = s.v.data();
  }
  return out;
}

double posix_write(const std::string& path, std::uint64_t bytes) {
  std::vector<char> block(kPosixBlock);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131U);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) ATLAS_THROW(Io, "cannot create '" << path << "': " << std::strerror(errno));
  std::uint64_t left = bytes;
  while (left > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, block.size()));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ATLAS_THROW(Io, "write('" << path << "') failed: " << std::strerror(err));
    }
    left -= static_cast<std::uint64_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ATLAS_THROW(Io, "fsync('" << path << "') failed: " << std::strerror(err));
  }
  ::close(fd);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CkptBenchReport bench_ckpt(const mpi::Comm& comm, const CkptBenchOptions& o) {
  CkptBenchReport report;
  report.tp_size = comm.size() % 2 == 0 ? 2 : 1;
  report.pp_size = comm.size() / report.tp_size;
  const auto shards = synthetic_shards(comm, o, report.tp_size, report.pp_size);
  std::vector<WriteShard> views;
  for (const auto& s : shards) views.push_back(s.view);
  CheckpointMeta meta;
  meta.git_sha = "bench";
  meta.deck = "# atlas bench ckpt\n";
  meta.layout = {1, report.pp_size, 1, report.tp_size, {report.pp_size}};
  WriteOptions wopt;
  wopt.keep_last = 1;
  wopt.transfer = o.transfer;
  const std::string posix_path = (fs::path(o.dir) / "posix-baseline.bin").string();
  std::string last_ckpt;
  for (int round = 0; round < o.repeat; ++round) {
    CkptBenchRound r;
    meta.step = round + 1;
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    const WriteResult w = write_checkpoint(comm, o.dir, meta, views, wopt);
    comm.barrier();
    r.ckpt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.data_s = comm.allreduce(w.data_seconds, MPI_MAX);
    r.close_s = comm.allreduce(w.close_seconds, MPI_MAX);
    r.sync_s = comm.allreduce(w.sync_seconds, MPI_MAX);
    report.bytes = w.file_bytes;
    last_ckpt = w.path;

    comm.barrier();
    t0 = std::chrono::steady_clock::now();
    std::string error;
    if (comm.rank() == 0) {
      try {
        (void)posix_write(posix_path, report.bytes);
      } catch (const Error& e) {
        error = e.what();
      }
    }
    comm.bcast_string(error, 0);
    if (!error.empty()) ATLAS_THROW(Io, error);
    r.posix_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report.rounds.push_back(r);
  }
  std::vector<double> ck;
  std::vector<double> px;
  for (const auto& r : report.rounds) {
    ck.push_back(static_cast<double>(report.bytes) / r.ckpt_s / 1e6);
    px.push_back(static_cast<double>(report.bytes) / r.posix_s / 1e6);
  }
  report.ckpt_mb_s = median(ck);
  report.posix_mb_s = median(px);
  comm.barrier();
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::remove(posix_path, ec);
    if (!o.keep) fs::remove(last_ckpt, ec);
  }
  comm.barrier();
  return report;
}

const char* to_string(Transfer t) {
  switch (t) {
    case Transfer::Auto: return "auto (strided shards regrouped into row blocks, independent)";
    case Transfer::Collective: return "collective";
    case Transfer::Independent: return "independent";
  }
  return "?";
}

const atlas::bench::Spec& ckpt_bench_spec() {
  static const atlas::bench::Spec spec{
      "ckpt", "checkpoint write throughput vs a plain sequential write", "[ckpt.transfer=auto|collective|independent]",
      {{"size", "BYTES", "128M", "tensor bytes per checkpoint (value + m + v)"},
       {"tensors", "N", "24", "parameter tensors the bytes are spread over"},
       {"repeat", "N", "3", "timed rounds of each write (the median is reported)"},
       {"dir", "DIR", "runs/bench-ckpt", "where both writers write (same file system)"},
       {"split", "HOW", "mixed", "how TP cuts the synthetic tensors: mixed, rows, cols"},
       {"keep", "", "", "keep the last checkpoint file afterwards"}}};
  return spec;
}

namespace {

/// The options of a parsed command line; a bad one throws ConfigError (the same on every rank).
CkptBenchOptions options_of(const atlas::bench::Args& args) {
  CkptBenchOptions o;
  if (!args.positional.empty()) args.fail("unknown argument '" + args.positional.front() + "'");
  // The writer's MPI-IO transfers are the deck key ckpt.transfer, as in training.
  for (const auto& w : args.overrides)
    if (w.rfind("ckpt.transfer=", 0) != 0) args.fail("'" + w + "': only ckpt.transfer applies to this benchmark");
  const Config deck = deck::parse("(atlas bench ckpt)", "cluster.dcs = a\ncluster.gpus_per_dc = 1\nparallel.stages_per_dc = 1\n",
                                  args.overrides);
  o.size_bytes = args.bytes("size", 1U << 20, ~std::uint64_t{0});
  o.tensors = args.integer("tensors", 1, 100000);
  o.repeat = args.integer("repeat", 1, 100000);
  o.dir = args.text("dir");
  o.split = args.choice("split", {"mixed", "rows", "cols"});
  o.transfer = transfer_of(deck.ckpt.transfer);
  o.keep = args.flag("keep");
  return o;
}

int run_with(mpi::Environment& env, const CkptBenchOptions& o);

}  // namespace

int run_ckpt_bench(mpi::Environment& env, const std::vector<std::string>& words) {
  // The documented contract of this entry point: a bad command line is exit code 1 with the
  // reason on stderr (rank 0), not an exception.
  CkptBenchOptions o;
  try {
    o = options_of(atlas::bench::parse(ckpt_bench_spec(), words));
  } catch (const ConfigError& e) {
    if (env.world_rank() == 0) std::fprintf(stderr, "ERROR: %s\n", e.what());
    return 1;
  }
  return run_with(env, o);
}

int run_ckpt_bench(mpi::Environment& env, const atlas::bench::Args& args) { return run_with(env, options_of(args)); }

namespace {

int run_with(mpi::Environment& env, const CkptBenchOptions& o) {
  const bool root = env.world_rank() == 0;
  const mpi::Comm world = mpi::Comm::world();
  const CkptBenchReport r = bench_ckpt(world, o);
  if (!root) return 0;
  fmt::print("# atlas bench ckpt: {} of tensors (value + adam_m + adam_v) in {} fp32 tensors, "
             "{} rank(s) as pp={} tp={} (TP split: {}), {} MPI-IO transfers\n",
             units::format_bytes_human(static_cast<double>(o.size_bytes)), o.tensors,
             world.size(), r.pp_size, r.tp_size, o.split, to_string(o.transfer));
  fmt::print("# dir: {} (both writers, same file system); {} bytes per write; MB = 1e6 bytes\n",
             o.dir, r.bytes);
  fmt::print("# both timings include fsync: checkpoint = whole write_checkpoint() (create, write, "
             "H5Fclose, fsync, rename, dir fsync); posix = rank 0 write() in 8 MiB blocks + "
             "fsync + close\n# data_s/close_s/fsync_s: phases of the checkpoint, slowest rank\n");
  fmt::print("# {:>5} {:>10} {:>12} {:>10} {:>12} {:>7}   {:>7} {:>7} {:>7}\n", "round",
             "ckpt_s", "ckpt_MB/s", "posix_s", "posix_MB/s", "ratio", "data_s", "close_s",
             "fsync_s");
  for (std::size_t i = 0; i < r.rounds.size(); ++i) {
    const auto& x = r.rounds[i];
    const double ck = static_cast<double>(r.bytes) / x.ckpt_s / 1e6;
    const double px = static_cast<double>(r.bytes) / x.posix_s / 1e6;
    fmt::print("  {:>5} {:>10.3f} {:>12.1f} {:>10.3f} {:>12.1f} {:>7.2f}   {:>7.3f} {:>7.3f} "
               "{:>7.3f}\n",
               i + 1, x.ckpt_s, ck, x.posix_s, px, ck / px, x.data_s, x.close_s, x.sync_s);
  }
  fmt::print("{}", atlas::bench::footer("ckpt", fmt::format("median checkpoint {:.1f} MB/s, posix {:.1f} MB/s, ratio "
                                                            "{:.2f} (goal >= 0.5): {}",
                                                            r.ckpt_mb_s, r.posix_mb_s, r.ratio(),
                                                            r.ratio() >= 0.5 ? "OK" : "BELOW GOAL")));
  std::fflush(stdout);
  return 0;
}

}  // namespace

}  // namespace atlas::io
