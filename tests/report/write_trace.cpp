// SPDX-License-Identifier: MIT
// Test helper: writes a Chrome trace with atlas::runtime::chrome_trace_json for synthetic but
// realistic events (every slot of the deck's schedule table, for two steps, at its predicted
// time; sends complete when the table's link transfer ends) so check_trace.py can validate the
// real writer's output. Not a test by itself; tests/report/test_check_trace.py drives it.
// usage: write_trace DECK OUT.json [key=value ...] [--dc-name-suffix TEXT]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace {

using atlas::runtime::SlotEvent;

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: write_trace DECK OUT.json [key=value ...] [--dc-name-suffix TEXT]\n");
    return 1;
  }
  const std::string deck = argv[1];
  const std::string out = argv[2];
  std::vector<std::string> overrides;
  std::string suffix;  // appended to DC names: tests JSON escaping of labels
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dc-name-suffix" && i + 1 < argc) {
      suffix = argv[++i];
    } else {
      overrides.push_back(a);
    }
  }
  atlas::deck::JobShape shape;
  atlas::Config cfg =
      atlas::deck::parse_and_validate(deck, atlas::deck::read_text_file(deck), overrides, shape);
  atlas::deck::read_device_profiles(cfg);
  const atlas::topo::Layout layout(cfg.parallel);
  const atlas::sched::ScheduleTable table = atlas::sched::build_schedule(cfg, layout);

  std::vector<SlotEvent> events;
  const double period_s = table.step_ms / 1e3 + 0.01;
  for (int step = 0; step < 2; ++step) {
    const double t0 = step * period_s;
    for (int stage = 0; stage < table.pp; ++stage)
      for (int dp = 0; dp < table.dp; ++dp)
        for (int tp = 0; tp < table.tp; ++tp) {
          const auto& row = table.row(stage, dp);
          for (std::size_t i = 0; i < row.size(); ++i) {
            const auto& sl = row[i];
            SlotEvent e;
            e.world_rank = layout.world_rank(stage, dp, tp);
            e.step = step;
            e.slot_index = static_cast<int>(i);
            e.kind = static_cast<int>(sl.kind);
            e.micro = sl.micro;
            e.peer = sl.peer_stage >= 0 ? layout.world_rank(sl.peer_stage, dp, tp) : -1;
            e.link = sl.link;
            e.request = sl.request;
            e.bytes = sl.bytes;
            e.start_s = t0 + sl.start_ms / 1e3;
            e.end_s = t0 + sl.end_ms() / 1e3;
            e.complete_s = e.end_s;
            if (sl.kind == atlas::sched::SlotKind::WanSend && sl.link >= 0) {
              const auto& x = table.links[static_cast<std::size_t>(sl.link)]
                                  .order[static_cast<std::size_t>(sl.link_pos)];
              e.complete_s = t0 + x.end_ms / 1e3;
            }
            e.predicted_start_ms = sl.start_ms;
            e.predicted_ms = sl.duration_ms;
            events.push_back(e);
          }
        }
  }

  atlas::runtime::TraceLabels labels;
  for (const auto& d : cfg.cluster.dcs) labels.dc_names.push_back(d + suffix);
  for (int r = 0; r < layout.world_size(); ++r) {
    const auto c = layout.coord(r);
    labels.rank_names.push_back("rank " + std::to_string(r) + ": " + labels.dc_names[c.dc] + " s" +
                                std::to_string(c.stage) + " d" + std::to_string(c.dp) + " t" +
                                std::to_string(c.tp));
    labels.rank_dc.push_back(c.dc);
  }
  for (const auto& l : table.links)
    labels.link_names.push_back("WAN " + labels.dc_names[static_cast<std::size_t>(l.src_dc)] + ">" +
                                labels.dc_names[static_cast<std::size_t>(l.dst_dc)]);

  std::ofstream f(out);
  f << atlas::runtime::chrome_trace_json(events, labels);
  if (!f) {
    std::fprintf(stderr, "write_trace: cannot write %s\n", out.c_str());
    return 5;
  }
  std::printf("write_trace: %zu events (%s, %d ranks, %zu links) -> %s\n", events.size(),
              atlas::to_string(cfg.schedule.kind), layout.world_size(), table.links.size(),
              out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const atlas::ConfigError& e) {
    for (const auto& p : e.problems()) std::fprintf(stderr, "ERROR: %s\n", p.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR: %s\n", e.what());
    return 6;
  }
}
