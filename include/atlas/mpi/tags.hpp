// SPDX-License-Identifier: MIT
// Every MPI message tag atlas uses, with the communicator it travels on and its range, in one
// place. The MPI standard guarantees tags up to 32767 only (MPI_TAG_UB >= 32767); the pipeline's
// ranges grow with the deck, so a job checks them against this MPI's MPI_TAG_UB (queried once)
// and refuses to start, naming the deck key, when they do not fit. Not for choosing communicators.
#pragma once

#include <cstdint>

namespace atlas::mpi {

/// This MPI's MPI_TAG_UB (the largest tag it accepts), queried once (mpi::Environment does it at
/// start-up); 32767, the standard's guarantee, when MPI is not initialised or does not say.
[[nodiscard]] int tag_upper_bound();

namespace tags {

/// The largest tag every MPI implementation accepts (MPI standard: MPI_TAG_UB >= 32767).
inline constexpr int kStandardBound = 32767;

// ---- world communicator (runtime::Trainer) ----
inline constexpr int kStepLoss = 7001;  ///< a DP replica's step loss to rank 0
inline constexpr int kEvalLoss = 7002;  ///< the eval loss, from the last stage to rank 0

// ---- the pipeline: pp_comm and the WAN transport (one tag space: a boundary goes either way) ----
inline constexpr int kWanPreflight = 1;  ///< app/train_cmd: the pre-flight round trip per WAN peer
inline constexpr int kEmbedding = 2;     ///< tied-embedding gradient exchange, first <-> last stage
/// First tag of the boundary tensors; below it only the fixed tags above.
inline constexpr int kBoundaryBase = 16;
/// Training boundary tensor of micro-batch `micro` (0 <= micro < micro_batches); `flow` 0 is the
/// activation, 1 its gradient. With model chunks (interleaved 1F1B, `chunks` =
/// schedule.virtual_stages) a pair of ranks exchanges one tensor per chunk: `chunk` is that of the
/// boundary's lower virtual stage (sched::virtual_boundary / pp), so both ends name it alike:
/// [kBoundaryBase, kBoundaryBase + 2 * chunks * micro_batches); one chunk: the range as before.
[[nodiscard]] constexpr int boundary(int flow, int micro, int micro_batches, int chunk = 0, int chunks = 1) {
  return kBoundaryBase + (flow * chunks + chunk) * micro_batches + micro;
}
/// Eval forward of eval batch `m` (0 <= m < eval_batches) across the boundary of chunk `chunk`:
/// right after the training range.
[[nodiscard]] constexpr int eval(int m, int micro_batches, int chunk = 0, int chunks = 1) {
  return kBoundaryBase + 2 * chunks * micro_batches + m * chunks + chunk;
}
/// The largest pipeline tag of a deck (train.micro_batches, train.eval_batches,
/// schedule.virtual_stages).
[[nodiscard]] constexpr std::int64_t pipeline_max(int micro_batches, int eval_batches, int chunks = 1) {
  return std::int64_t{kBoundaryBase} + 2 * std::int64_t{chunks} * micro_batches +
         std::int64_t{chunks} * eval_batches - 1;
}

// ---- link-order tokens: runtime::Boundary's duplicate of dp_comm, used for nothing else ----
/// Token of position `pos` (0 <= pos < stride - 1) in WAN link `link`'s order.
[[nodiscard]] constexpr int token(int link, int pos, int stride) { return 1 + link * stride + pos; }
/// The largest token tag of a table with `links` links whose longest order is stride - 1 long:
/// token(links - 1, stride - 2, stride) (it said one more, so a table that fit exactly was refused).
[[nodiscard]] constexpr std::int64_t token_max(int links, int stride) {
  return std::int64_t{links} * std::int64_t{stride} - 1;
}

// ---- other communicators, each used by one purpose ----
inline constexpr int kBubbleChunk = 1;    ///< bubbletea service communicator: an activation chunk
inline constexpr int kBubbleRelease = 2;  ///< bubbletea service communicator: a request released
/// device::make_ring_collective's pieces, on its own dup of dp_comm: sum number k of the collective
/// uses kRingSumBase + k % kRingSumTags (the trainer keeps at most kRingSumTags / 2 open).
inline constexpr int kRingSumBase = 1;
inline constexpr int kRingSumTags = 1024;
inline constexpr int kWakeProbe = 911;    ///< runtime::wake_probe's ring, on the probe's communicator
/// runtime::probe_net_cpu's burst of round `round` (a few rounds), on the probe's own transport.
[[nodiscard]] constexpr int net_cpu_probe(int round) { return 7100 + round; }
/// io checkpoint redistribution (the checkpoint's communicator): piece `index` of one tensor, at
/// most one per rank that holds a shard of it.
[[nodiscard]] constexpr int checkpoint_piece(int index) { return index; }

/// Throws ConfigError when the pipeline tags of a deck with `micro_batches` and `eval_batches`
/// exceed `tag_ub` (this MPI's MPI_TAG_UB): the message names the bound, the deck keys and the
/// largest train.micro_batches that fits. Not collective; every rank of a job decides the same.
void check_pipeline(int micro_batches, int eval_batches, int tag_ub, int chunks = 1);

/// Throws ConfigError when the link-order tokens of a schedule table (`links` WAN links, the
/// longest order stride - 1 transfers) exceed `tag_ub`, naming the bound and train.micro_batches
/// (the order length grows with it).
void check_tokens(int links, int stride, int micro_batches, int tag_ub);

}  // namespace tags
}  // namespace atlas::mpi
