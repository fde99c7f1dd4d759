// SPDX-License-Identifier: MIT
// The KV-handoff protocol between a DC's inference ranks and its decode worker: length-prefixed
// frames over one local TCP connection per rank (both ends run on the same machine type, so
// fields are in host byte order). Outbox writes without ever blocking the caller (training
// ranks flush it in their bubbles); Inbox reassembles frames from non-blocking reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "atlas/bubbletea/model.hpp"
#include "atlas/core/error.hpp"

namespace atlas::bubbletea::wire {

inline constexpr std::uint32_t kMagic = 0x41455442;  ///< "BTEA"
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint64_t kMaxFrameBytes = std::uint64_t{1} << 32;  ///< a bigger length is corrupt

enum class Type : std::uint32_t {
  Hello = 1,        ///< rank -> worker: who I am, the model shape, my layers
  Tensor = 2,       ///< rank -> worker: one weight tensor (name, floats)
  WeightsDone = 3,  ///< rank -> worker: all my tensors were sent
  Ready = 4,        ///< worker -> DC rank 0: every rank's weights arrived, the model is built
  Kv = 5,           ///< rank -> worker: one request's keys and values of my layers
  First = 6,        ///< head rank -> worker: the request's first token (prefill finished)
  Finish = 7,       ///< rank -> worker: nothing more will come on this connection
  Result = 8,       ///< worker -> DC rank 0: one request's generated tokens and timings
  Done = 9,         ///< worker -> DC rank 0: every finished connection drained; worker exits
  Fail = 10,        ///< worker -> DC rank 0: an error message; worker exits
};

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint32_t type = 0;
  std::uint64_t bytes = 0;  ///< payload bytes after this header
};

struct Frame {
  Type type = Type::Hello;
  std::vector<char> payload;
};

/// Appends plain values to a payload.
class Writer {
 public:
  template <class T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    m_buf.insert(m_buf.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& put_bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    m_buf.insert(m_buf.end(), c, c + n);
    return *this;
  }
  Writer& put_string(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    return put_bytes(s.data(), s.size());
  }
  /// Reserves `n` bytes and returns where they start (filled by the caller, e.g. a download).
  char* grow(std::size_t n) {
    m_buf.resize(m_buf.size() + n);
    return m_buf.data() + m_buf.size() - n;
  }
  [[nodiscard]] std::vector<char> take() { return std::move(m_buf); }

 private:
  std::vector<char> m_buf;
};

/// Reads plain values from a payload; throws atlas::Error (Comm) past its end.
class Reader {
 public:
  explicit Reader(std::span<const char> data) : m_data(data) {}
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, need(sizeof(T)), sizeof(T));
    return v;
  }
  const char* get_bytes(std::size_t n) { return need(n); }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    return std::string(need(n), n);
  }
  [[nodiscard]] std::size_t left() const { return m_data.size() - m_at; }

 private:
  const char* need(std::size_t n);
  std::span<const char> m_data;
  std::size_t m_at = 0;
};

/// Frames waiting to be written to one socket. Never blocks in flush_some().
class Outbox {
 public:
  explicit Outbox(int fd = -1) : m_fd(fd) {}
  /// `peer` names the other end in errors (a reset socket has no peer name left to ask for).
  void set_fd(int fd, std::string peer = {}) {
    m_fd = fd;
    m_peer = std::move(peer);
  }
  /// Queues one frame (copies nothing more than the payload it is given). `tag` (>= 0) is
  /// reported by take_written() once the whole frame is in the socket.
  void push(Type type, std::vector<char> payload, std::int64_t tag = -1);
  /// Writes whatever the socket takes right now. Returns true when nothing is left. Throws
  /// atlas::Error (Comm) when the peer closed or the socket failed.
  bool flush_some();
  /// Writes everything, waiting up to `timeout_s`; throws atlas::Error (Comm) on timeout.
  void flush_all(double timeout_s);
  /// Tags of the frames written since the last call.
  [[nodiscard]] std::vector<std::int64_t> take_written();
  /// Drops every queued frame (a dead peer); returns the tags of the dropped frames.
  [[nodiscard]] std::vector<std::int64_t> drop_all();
  [[nodiscard]] std::size_t pending_bytes() const { return m_pending; }

 private:
  struct Item {
    std::vector<char> bytes;  // header + payload
    std::int64_t tag;
  };
  int m_fd;
  std::string m_peer;
  std::deque<Item> m_queue;
  std::size_t m_offset = 0;  // bytes of m_queue.front() already written
  std::size_t m_pending = 0;
  std::vector<std::int64_t> m_written;
};

/// Frames read from one socket.
class Inbox {
 public:
  /// Reads what is available now (non-blocking). Returns false once the peer closed the
  /// connection (frames already complete can still be taken). Throws on a socket error or a
  /// corrupt header.
  bool read_some(int fd);
  /// The next complete frame, if any.
  std::optional<Frame> next();
  /// Names the other end in errors (a reset socket has no peer name left to ask for).
  void set_peer(std::string peer) { m_peer = std::move(peer); }
  /// The name set_peer() gave, or the socket's peer address.
  [[nodiscard]] std::string peer(int fd) const;

 private:
  std::vector<char> m_buf;
  std::size_t m_at = 0;
  std::string m_peer;
};

// ---- payloads ----

struct Hello {
  std::uint32_t version = kVersion;
  std::int32_t dc = 0;
  std::int32_t dc_rank = 0;
  std::int32_t dc_size = 1;
  InferShape shape;
  LayerRange range;
};

struct KvPart {
  std::int64_t request = 0;
  std::int32_t first_layer = 0;
  std::int32_t layers = 0;
  std::int32_t len = 0;          ///< positions per layer
  std::vector<float> data;       ///< per layer: K [len, hidden] then V [len, hidden]
};

struct FirstToken {
  std::int64_t request = 0;
  std::int32_t prompt_tokens = 0;
  std::int32_t first_token = 0;
  std::int32_t max_new_tokens = 1;
  double first_token_s = 0.0;  ///< job clock of the prefill's end (informational)
};

struct Result {
  std::int64_t request = 0;
  double wait_s = 0.0;    ///< worker: complete KV to decode start
  double decode_s = 0.0;  ///< worker: decode compute
  std::vector<std::int32_t> tokens;
};

std::vector<char> encode(const Hello& h);
Hello decode_hello(std::span<const char> p);
/// A KvPart frame straight from a cache (downloads `cache.len` positions of every layer).
std::vector<char> encode_kv(std::int64_t request, const InferenceModel& model, const KvCache& cache);
KvPart decode_kv(std::span<const char> p);
std::vector<char> encode(const FirstToken& f);
FirstToken decode_first(std::span<const char> p);
std::vector<char> encode(const Result& r);
Result decode_result(std::span<const char> p);
std::vector<char> encode_tensor(const std::string& name, std::span<const float> values);
/// A Tensor frame's name and values; a count the payload does not hold is an Error (Comm),
/// checked before anything is allocated.
std::pair<std::string, std::vector<float>> decode_tensor(std::span<const char> p);

/// Blocking send of one frame on a blocking or non-blocking socket (setup and teardown only),
/// waiting up to `timeout_s`.
void send_frame(int fd, Type type, const std::vector<char>& payload, double timeout_s);
/// Blocking receive of one frame, waiting up to `timeout_s`; `inbox` keeps bytes read past it.
/// Throws atlas::Error (Comm) on timeout or when the peer closed.
Frame recv_frame(int fd, Inbox& inbox, double timeout_s, const char* waiting_for);

}  // namespace atlas::bubbletea::wire
