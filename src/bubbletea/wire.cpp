// SPDX-License-Identifier: MIT
// KV-handoff frames and their non-blocking socket queues (see wire.hpp).
#include "atlas/bubbletea/wire.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/wan/fd.hpp"

namespace atlas::bubbletea::wire {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void comm_fail(const std::string& what) { ATLAS_THROW(Comm, what); }

std::vector<char> framed(Type type, const std::vector<char>& payload) {
  FrameHeader h;
  h.type = static_cast<std::uint32_t>(type);
  h.bytes = payload.size();
  std::vector<char> out(sizeof h + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
  return out;
}

}  // namespace

const char* Reader::need(std::size_t n) {
  if (m_at + n > m_data.size())
    comm_fail(fmt::format("decode-worker frame is truncated: needs {} more bytes at offset {} of {}", n, m_at,
                          m_data.size()));
  const char* p = m_data.data() + m_at;
  m_at += n;
  return p;
}

// ---- Outbox ----

void Outbox::push(Type type, std::vector<char> payload, std::int64_t tag) {
  std::vector<char> f = framed(type, payload);
  m_pending += f.size();
  m_queue.push_back(Item{std::move(f), tag});
}

std::vector<std::int64_t> Outbox::take_written() { return std::exchange(m_written, {}); }

std::vector<std::int64_t> Outbox::drop_all() {
  std::vector<std::int64_t> tags = take_written();
  for (const auto& it : m_queue)
    if (it.tag >= 0) tags.push_back(it.tag);
  m_queue.clear();
  m_offset = 0;
  m_pending = 0;
  return tags;
}

bool Outbox::flush_some() {
  while (!m_queue.empty()) {
    const std::vector<char>& f = m_queue.front().bytes;
    const ssize_t n = ::send(m_fd, f.data() + m_offset, f.size() - m_offset, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EINTR) continue;
      comm_fail(fmt::format("sending to the decode worker ({}) failed: {}", m_peer.empty() ? wan::peer_name(m_fd) : m_peer,
                            std::strerror(errno)));
    }
    m_offset += static_cast<std::size_t>(n);
    m_pending -= static_cast<std::size_t>(n);
    if (m_offset == f.size()) {
      if (m_queue.front().tag >= 0) m_written.push_back(m_queue.front().tag);
      m_queue.pop_front();
      m_offset = 0;
    }
  }
  return true;
}

void Outbox::flush_all(double timeout_s) {
  const double until = now_s() + timeout_s;
  while (!flush_some()) {
    const double left = until - now_s();
    if (left <= 0)
      comm_fail(fmt::format("the decode worker did not take {} queued bytes within {:.0f} s", m_pending, timeout_s));
    pollfd p{m_fd, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min(left, 0.2) * 1000) + 1);
  }
}

// ---- Inbox ----

bool Inbox::read_some(int fd) {
  char tmp[65536];
  while (true) {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n > 0) {
      m_buf.insert(m_buf.end(), tmp, tmp + n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    comm_fail(fmt::format("reading from the decode-worker connection ({}) failed: {}", peer(fd), std::strerror(errno)));
  }
}

std::string Inbox::peer(int fd) const { return m_peer.empty() ? wan::peer_name(fd) : m_peer; }

std::optional<Frame> Inbox::next() {
  if (m_buf.size() - m_at < sizeof(FrameHeader)) return std::nullopt;
  FrameHeader h;
  std::memcpy(&h, m_buf.data() + m_at, sizeof h);
  if (h.magic != kMagic || h.bytes > kMaxFrameBytes || h.type < 1 || h.type > 10)
    comm_fail(fmt::format("corrupt decode-worker frame (magic {:#x}, type {}, {} bytes)", h.magic, h.type, h.bytes));
  if (m_buf.size() - m_at - sizeof h < h.bytes) return std::nullopt;
  Frame f;
  f.type = static_cast<Type>(h.type);
  const char* p = m_buf.data() + m_at + sizeof h;
  f.payload.assign(p, p + h.bytes);
  m_at += sizeof h + h.bytes;
  if (m_at == m_buf.size()) {
    m_buf.clear();
    m_at = 0;
  } else if (m_at > (1U << 20)) {
    m_buf.erase(m_buf.begin(), m_buf.begin() + static_cast<std::ptrdiff_t>(m_at));
    m_at = 0;
  }
  return f;
}

// ---- blocking helpers (setup, teardown) ----

void send_frame(int fd, Type type, const std::vector<char>& payload, double timeout_s) {
  Outbox box(fd);
  box.push(type, payload);
  box.flush_all(timeout_s);
}

Frame recv_frame(int fd, Inbox& inbox, double timeout_s, const char* waiting_for) {
  const double until = now_s() + timeout_s;
  while (true) {
    if (auto f = inbox.next()) return std::move(*f);
    if (!inbox.read_some(fd)) {
      if (auto f = inbox.next()) return std::move(*f);
      comm_fail(fmt::format("the decode worker connection ({}) closed while waiting for {}", inbox.peer(fd),
                            waiting_for));
    }
    if (auto f = inbox.next()) return std::move(*f);
    const double left = until - now_s();
    if (left <= 0) comm_fail(fmt::format("no {} from the decode worker within {:.0f} s", waiting_for, timeout_s));
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min(left, 0.2) * 1000) + 1);
  }
}

// ---- payloads ----

std::vector<char> encode(const Hello& h) {
  Writer w;
  w.put(h.version).put(h.dc).put(h.dc_rank).put(h.dc_size);
  w.put(h.shape.layers).put(h.shape.hidden).put(h.shape.heads).put(h.shape.context).put(h.shape.vocab);
  w.put(h.range.first).put(h.range.count).put(static_cast<std::uint8_t>(h.range.has_embedding))
      .put(static_cast<std::uint8_t>(h.range.has_head));
  return w.take();
}

Hello decode_hello(std::span<const char> p) {
  Reader r(p);
  Hello h;
  h.version = r.get<std::uint32_t>();
  if (h.version != kVersion)
    comm_fail(fmt::format("decode-worker protocol version {} (this binary speaks {}): mixed atlas builds?", h.version,
                          kVersion));
  h.dc = r.get<std::int32_t>();
  h.dc_rank = r.get<std::int32_t>();
  h.dc_size = r.get<std::int32_t>();
  h.shape.layers = r.get<int>();
  h.shape.hidden = r.get<int>();
  h.shape.heads = r.get<int>();
  h.shape.context = r.get<int>();
  h.shape.vocab = r.get<int>();
  h.range.first = r.get<int>();
  h.range.count = r.get<int>();
  h.range.has_embedding = r.get<std::uint8_t>() != 0;
  h.range.has_head = r.get<std::uint8_t>() != 0;
  return h;
}

std::vector<char> encode_kv(std::int64_t request, const InferenceModel& model, const KvCache& cache) {
  const auto c = static_cast<std::size_t>(model.shape().hidden);
  const std::size_t row_bytes = static_cast<std::size_t>(cache.len) * c * sizeof(float);
  Writer w;
  w.put(request).put(static_cast<std::int32_t>(model.range().first)).put(static_cast<std::int32_t>(model.range().count))
      .put(static_cast<std::int32_t>(cache.len));
  for (std::size_t l = 0; l < cache.k.size(); ++l) {
    model.backend().download(w.grow(row_bytes), cache.k[l].data(), row_bytes);
    model.backend().download(w.grow(row_bytes), cache.v[l].data(), row_bytes);
  }
  return w.take();
}

KvPart decode_kv(std::span<const char> p) {
  Reader r(p);
  KvPart k;
  k.request = r.get<std::int64_t>();
  k.first_layer = r.get<std::int32_t>();
  k.layers = r.get<std::int32_t>();
  k.len = r.get<std::int32_t>();
  if (k.layers < 0 || k.len < 0 || r.left() % sizeof(float) != 0)
    comm_fail(fmt::format("corrupt KV frame for request {}", k.request));
  k.data.resize(r.left() / sizeof(float));
  std::memcpy(k.data.data(), r.get_bytes(r.left()), k.data.size() * sizeof(float));
  return k;
}

std::vector<char> encode(const FirstToken& f) {
  Writer w;
  w.put(f.request).put(f.prompt_tokens).put(f.first_token).put(f.max_new_tokens).put(f.first_token_s);
  return w.take();
}

FirstToken decode_first(std::span<const char> p) {
  Reader r(p);
  FirstToken f;
  f.request = r.get<std::int64_t>();
  f.prompt_tokens = r.get<std::int32_t>();
  f.first_token = r.get<std::int32_t>();
  f.max_new_tokens = r.get<std::int32_t>();
  f.first_token_s = r.get<double>();
  return f;
}

std::vector<char> encode(const Result& x) {
  Writer w;
  w.put(x.request).put(x.wait_s).put(x.decode_s).put(static_cast<std::int32_t>(x.tokens.size()));
  w.put_bytes(x.tokens.data(), x.tokens.size() * sizeof(std::int32_t));
  return w.take();
}

Result decode_result(std::span<const char> p) {
  Reader r(p);
  Result x;
  x.request = r.get<std::int64_t>();
  x.wait_s = r.get<double>();
  x.decode_s = r.get<double>();
  const auto n = r.get<std::int32_t>();
  // The count is checked against what the frame holds before the buffer is sized by it.
  if (n < 0 || static_cast<std::size_t>(n) > r.left() / sizeof(std::int32_t)) comm_fail("corrupt result frame");
  x.tokens.resize(static_cast<std::size_t>(n));
  std::memcpy(x.tokens.data(), r.get_bytes(x.tokens.size() * sizeof(std::int32_t)), x.tokens.size() * sizeof(std::int32_t));
  return x;
}

std::vector<char> encode_tensor(const std::string& name, std::span<const float> values) {
  Writer w;
  w.put_string(name);
  w.put(static_cast<std::uint64_t>(values.size()));
  w.put_bytes(values.data(), values.size() * sizeof(float));
  return w.take();
}

std::pair<std::string, std::vector<float>> decode_tensor(std::span<const char> p) {
  Reader r(p);
  std::string name = r.get_string();
  const auto n = r.get<std::uint64_t>();
  if (n > r.left() / sizeof(float) || r.left() % sizeof(float) != 0)
    comm_fail(fmt::format("corrupt tensor frame for '{}': {} values claimed, {} bytes held", name, n, r.left()));
  std::vector<float> v(static_cast<std::size_t>(n));
  std::memcpy(v.data(), r.get_bytes(v.size() * sizeof(float)), v.size() * sizeof(float));
  return {std::move(name), std::move(v)};
}

}  // namespace atlas::bubbletea::wire
