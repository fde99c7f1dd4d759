// SPDX-License-Identifier: MIT
// Signal handlers of a training job (see the header). The handlers touch only lock-free atomics
// and, for the interrupt note, buffers filled before they were installed.
#include "atlas/core/signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "atlas/core/check.hpp"

namespace atlas::signals {

namespace {

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handlers need lock-free atomics");

std::atomic<int> g_stop{0};
std::atomic<bool> g_stop_installed{false};
struct sigaction g_old_usr1 {};

extern "C" void on_stop(int sig) { g_stop.store(sig, std::memory_order_relaxed); }

constexpr std::array<int, 3> kFatal{SIGTERM, SIGINT, SIGHUP};
std::array<struct sigaction, kFatal.size()> g_old_fatal{};
std::array<bool, kFatal.size()> g_fatal_installed{};
std::atomic<bool> g_note_armed{false};
std::atomic<bool> g_note_taken{false};  // the first fatal signal writes the note, once
std::atomic<bool> g_note_done{false};   // ... and says when it is written
constexpr int kNoteWaitMs = 2000;       // how long a second fatal signal waits for that
std::atomic<int> g_step{-1};
std::atomic<int> g_checkpoint{-1};

constexpr std::size_t kPath = 4096;
char g_log_path[kPath];
char g_json_path[kPath];
char g_json_tmp[kPath + 16];
char g_json_head[1024];  // {"run":"NAME","status":"interrupted"
char g_resume_hint[kPath + 64];  // run.resume=latest [run.resume_fallback=PATH]
int g_steps = 0;

/// Text built without allocation, for use inside a signal handler.
struct Text {
  char d[2048];
  std::size_t n = 0;
  void add(const char* s) {
    while (*s != '\0' && n + 1 < sizeof d) d[n++] = *s++;
  }
  void add(long v) {
    char tmp[24];
    std::size_t k = 0;
    const bool neg = v < 0;
    unsigned long u = neg ? static_cast<unsigned long>(-(v + 1)) + 1 : static_cast<unsigned long>(v);
    do {
      tmp[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0 && k < sizeof tmp);
    if (neg && n + 1 < sizeof d) d[n++] = '-';
    while (k > 0 && n + 1 < sizeof d) d[n++] = tmp[--k];
  }
};

const char* fatal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

void write_all(int fd, const Text& t) {
  std::size_t off = 0;
  while (off < t.n) {
    const ssize_t w = ::write(fd, t.d + off, t.n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<std::size_t>(w);
  }
}

/// `t` on stderr from a signal handler, SIGPIPE ignored for the write (sigaction is
/// async-signal-safe): a broken stderr gives EPIPE, and the process still dies of its own signal,
/// not of SIGPIPE.
void write_stderr(const Text& t) {
  struct sigaction ignore {};
  struct sigaction old_pipe {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  const bool pipe_ignored = ::sigaction(SIGPIPE, &ignore, &old_pipe) == 0;
  write_all(STDERR_FILENO, t);
  if (pipe_ignored) (void)::sigaction(SIGPIPE, &old_pipe, nullptr);
}

void write_note(int sig) {
  const int step = g_step.load(std::memory_order_relaxed);
  const int ckpt = g_checkpoint.load(std::memory_order_relaxed);
  Text line;
  line.add("ERROR: rank 0 received ");
  line.add(fatal_name(sig));
  line.add(" during step ");
  line.add(static_cast<long>(step));
  line.add(" of run.steps = ");
  line.add(static_cast<long>(g_steps));
  line.add(" (scancel, a time limit, Ctrl-C, or the launcher ending the job after another rank failed)");
  if (ckpt >= 0) {
    line.add("; the newest checkpoint is at step ");
    line.add(static_cast<long>(ckpt));
    line.add(" (resume with ");
    line.add(g_resume_hint);
    line.add(")\n");
  } else {
    line.add("; no checkpoint of this run was written yet\n");
  }
  line.add("  hint: to stop with a checkpoint instead, send SIGUSR1 (Slurm: #SBATCH --signal=B:USR1@300; docs/slurm.md)\n");
  // The files first, stderr last: a stderr whose reader has gone (`atlas train ... | tee`, tee
  // ended by the same Ctrl-C) raised SIGPIPE, which killed the process before log.txt and
  // run.json had the note; a full pipe would block it here.
  int fd = ::open(g_log_path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd >= 0) {
    write_all(fd, line);
    ::close(fd);
  }
  Text json;
  json.add(g_json_head);
  json.add(",\"signal\":\"");
  json.add(fatal_name(sig));
  json.add("\",\"step\":");
  json.add(static_cast<long>(step));
  json.add(",\"steps\":");
  json.add(static_cast<long>(g_steps));
  json.add(",\"checkpoint_step\":");
  if (ckpt >= 0) {
    json.add(static_cast<long>(ckpt));
  } else {
    json.add("null");
  }
  json.add("}\n");
  fd = ::open(g_json_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);  // never through a link
  if (fd >= 0) {
    write_all(fd, json);
    ::close(fd);
    (void)::rename(g_json_tmp, g_json_path);
  }
  write_stderr(line);
}

extern "C" void on_fatal(int sig) {
  const int saved = errno;
  if (g_note_armed.load(std::memory_order_relaxed)) {
    if (!g_note_taken.exchange(true)) {
      write_note(sig);
      g_note_done.store(true);
    } else {
      // A second fatal signal, on another thread, while the first one's handler writes the note:
      // dying now would cut the note short. Wait for it (nanosleep is async-signal-safe), at
      // most kNoteWaitMs: a note stuck on a hung file system must not keep the process alive.
      for (int waited = 0; waited < kNoteWaitMs && !g_note_done.load(); waited += 10) {
        const timespec ten_ms{0, 10'000'000};
        ::nanosleep(&ten_ms, nullptr);
      }
    }
  }
  // The process dies of the signal as it would have (the launcher reads 128 + signal): the
  // previous disposition comes back and the signal, blocked while this handler runs, is
  // delivered again when it returns.
  for (std::size_t i = 0; i < kFatal.size(); ++i)
    if (kFatal[i] == sig) (void)::sigaction(sig, &g_old_fatal[i], nullptr);
  errno = saved;
  (void)::raise(sig);
}

void copy_bounded(char* dst, std::size_t cap, const std::string& src, const char* what) {
  if (src.size() + 1 > cap)
    ATLAS_THROW(Internal, what << " is too long for the interrupt note (" << src.size() << " bytes, at most "
                               << cap - 1 << ")");
  std::memcpy(dst, src.c_str(), src.size() + 1);
}

// ---- SIGBUS in a mapped file ----

struct MappedSlot {
  std::atomic<const char*> base{nullptr};  ///< null: a free slot; set last, cleared first
  std::atomic<std::size_t> bytes{0};
  std::atomic<const char*> text{nullptr};
};
std::array<MappedSlot, MappedFileWatch::kMaxMappedFiles> g_mapped{};
struct sigaction g_old_bus {};
std::atomic<bool> g_bus_installed{false};

extern "C" void on_bus(int sig, siginfo_t* info, void* /*context*/) {
  const int saved = errno;
  const char* addr = static_cast<const char*>(info->si_addr);
  // si_addr means something only for a fault (si_code > 0), not for a SIGBUS sent by kill.
  for (auto& slot : g_mapped) {
    if (info->si_code <= 0) break;
    const char* base = slot.base.load(std::memory_order_acquire);
    const char* text = slot.text.load(std::memory_order_relaxed);
    if (base == nullptr || text == nullptr || addr < base || addr >= base + slot.bytes.load(std::memory_order_relaxed)) continue;
    Text line;
    line.add("ERROR: SIGBUS reading ");
    line.add(text);
    line.add(" at byte ");
    line.add(static_cast<long>(addr - base));
    line.add(": the file is shorter than when it was opened (truncated or rewritten in place while this run "
             "reads it), or its file system failed\n  hint: write a new data set into another directory or by "
             "rename (atlas tokenize replaces files by rename, which a running job survives); then resume with "
             "run.resume=latest\n");
    write_stderr(line);
    break;
  }
  // The process dies of the signal as it would have: the previous disposition comes back; a fault
  // is raised again by the same instruction once this returns, a SIGBUS sent by kill is re-raised.
  (void)::sigaction(SIGBUS, &g_old_bus, nullptr);
  errno = saved;
  if (info->si_code <= 0) (void)::raise(sig);
}

void install_bus_handler() {
  if (g_bus_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_bus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  if (::sigaction(SIGBUS, &sa, &g_old_bus) != 0) {
    g_bus_installed.store(false);
    ATLAS_THROW(Internal, "sigaction(SIGBUS) failed: " << std::strerror(errno));
  }
}

}  // namespace

MappedFileWatch::MappedFileWatch(const void* base, std::size_t bytes, const std::string& path, const std::string& what)
    : m_text(what + " '" + path + "'") {
  if (base == nullptr || bytes == 0) return;
  install_bus_handler();
  for (int i = 0; i < kMaxMappedFiles; ++i) {
    MappedSlot& slot = g_mapped[static_cast<std::size_t>(i)];
    const char* expected = nullptr;
    // Claim a free slot with a placeholder address no mapping has, then fill it and publish.
    static const char kClaimed = 0;
    if (!slot.base.compare_exchange_strong(expected, &kClaimed, std::memory_order_acq_rel)) continue;
    slot.text.store(m_text.c_str(), std::memory_order_relaxed);
    slot.bytes.store(bytes, std::memory_order_relaxed);
    slot.base.store(static_cast<const char*>(base), std::memory_order_release);
    m_slot = i;
    return;
  }
}

MappedFileWatch::~MappedFileWatch() {
  if (m_slot < 0) return;
  MappedSlot& slot = g_mapped[static_cast<std::size_t>(m_slot)];
  slot.base.store(nullptr, std::memory_order_release);
  slot.bytes.store(0, std::memory_order_relaxed);  // a slot claimed next matches nothing until filled
  slot.text.store(nullptr, std::memory_order_relaxed);
}

StopRequests::StopRequests() {
  ATLAS_ASSERT(!g_stop_installed.exchange(true), "a second signals::StopRequests scope");
  g_stop.store(0, std::memory_order_relaxed);
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (::sigaction(SIGUSR1, &sa, &g_old_usr1) != 0)
    ATLAS_THROW(Internal, "sigaction(SIGUSR1) failed: " << std::strerror(errno));
}

StopRequests::~StopRequests() {
  // A request that comes after the job has nothing left to stop, and must not kill a rank that
  // stopped cleanly (a second scancel, or Slurm signalling the batch shell and the steps both):
  // the default action (terminate) becomes "ignore"; a handler someone else installed comes back.
  if (g_old_usr1.sa_handler == SIG_DFL && (g_old_usr1.sa_flags & SA_SIGINFO) == 0) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    (void)::sigaction(SIGUSR1, &ignore, nullptr);
  } else {
    (void)::sigaction(SIGUSR1, &g_old_usr1, nullptr);
  }
  g_stop_installed.store(false);
}

int stop_requested() noexcept { return g_stop.load(std::memory_order_relaxed); }

void clear_stop_request() noexcept { g_stop.store(0, std::memory_order_relaxed); }

InterruptNotes::InterruptNotes(const InterruptNote& note) {
  ATLAS_ASSERT(!g_note_armed.load(), "a second signals::InterruptNotes scope");
  copy_bounded(g_log_path, sizeof g_log_path, note.log_path, "the log path");
  copy_bounded(g_json_path, sizeof g_json_path, note.run_json_path, "the run.json path");
  copy_bounded(g_json_tmp, sizeof g_json_tmp, note.run_json_path + ".signal.tmp", "the run.json path");
  copy_bounded(g_json_head, sizeof g_json_head,
               fmt::format("{{\"run\":\"{}\",\"status\":\"interrupted\"", note.run_name), "the run name");
  copy_bounded(g_resume_hint, sizeof g_resume_hint, note.resume_hint, "the resume hint");
  g_steps = note.steps;
  g_note_taken.store(false);
  g_note_done.store(false);
  for (std::size_t i = 0; i < kFatal.size(); ++i) {
    struct sigaction old {};
    (void)::sigaction(kFatal[i], nullptr, &old);
    // A signal the process was told to ignore (nohup's SIGHUP) stays ignored.
    g_fatal_installed[i] = old.sa_handler != SIG_IGN;
    if (!g_fatal_installed[i]) continue;
    struct sigaction sa {};
    sa.sa_handler = on_fatal;
    sigemptyset(&sa.sa_mask);
    for (const int s : kFatal) sigaddset(&sa.sa_mask, s);  // one note, whichever comes first
    sa.sa_flags = SA_RESTART;
    if (::sigaction(kFatal[i], &sa, &g_old_fatal[i]) != 0)
      ATLAS_THROW(Internal, "sigaction(" << fatal_name(kFatal[i]) << ") failed: " << std::strerror(errno));
  }
  g_note_armed.store(true);
}

InterruptNotes::~InterruptNotes() {
  g_note_armed.store(false);
  for (std::size_t i = 0; i < kFatal.size(); ++i)
    if (g_fatal_installed[i]) (void)::sigaction(kFatal[i], &g_old_fatal[i], nullptr);
}

void set_progress(int step, int checkpoint_step) noexcept {
  g_step.store(step, std::memory_order_relaxed);
  g_checkpoint.store(checkpoint_step, std::memory_order_relaxed);
}

}  // namespace atlas::signals
