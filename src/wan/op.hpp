// SPDX-License-Identifier: MIT
// Internal: the state a Handle points to, shared by the transport implementations. Not a public
// header (lives next to the sources).
#pragma once

#include <atomic>
#include <string>

namespace atlas::wan {
class PeerTransport;
}

namespace atlas::wan::detail {

enum class OpState : int { Pending = 0, Done = 1, Failed = 2 };

/// One isend/irecv. The progress side publishes the outcome with a release store of `state`
/// (after writing `error`); the application thread reads it with an acquire load.
class Op {
 public:
  Op(const PeerTransport* owner, bool is_send, int peer, int tag)
      : m_owner(owner), m_is_send(is_send), m_peer(peer), m_tag(tag) {}
  virtual ~Op() = default;
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  [[nodiscard]] OpState state() const noexcept { return m_state.load(std::memory_order_acquire); }
  [[nodiscard]] const std::string& error() const noexcept { return m_error; }
  [[nodiscard]] const PeerTransport* owner() const noexcept { return m_owner; }
  [[nodiscard]] bool is_send() const noexcept { return m_is_send; }
  [[nodiscard]] int peer() const noexcept { return m_peer; }
  [[nodiscard]] int tag() const noexcept { return m_tag; }

  void set_done() noexcept { m_state.store(OpState::Done, std::memory_order_release); }
  void set_failed(std::string why) noexcept {
    m_error = std::move(why);
    m_state.store(OpState::Failed, std::memory_order_release);
  }

 private:
  const PeerTransport* m_owner;
  bool m_is_send;
  int m_peer;
  int m_tag;
  std::atomic<OpState> m_state{OpState::Pending};
  std::string m_error;
};

}  // namespace atlas::wan::detail
