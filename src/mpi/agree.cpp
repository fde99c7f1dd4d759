// SPDX-License-Identifier: MIT
// mpi::agree: every rank's outcome of one step, gathered; the same exception everywhere.
#include "atlas/mpi/agree.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <unordered_set>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/core/log.hpp"

namespace atlas::mpi {

namespace {

constexpr char kSep = '\x1f';  // between problems of one rank (never in a message)

}  // namespace

void agree(const Comm& comm, const std::string& what, const std::function<void()>& fn) {
  // Encoded outcome: "" = ok, else "<kind><exit code>" + kSep + problems joined by kSep, where
  // kind 'C' = ConfigError, 'E' = any other error.
  std::string mine;
  const auto encode = [&](char kind, ExitCode code, const std::vector<std::string>& problems) {
    mine = fmt::format("{}{}", kind, static_cast<int>(code));
    for (const auto& p : problems) mine += kSep + p;
  };
  try {
    fn();
  } catch (const ConfigError& e) {
    encode('C', ExitCode::Config, e.problems());
  } catch (const CollectiveError& e) {
    encode('E', e.code(), e.problems());
  } catch (const Error& e) {
    encode('E', e.code(), {fmt::format("rank {}: {}", comm.rank(), e.what())});
  } catch (const std::exception& e) {
    encode('E', ExitCode::Internal, {fmt::format("rank {}: internal error: {}", comm.rank(), e.what())});
  } catch (...) {  // anything else must still reach the gather: the other ranks wait in it
    encode('E', ExitCode::Internal,
           {fmt::format("rank {}: internal error: an exception of an unknown type", comm.rank())});
  }
  const std::vector<std::string> all = comm.allgather_strings(mine);
  std::vector<std::string> problems;
  std::unordered_set<std::string> seen;  // each problem once, in first-seen order (ranks repeat theirs)
  bool all_config = true;
  int code = -1;  // the lowest failing rank's
  for (const std::string& s : all) {
    if (s.empty()) continue;
    const std::size_t sep = s.find(kSep);
    const std::string head = s.substr(0, sep);
    if (head[0] != 'C') all_config = false;
    if (code < 0) code = std::stoi(head.substr(1));
    std::size_t at = sep;
    while (at != std::string::npos) {
      const std::size_t end = s.find(kSep, at + 1);
      std::string p = s.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
      if (seen.insert(p).second) problems.push_back(std::move(p));
      at = end;
    }
  }
  if (code < 0) return;
  if (problems.empty()) problems.push_back(fmt::format("another rank failed while {} (see its message)", what));
  if (all_config) throw ConfigError(problems);
  throw CollectiveError(static_cast<ExitCode>(code), problems);
}

std::string agree_on_root(const Comm& comm, int root, const std::function<std::string()>& fn,
                          const std::function<void(const CollectiveError&)>& rethrow_collective) {
  // The root's outcome: "" = ok (the payload follows in a second broadcast), else
  // "<kind><exit code>" + kSep + problems joined by kSep, where kind 'C' = ConfigError,
  // 'K' = another CollectiveError, 'E' = atlas::Error or any other exception.
  std::string verdict;
  std::string payload;
  if (comm.rank() == root) {
    const auto encode = [&](char kind, ExitCode code, const std::vector<std::string>& problems) {
      verdict = fmt::format("{}{}", kind, static_cast<int>(code));
      for (const auto& p : problems) verdict += kSep + p;
    };
    try {
      payload = fn();
    } catch (const ConfigError& e) {
      encode('C', ExitCode::Config, e.problems());
    } catch (const CollectiveError& e) {
      encode('K', e.code(), e.problems());
    } catch (const Error& e) {
      encode('E', e.code(), {e.what()});
    } catch (const std::exception& e) {
      encode('E', ExitCode::Internal, {e.what()});
    } catch (...) {  // the other ranks wait in the broadcast below
      encode('E', ExitCode::Internal, {"internal error: an exception of an unknown type"});
    }
  }
  comm.bcast_string(verdict, root);
  if (verdict.empty()) {
    comm.bcast_string(payload, root);
    return payload;
  }
  const std::size_t sep = verdict.find(kSep);
  const char kind = verdict[0];
  const auto code = static_cast<ExitCode>(std::stoi(verdict.substr(1, sep - 1)));
  std::vector<std::string> problems;
  for (std::size_t at = sep; at != std::string::npos;) {
    const std::size_t end = verdict.find(kSep, at + 1);
    problems.push_back(verdict.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1));
    at = end;
  }
  if (kind == 'C') throw ConfigError(problems);
  if (kind == 'K') {
    const CollectiveError e(code, problems);
    if (rethrow_collective) rethrow_collective(e);
    throw e;
  }
  // Already carries its call site from the rank that raised it.
  throw Error(code, problems.empty() ? std::string() : problems.front());
}

void settle_collective_error(const CollectiveError& e, MPI_Comm verdict, double timeout_s) {
  int size = 1;
  if (verdict == MPI_COMM_NULL) return;  // MPI not initialised: one process, nothing to settle
  if (MPI_Comm_size(verdict, &size) != MPI_SUCCESS || size == 1) return;
  bool all = false;
  MPI_Request raw = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(verdict, &raw) == MPI_SUCCESS) {
    Request req(raw);
    try {
      all = req.wait_polling_for(timeout_s, 20000);
    } catch (const Error&) {  // an MPI failure here: the others cannot be reached either
    }
    // A request still pending is forgotten, not waited on: the job is aborted next.
    if (!all) req.abandon();
  }
  if (all) return;
  for (const auto& p : e.problems()) log::error("{}", p);
  log::error("this error was raised on some ranks only (the others did not stop within {:.0f} s): aborting the "
             "job with exit code {}",
             timeout_s, static_cast<int>(e.code()));
  MPI_Abort(MPI_COMM_WORLD, static_cast<int>(e.code()));
  std::_Exit(static_cast<int>(e.code()));
}

}  // namespace atlas::mpi
