// SPDX-License-Identifier: MIT
// The one agreement helper: an error that some ranks raise reaches every rank, so the job ends
// with one verdict and one exit code instead of the others waiting forever in their next
// collective. Not for hot loops: one allgather per call.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::mpi {

/// Runs `fn` on this rank, then agrees on the outcome with every rank of `comm`. Collective over
/// `comm`: every rank must call it, and `fn` must make no collective call that another rank could
/// skip by throwing. When `fn` threw on any rank, every rank throws:
/// - ConfigError when every failing rank raised a ConfigError (the problems of all ranks, each
///   distinct one once), so rank 0 prints them and every rank exits 2;
/// - else CollectiveError with the exit code of the lowest failing rank's error (an atlas::Error's
///   class; Internal for any other exception), its messages prefixed "rank R: ".
/// `what` names the step for the message of a rank whose own `fn` succeeded (e.g. "restoring the
/// data loader"). Returns normally on every rank when no rank failed.
void agree(const Comm& comm, const std::string& what, const std::function<void()>& fn);

/// The same agreement for work that only `root` does (reading a file once for the job): runs
/// `fn` on `root` and gives every rank of `comm` its result, or raises what it threw on every
/// rank, as the same class: ConfigError (its problems); atlas::Error (its code and message, which
/// already names the call site); a CollectiveError (its code and problems), raised by
/// `rethrow_collective` when given (so a caller can keep its own subclass), else as is; any other
/// exception as Error (Internal) with its what(). Collective over `comm`.
std::string agree_on_root(const Comm& comm, int root, const std::function<std::string()>& fn,
                          const std::function<void(const CollectiveError&)>& rethrow_collective = {});

/// How long a rank that raised a CollectiveError waits for every other rank to raise one too.
inline constexpr double kSettleTimeoutS = 5.0;

/// Error path only, for a CollectiveError `e` this rank raised where no mpi::agree reached the
/// other ranks (they may be computing, or waiting for this rank in a collective or a receive).
/// Collective over `verdict`, a duplicate of world used for nothing else (so it never matches a
/// collective another rank is blocked in): returns once every rank has called it (they all raised
/// it: a collective error, rank 0 prints it); when some rank has not within `timeout_s`, this rank
/// prints e's problems itself and aborts the job with e's exit code (never returns). Call it at
/// most once per `verdict`, before unwinding what other ranks may be waiting on (a transport).
void settle_collective_error(const CollectiveError& e, MPI_Comm verdict, double timeout_s = kSettleTimeoutS);

}  // namespace atlas::mpi
