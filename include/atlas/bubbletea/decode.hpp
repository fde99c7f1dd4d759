// SPDX-License-Identifier: MIT
// The decode side of BubbleTea: a decode worker (one process per DC, outside the training
// pipeline) receives every inference rank's weights once, then each finished prefill's KV cache
// parts and first token, runs greedy decoding and reports the tokens to the DC's rank 0. Also
// how a rank starts that process and connects to it. No MPI here.
#pragma once

#include <sys/types.h>

#include <string>

#include "atlas/wan/fd.hpp"

namespace atlas::bubbletea {

struct DecodeServerOptions {
  double timeout_s = 60.0;  ///< waits for the ranks' connections and weights at start-up
  int threads = 1;          ///< host backend threads for decoding
};

/// What one worker did (also sent to rank 0 in the Done frame).
struct DecodeSummary {
  int results = 0;     ///< requests decoded and reported
  int incomplete = 0;  ///< requests whose KV parts or first token never all arrived
};

/// The worker's event loop over one listening socket: accepts the DC's ranks (their Hello names
/// the DC size), builds the whole inference model from the weights they send, answers Ready to
/// DC rank 0, then decodes each request as soon as its KV cache is complete and sends the Result
/// to DC rank 0. Returns once every connection sent Finish and every complete request was
/// decoded (after sending Done). Throws atlas::Error (Comm) on a broken or early-closed
/// connection, a timeout or inconsistent weights; it tries to tell DC rank 0 first (Fail frame).
class DecodeServer {
 public:
  DecodeServer(wan::Fd listener, DecodeServerOptions options);
  DecodeSummary run();

 private:
  wan::Fd m_listener;
  DecodeServerOptions m_opt;
};

/// The program that runs a DecodeServer: $ATLAS_DECODE_WORKER if set, else atlas-decode-worker
/// next to this executable. Throws ConfigError (with a hint) when it does not exist.
[[nodiscard]] std::string default_worker_program();

/// A started decode worker process. Move-only; the destructor kills a worker still running.
class WorkerProcess {
 public:
  /// Starts `program --host HOST --ready-fd 3 --threads T --nice N --timeout-s S` and waits up
  /// to `timeout_s` for the port it listens on. Throws atlas::Error (Comm) when it cannot start.
  static WorkerProcess spawn(const std::string& program, const std::string& host, int threads, int nice,
                             double timeout_s);
  WorkerProcess() = default;
  WorkerProcess(WorkerProcess&& o) noexcept;
  WorkerProcess& operator=(WorkerProcess&& o) noexcept;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess();

  [[nodiscard]] int port() const noexcept { return m_port; }
  [[nodiscard]] pid_t pid() const noexcept { return m_pid; }
  /// Waits up to `timeout_s` for the worker to exit; kills it when it does not. Returns its
  /// exit status (128 + signal when killed).
  int wait(double timeout_s);

 private:
  pid_t m_pid = -1;
  int m_port = 0;
};

}  // namespace atlas::bubbletea
