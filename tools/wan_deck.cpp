// SPDX-License-Identifier: MIT
// atlas-wan-deck: prints what the WAN emulation needs from a deck, as shell assignments
// (eval-able): DC names, the one-way latency and bandwidth matrices, the per-flow window, and
// how many of NP ranks each DC holds (the same rule as the rank layout: DCs in order, each
// holding stages_per_dc x dp x tp ranks), the TCP flows per WAN transfer (WAN_RAILS) and the
// compute backend (WAN_DEVICE_BACKEND). Usage: atlas-wan-deck DECK [--np N] [key=value ...]
#include <cstdio>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"

namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: atlas-wan-deck DECK [--np N] [key=value ...]\n");
    return 1;
  }
  const std::string path = argv[1];
  long np = -1;
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np" && i + 1 < argc) {
      const auto n = atlas::units::parse_int(argv[++i]);
      if (!n || *n < 1) {
        std::fprintf(stderr, "atlas-wan-deck: --np needs a positive integer\n");
        return 1;
      }
      np = static_cast<long>(*n);
    } else {
      overrides.push_back(a);
    }
  }
  try {
    const atlas::Config cfg = atlas::deck::parse(path, atlas::deck::read_text_file(path), overrides);
    const auto& cl = cfg.cluster;
    const int n = cl.dc_count();
    const auto nn = static_cast<std::size_t>(n * n);
    if (n < 1 || cl.latency_ms.size() != nn || cl.bandwidth_gbps.size() != nn) {
      std::fprintf(stderr, "atlas-wan-deck: %s: cluster.latency_ms and cluster.bandwidth_gbps need "
                           "%d x %d entries (row-major) for %d DCs\n", path.c_str(), n, n, n);
      return 2;
    }
    std::printf("WAN_DC_COUNT=%d\n", n);
    std::string names;
    for (const auto& d : cl.dcs) names += (names.empty() ? "" : " ") + d;
    std::printf("WAN_DC_NAMES=%s\n", quote(names).c_str());
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        std::printf("WAN_LATENCY_MS_%d_%d=%g\n", a, b, cl.latency(a, b));
        std::printf("WAN_BANDWIDTH_GBPS_%d_%d=%g\n", a, b, cl.bandwidth(a, b));
      }
    std::printf("WAN_FLOW_WINDOW_BYTES=%llu\n",
                static_cast<unsigned long long>(cfg.wan.flow_window_bytes));
    std::printf("WAN_EMULATE=%s\n", cfg.wan.emulate == atlas::WanEmulation::Netns ? "netns" : "none");
    std::printf("WAN_RAILS=%d\n", cfg.wan.transport == atlas::WanTransport::Multirail ? cfg.wan.rails : 1);
    std::printf("WAN_DEVICE_BACKEND=%s\n", atlas::to_string(cfg.device.backend));
    if (np > 0) {
      // Ranks are ordered (dc, stage, dp, tp): DC d holds ParallelCfg::ranks_in_dc(d) of them.
      std::vector<long> per_dc(static_cast<std::size_t>(n), 0);
      const auto& p = cfg.parallel;
      if (p.stages_per_dc.size() == static_cast<std::size_t>(n) && p.world_size() == np) {
        for (int d = 0; d < n; ++d)
          per_dc[static_cast<std::size_t>(d)] = static_cast<long>(p.ranks_in_dc(d));
      } else {
        std::fprintf(stderr, "atlas-wan-deck: %s: the layout (parallel.*) holds %d ranks, not %ld "
                             "(np); set parallel.stages_per_dc/dp_size/tp_size to match\n",
                     path.c_str(), p.world_size(), np);
        return 2;
      }
      std::string s;
      for (long v : per_dc) s += (s.empty() ? "" : " ") + std::to_string(v);
      std::printf("WAN_RANKS_PER_DC=%s\n", quote(s).c_str());
    }
    return 0;
  } catch (const atlas::ConfigError& e) {
    std::fprintf(stderr, "atlas-wan-deck: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas-wan-deck: %s\n", e.what());
    return 2;
  }
}
