// SPDX-License-Identifier: MIT
// MPI_TAG_UB, queried once, and the checks of a job's tag ranges against it (see tags.hpp).
#include "atlas/mpi/tags.hpp"

#include <mpi.h>

#include <atomic>

#include <fmt/format.h>

#include "atlas/core/error.hpp"

namespace atlas::mpi {

namespace {

/// MPI_TAG_UB, or 0 when MPI cannot say yet (not initialised) or any more (finalised).
int query_tag_ub() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 0;
  void* value = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag) != MPI_SUCCESS || !flag || !value)
    return tags::kStandardBound;
  return *static_cast<int*>(value);
}

}  // namespace

int tag_upper_bound() {
  // Kept once MPI has answered; an answer before MPI_Init (the standard's minimum) is not kept,
  // or a job with more tags than 32767 would be refused for the rest of the process.
  static std::atomic<int> known{0};
  if (const int ub = known.load(); ub > 0) return ub;
  const int ub = query_tag_ub();
  if (ub == 0) return tags::kStandardBound;
  known.store(ub);
  return ub;
}

namespace tags {

void check_pipeline(int micro_batches, int eval_batches, int tag_ub, int chunks) {
  const std::int64_t need = pipeline_max(micro_batches, eval_batches, chunks);
  if (need <= tag_ub) return;
  if (chunks > 1) {
    const std::int64_t fit = (std::int64_t{tag_ub} - kBoundaryBase + 1 - std::int64_t{chunks} * eval_batches) / (2 * chunks);
    throw ConfigError(fmt::format(
        "train.micro_batches = {}, train.eval_batches = {} and schedule.virtual_stages = {} need MPI message "
        "tags up to {} (2 per micro-batch and 1 per eval batch, for each model chunk, plus {}), but this "
        "MPI's MPI_TAG_UB is {}: lower train.micro_batches to at most {} (or schedule.virtual_stages, or "
        "train.eval_batches), or run with an MPI whose tag bound is larger",
        micro_batches, eval_batches, chunks, need, kBoundaryBase, tag_ub, fit > 0 ? fit : 0));
  }
  const std::int64_t fit = (std::int64_t{tag_ub} - kBoundaryBase + 1 - eval_batches) / 2;
  throw ConfigError(fmt::format(
      "train.micro_batches = {} and train.eval_batches = {} need MPI message tags up to {} (2 per "
      "micro-batch and 1 per eval batch, plus {}), but this MPI's MPI_TAG_UB is {}: lower "
      "train.micro_batches to at most {} (or train.eval_batches), or run with an MPI whose tag bound "
      "is larger",
      micro_batches, eval_batches, need, kBoundaryBase, tag_ub, fit > 0 ? fit : 0));
}

void check_tokens(int links, int stride, int micro_batches, int tag_ub) {
  const std::int64_t need = token_max(links, stride);
  if (need <= tag_ub) return;
  throw ConfigError(fmt::format(
      "the schedule's {} ordered WAN links with up to {} transfers each need link-order token tags up "
      "to {}, but this MPI's MPI_TAG_UB is {}: lower train.micro_batches (now {}), or run with an MPI "
      "whose tag bound is larger",
      links, stride - 1, need, tag_ub, micro_batches));
}

}  // namespace tags
}  // namespace atlas::mpi
