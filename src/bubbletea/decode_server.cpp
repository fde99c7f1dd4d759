// SPDX-License-Identifier: MIT
// The decode worker's event loop (see decode.hpp): one poll() over the listener and the DC's rank
// connections; decoding runs between polls, one request at a time, in the order their KV caches
// became complete.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "atlas/bubbletea/decode.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/bubbletea/wire.hpp"
#include "atlas/core/check.hpp"
#include "atlas/device/backend.hpp"

namespace atlas::bubbletea {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Conn {
  wan::Fd fd;
  wire::Inbox in;
  wire::Outbox out;
  bool hello = false;
  bool weights = false;
  bool finished = false;
  bool closed = false;
  wire::Hello h;
};

struct Pending {
  std::vector<wire::KvPart> parts;
  int layers = 0;
  bool has_first = false;
  wire::FirstToken first;
  double complete_s = 0.0;
};

}  // namespace

DecodeServer::DecodeServer(wan::Fd listener, DecodeServerOptions options)
    : m_listener(std::move(listener)), m_opt(options) {}

DecodeSummary DecodeServer::run() {
  std::vector<std::unique_ptr<Conn>> conns;
  Conn* root = nullptr;  // DC rank 0: gets Ready, Results, Done
  int dc_size = -1;
  std::map<std::string, std::vector<float>> tensors;
  wire::Hello shape_from;
  std::unique_ptr<device::Backend> backend;
  std::unique_ptr<InferenceModel> model;
  std::map<std::int64_t, Pending> pending;
  std::deque<std::int64_t> ready;
  DecodeSummary summary;
  const double start = now_s();

  auto fail_to_root = [&](const std::string& msg) {
    if (root && !root->closed) {
      try {
        wire::send_frame(root->fd.get(), wire::Type::Fail, std::vector<char>(msg.begin(), msg.end()), 2.0);
      } catch (const Error&) {
      }
    }
  };

  auto handle = [&](Conn& c, wire::Frame& f) {
    switch (f.type) {
      case wire::Type::Hello: {
        c.h = wire::decode_hello(f.payload);
        c.hello = true;
        if (dc_size < 0) {
          dc_size = c.h.dc_size;
          shape_from = c.h;
        } else if (c.h.dc_size != dc_size || !(c.h.shape == shape_from.shape)) {
          ATLAS_THROW(Comm, "decode worker: rank " << c.h.dc_rank << " describes another job (DC size "
                                                   << c.h.dc_size << " vs " << dc_size << ", or another model shape)");
        }
        if (c.h.dc_rank == 0) root = &c;
        break;
      }
      case wire::Type::Tensor: {
        auto [name, values] = wire::decode_tensor(f.payload);
        tensors[name] = std::move(values);
        break;
      }
      case wire::Type::WeightsDone: c.weights = true; break;
      case wire::Type::Kv: {
        wire::KvPart k = wire::decode_kv(f.payload);
        Pending& p = pending[k.request];
        p.layers += k.layers;
        p.parts.push_back(std::move(k));
        break;
      }
      case wire::Type::First: {
        wire::FirstToken t = wire::decode_first(f.payload);
        Pending& p = pending[t.request];
        p.has_first = true;
        p.first = t;
        break;
      }
      case wire::Type::Finish: c.finished = true; break;
      default:
        ATLAS_THROW(Comm, "decode worker: unexpected frame type " << static_cast<int>(f.type) << " from rank "
                                                                  << c.h.dc_rank);
    }
  };

  auto build_model = [&] {
    const InferShape& sh = shape_from.shape;
    std::vector<int> covered(static_cast<std::size_t>(sh.layers), 0);
    for (const auto& c : conns)
      for (int l = c->h.range.first; l < c->h.range.first + c->h.range.count; ++l)
        if (l >= 0 && l < sh.layers) ++covered[static_cast<std::size_t>(l)];
    for (int l = 0; l < sh.layers; ++l)
      if (covered[static_cast<std::size_t>(l)] != 1)
        ATLAS_THROW(Comm, "decode worker: inference block " << l << " is held by " << covered[static_cast<std::size_t>(l)]
                                                            << " ranks (expected exactly one)");
    DeviceCfg dcfg;
    dcfg.backend = atlas::Backend::Host;
    dcfg.threads = m_opt.threads;
    backend = device::make_backend(dcfg);
    model = std::make_unique<InferenceModel>(sh, LayerRange{0, sh.layers, true, true}, *backend, 1);
    for (const auto& p : model->params()) {
      auto it = tensors.find(p.name);
      if (it == tensors.end()) ATLAS_THROW(Comm, "decode worker: no rank sent the weights of '" << p.name << "'");
      model->set_param(p.name, it->second);
    }
    tensors.clear();
  };

  auto decode_one = [&] {
    const std::int64_t id = ready.front();
    ready.pop_front();
    Pending p = std::move(pending[id]);
    pending.erase(id);
    const double t0 = now_s();
    const InferShape& sh = model->shape();
    KvCache cache = model->make_cache(p.first.prompt_tokens + p.first.max_new_tokens);
    const std::size_t row = static_cast<std::size_t>(sh.hidden) * sizeof(float);
    for (const auto& part : p.parts) {
      if (part.len != p.first.prompt_tokens)
        ATLAS_THROW(Comm, "decode worker: request " << id << " has a KV part of " << part.len << " positions for a "
                                                    << p.first.prompt_tokens << "-token prompt");
      const float* src = part.data.data();
      const std::size_t bytes = static_cast<std::size_t>(part.len) * row;
      for (int l = 0; l < part.layers; ++l) {
        const auto layer = static_cast<std::size_t>(part.first_layer + l);
        backend->upload(cache.k[layer].data(), src, bytes);
        src += bytes / sizeof(float);
        backend->upload(cache.v[layer].data(), src, bytes);
        src += bytes / sizeof(float);
      }
    }
    cache.len = p.first.prompt_tokens;
    wire::Result res;
    res.request = id;
    res.wait_s = t0 - p.complete_s;
    res.tokens = decode_greedy(*model, cache, p.first.first_token, p.first.max_new_tokens);
    res.decode_s = now_s() - t0;
    root->out.push(wire::Type::Result, wire::encode(res));
    ++summary.results;
  };

  try {
    while (true) {
      const bool all_hello = dc_size > 0 && static_cast<int>(conns.size()) == dc_size &&
                             std::all_of(conns.begin(), conns.end(), [](const auto& c) { return c->hello; });
      const bool all_weights = all_hello && std::all_of(conns.begin(), conns.end(), [](const auto& c) { return c->weights; });
      if (!model && all_weights) {
        if (!root) ATLAS_THROW(Comm, "decode worker: no connection from DC rank 0");
        build_model();
        root->out.push(wire::Type::Ready, {});
      }
      if (!model && now_s() - start > m_opt.timeout_s)
        ATLAS_THROW(Comm, "decode worker: the DC's ranks did not connect and send their weights within "
                              << m_opt.timeout_s << " s (" << conns.size() << " connected)");

      // Complete requests become ready in the order they completed.
      if (model)
        for (auto& [id, p] : pending)
          if (p.has_first && p.layers == model->shape().layers && p.complete_s == 0.0) {
            p.complete_s = now_s();
            ready.push_back(id);
          }
      if (model && !ready.empty()) decode_one();

      const bool all_finished =
          model && std::all_of(conns.begin(), conns.end(), [](const auto& c) { return c->finished; });
      if (all_finished && ready.empty()) {
        summary.incomplete = static_cast<int>(pending.size());
        wire::Writer w;
        w.put(static_cast<std::int32_t>(summary.results)).put(static_cast<std::int32_t>(summary.incomplete));
        root->out.push(wire::Type::Done, w.take());
        root->out.flush_all(m_opt.timeout_s);
        return summary;
      }

      if (root) root->out.flush_some();
      std::vector<pollfd> fds;
      fds.push_back({m_listener.get(), POLLIN, 0});
      for (const auto& c : conns) fds.push_back({c->fd.get(), static_cast<short>(c->closed ? 0 : POLLIN), 0});
      const int wait_ms = ready.empty() ? 100 : 0;
      if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
        ATLAS_THROW(Comm, "decode worker: poll failed: " << std::strerror(errno));
      if (fds[0].revents & POLLIN) {
        while (true) {
          const int fd = ::accept4(m_listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd < 0) break;
          auto c = std::make_unique<Conn>();
          c->fd = wan::Fd(fd);
          c->out.set_fd(fd);
          wan::tune_socket(fd, 0);
          conns.push_back(std::move(c));  // root is set by its Hello (unique_ptr: stable address)
        }
      }
      for (std::size_t i = 0; i < conns.size(); ++i) {
        Conn& c = *conns[i];
        if (c.closed) continue;
        const bool open = c.in.read_some(c.fd.get());
        while (auto f = c.in.next()) handle(c, *f);
        if (!open) {
          c.closed = true;
          if (!c.finished)
            ATLAS_THROW(Comm, "decode worker: rank " << (c.hello ? c.h.dc_rank : -1)
                                                     << " closed its connection without Finish (did the job fail?)");
        }
      }
    }
  } catch (const Error& e) {
    fail_to_root(e.what());
    throw;
  } catch (const std::exception& e) {
    // Out of memory, a library's error: rank 0 hears why, not only that the connection closed.
    fail_to_root(fmt::format("decode worker: internal error: {}", e.what()));
    throw;
  }
}

}  // namespace atlas::bubbletea
