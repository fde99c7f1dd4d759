// SPDX-License-Identifier: MIT
// The progress line (see progress.hpp): a thread that sleeps until the first deadline, then prints
// "<what>: <detail> (<seconds> s)" to stderr at each interval until the work ends.
#include "atlas/app/progress.hpp"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "atlas/core/units.hpp"

namespace atlas::app {

Progress::Progress(std::string what, double after_s, double every_s)
    : m_what(std::move(what)), m_after_s(after_s), m_every_s(every_s > 0 ? every_s : 5.0) {
  if (m_after_s >= 0) m_thread = std::thread([this] { loop(); });
}

Progress::~Progress() {
  {
    const std::lock_guard<std::mutex> lock(m_mutex);
    m_done = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void Progress::set(std::string detail) {
  const std::lock_guard<std::mutex> lock(m_mutex);
  m_detail = std::move(detail);
}

void Progress::loop() {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto next = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m_after_s));
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_cv.wait_until(lock, next, [this] { return m_done; })) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string line = fmt::format("{}: {}({:.0f} s)\n", m_what, m_detail.empty() ? "" : m_detail + " ", s);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    m_printed = true;
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m_every_s));
  }
  if (m_printed) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fputs(fmt::format("{}: done ({:.1f} s)\n", m_what, s).c_str(), stderr);
  }
}

double progress_after_s(const Args& args) {
  if (!args.flag("progress-after")) return 3.0;
  const auto s = units::parse_double(args.option("progress-after"));
  if (!s || !(*s >= 0) || *s > 1e6)
    throw UsageError("--progress-after needs seconds in [0, 1e6] (the progress line starts after that long)");
  return *s;
}

}  // namespace atlas::app
