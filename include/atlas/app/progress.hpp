// SPDX-License-Identifier: MIT
// A progress line on stderr for commands that may work for a while (atlas plan, atlas simulate):
// silent when the work ends within `after_s`, then one line every `every_s` seconds with what the
// work last reported. Not a log: stdout (the result) is never touched.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "atlas/app/commands.hpp"

namespace atlas::app {

class Progress {
 public:
  /// Starts the clock. `what` names the command ("atlas plan"); after_s < 0: never print.
  explicit Progress(std::string what, double after_s = 3.0, double every_s = 5.0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// What the work is doing now (thread-safe; shown in the next line).
  void set(std::string detail);
  /// A callback for the rooms below (plan::PlanOptions::progress) that forwards to set().
  [[nodiscard]] auto setter() {
    return [this](const std::string& d) { set(d); };
  }

 private:
  void loop();
  std::string m_what;
  double m_after_s;
  double m_every_s;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::string m_detail;
  bool m_done = false;
  bool m_printed = false;
  std::thread m_thread;
};

/// `--progress-after SECONDS` (default 3: a progress line only for work longer than that; 0: at
/// once). UsageError for anything but a number in [0, 1e6].
double progress_after_s(const Args& args);

}  // namespace atlas::app
