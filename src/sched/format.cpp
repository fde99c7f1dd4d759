// SPDX-License-Identifier: MIT
// The schedule table's text and JSON forms: the Gantt chart, the per-row summary, to_json.
#include "atlas/sched/schedule.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace atlas::sched {

// ---- output ----

namespace {

std::string dc_name(const std::vector<std::string>& names, int dc) {
  return static_cast<std::size_t>(dc) < names.size() ? names[static_cast<std::size_t>(dc)] : "dc" + std::to_string(dc);
}

char slot_char(const Slot& s) {
  switch (s.kind) {
    case SlotKind::Forward: return static_cast<char>('a' + s.micro % 26);
    case SlotKind::Backward: return static_cast<char>('A' + s.micro % 26);
    case SlotKind::BackwardInput: return static_cast<char>('A' + s.micro % 26);  // B: as a backward
    case SlotKind::BackwardWeight: return '#';  // W: weight gradients (split backward)
    case SlotKind::AllReduce: return '=';
    case SlotKind::Optimizer: return '+';
    case SlotKind::Prefill: return '~';
    default: return '.';
  }
}

const char* link_mode_name(LinkMode m) {
  switch (m) {
    case LinkMode::Shared: return "shared";
    case LinkMode::Ordered: return "ordered";
    case LinkMode::OrderedFifo: return "ordered-fifo";
  }
  return "?";
}

const char* tie_name(TieBreak t) {
  switch (t) {
    case TieBreak::PipelineOrder: return "pipeline-order";
    case TieBreak::GradientsFirst: return "gradients-first";
    case TieBreak::ActivationsFirst: return "activations-first";
  }
  return "?";
}

}  // namespace

std::string gantt(const ScheduleTable& t, const std::vector<std::string>& dc_names, int width) {
  const double per_col = t.step_ms > 0 ? t.step_ms / width : 1.0;
  std::string out;
  out += fmt::format("# {} schedule, {} stages x dp {} (tp {}), {} micro-batches; step {:.3f} ms; "
                     "one column = {:.3f} ms\n",
                     to_string(t.kind), t.pp, t.dp, t.tp, t.micro_batches, t.step_ms, per_col);
  if (t.virtual_stages > 1)
    out += fmt::format("# interleaved: {} model chunks per stage (chunk c of stage s = virtual stage c x {} + s); "
                       "a letter is one chunk's pass\n",
                       t.virtual_stages, t.pp);
  out += "# legend: a-z forward of micro-batch 0-25, A-Z backward, = DP all-reduce, + optimizer, "
         "~ prefill, . idle; WAN rows: digit = pipeline (dp) using the link, * = several at once\n";
  std::size_t label_w = 0;
  std::vector<std::string> labels;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d)
      labels.push_back(fmt::format("{} s{} d{}", dc_name(dc_names, t.stage_dc[static_cast<std::size_t>(s)]), s, d));
  for (const auto& l : t.links)
    labels.push_back(fmt::format("WAN {}>{}", dc_name(dc_names, l.src_dc), dc_name(dc_names, l.dst_dc)));
  for (const auto& l : labels) label_w = std::max(label_w, l.size());

  std::size_t li = 0;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      std::string line(static_cast<std::size_t>(width), '.');
      std::vector<double> cover(static_cast<std::size_t>(width), 0.0);
      for (const auto& slot : t.row(s, d)) {
        if (slot.kind == SlotKind::Idle || slot.duration_ms <= 0) continue;
        const int c0 = std::max(0, static_cast<int>(slot.start_ms / per_col));
        const int c1 = std::min(width - 1, static_cast<int>((slot.end_ms() - 1e-12) / per_col));
        for (int col = c0; col <= c1; ++col) {
          const double lo = std::max(slot.start_ms, col * per_col);
          const double hi = std::min(slot.end_ms(), (col + 1) * per_col);
          if (hi - lo > cover[static_cast<std::size_t>(col)]) {
            cover[static_cast<std::size_t>(col)] = hi - lo;
            line[static_cast<std::size_t>(col)] = slot_char(slot);
          }
        }
      }
      out += fmt::format("{:<{}} |{}| bubble {:5.1f}%\n", labels[li++], label_w, line,
                         100.0 * t.bubble_fraction(s, d));
    }
  for (const auto& l : t.links) {
    std::string line(static_cast<std::size_t>(width), ' ');
    for (int col = 0; col < width; ++col) {
      const double lo = col * per_col;
      const double hi = lo + per_col;
      // Transfers active in this column; '*' only if two of them overlap in time.
      std::vector<const LinkTransfer*> here;
      for (const auto& x : l.order)
        if (x.start_ms < hi && x.end_ms > lo && x.end_ms > x.start_ms) here.push_back(&x);
      if (here.empty()) continue;
      bool concurrent = false;
      for (std::size_t i = 0; i < here.size() && !concurrent; ++i)
        for (std::size_t j = i + 1; j < here.size(); ++j)
          if (std::max(here[i]->start_ms, here[j]->start_ms) <
              std::min(here[i]->end_ms, here[j]->end_ms) - 1e-9) {
            concurrent = true;
            break;
          }
      const LinkTransfer* most = here.front();
      double most_cover = 0.0;
      for (const auto* x : here) {
        const double cover = std::min(x->end_ms, hi) - std::max(x->start_ms, lo);
        if (cover > most_cover) {
          most_cover = cover;
          most = x;
        }
      }
      line[static_cast<std::size_t>(col)] = concurrent ? '*' : static_cast<char>('0' + most->dp % 10);
    }
    out += fmt::format("{:<{}} |{}| {} {} transfers\n", labels[li++], label_w, line,
                       link_mode_name(l.mode), l.order.size());
  }
  if (t.kind == ScheduleKind::Atlas)
    out += fmt::format("# atlas choice: stagger {:.3f} ms, tie-break {}, {} transfer(s) at a time "
                       "per link; {} candidates; 1f1b with concurrent sharing: {:.3f} ms\n",
                       t.atlas.stagger_ms, tie_name(t.atlas.tie_break), t.atlas.slots,
                       t.atlas.candidates_tried, t.atlas.baseline_1f1b_ms) +
           fmt::format("# atlas in-flight depth per stage ({} held): {}\n",
                       t.virtual_stages > 1 ? "chunk passes" : "micro-batches", fmt::join(t.atlas.depth, ","));
  if (t.kind == ScheduleKind::Atlas && t.atlas.split)
    out += fmt::format("# atlas split backward: most micro-batches held per stage {}\n", fmt::join(t.atlas.hold, ","));
  if (is_split(t))
    out += "# split backward: an upper-case letter is a backward's activation-gradient half (B), '#' its "
           "weight-gradient half (W)\n";
  return out;
}

std::string summary(const ScheduleTable& t, const std::vector<std::string>& dc_names) {
  std::string out = fmt::format("# {:<10} {:>5} {:>3} {:>10} {:>10} {:>8}\n", "dc", "stage", "dp",
                                "busy_ms", "idle_ms", "bubble%");
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      const double busy = t.busy_ms(s, d);
      out += fmt::format("  {:<10} {:>5} {:>3} {:>10.3f} {:>10.3f} {:>7.1f}%\n",
                         dc_name(dc_names, t.stage_dc[static_cast<std::size_t>(s)]), s, d, busy,
                         t.step_ms - busy, 100.0 * t.bubble_fraction(s, d));
    }
  out += fmt::format("# step {:.3f} ms, mean bubble {:.1f}%{}\n", t.step_ms, 100.0 * t.mean_bubble_fraction(),
                     is_split(t) ? ", backward split (B + W)" : "");
  return out;
}

std::string to_json(const ScheduleTable& t, const std::vector<std::string>& dc_names) {
  std::string out;
  out += fmt::format("{{\"kind\":\"{}\",\"pp\":{},\"dp\":{},\"tp\":{},\"micro_batches\":{},"
                     "\"step_ms\":{:.6f},\"mean_bubble_fraction\":{:.6f},\"structure_hash\":\"{:016x}\",",
                     to_string(t.kind), t.pp, t.dp, t.tp, t.micro_batches, t.step_ms,
                     t.mean_bubble_fraction(), t.structure_hash());
  if (t.virtual_stages > 1) out += fmt::format("\"virtual_stages\":{},", t.virtual_stages);
  if (is_split(t)) out += "\"split_backward\":true,";  // rows hold backward_input / backward_weight
  out += "\"dcs\":[";
  for (std::size_t i = 0; i < dc_names.size(); ++i) out += fmt::format("{}\"{}\"", i ? "," : "", dc_names[i]);
  out += "],\"rows\":[";
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      if (s || d) out += ",";
      out += fmt::format("{{\"stage\":{},\"dp\":{},\"dc\":{},\"bubble_fraction\":{:.6f},\"slots\":[", s, d,
                         t.stage_dc[static_cast<std::size_t>(s)], t.bubble_fraction(s, d));
      bool first = true;
      for (const auto& sl : t.row(s, d)) {
        out += fmt::format("{}{{\"kind\":\"{}\",\"micro\":{},\"start_ms\":{:.6f},\"duration_ms\":{:.6f}",
                           first ? "" : ",", to_string(sl.kind), sl.micro, sl.start_ms, sl.duration_ms);
        if (sl.peer_stage >= 0)
          out += fmt::format(",\"peer_stage\":{},\"flow\":\"{}\",\"bytes\":{},\"link\":{},\"link_pos\":{}",
                             sl.peer_stage, sl.flow == Flow::Activation ? "activation" : "gradient",
                             sl.bytes, sl.link, sl.link_pos);
        if (sl.request >= 0) out += fmt::format(",\"request\":{},\"tokens\":{}", sl.request, sl.tokens);
        if (t.virtual_stages > 1 && (is_compute(sl.kind) || sl.peer_stage >= 0))
          out += fmt::format(",\"chunk\":{}", sl.chunk);
        out += "}";
        first = false;
      }
      out += "]}";
    }
  out += "],\"links\":[";
  for (std::size_t i = 0; i < t.links.size(); ++i) {
    const auto& l = t.links[i];
    out += fmt::format("{}{{\"src_dc\":{},\"dst_dc\":{},\"mode\":\"{}\",\"slots\":{},\"transfers\":[", i ? "," : "",
                       l.src_dc, l.dst_dc, link_mode_name(l.mode), l.slots);
    for (std::size_t k = 0; k < l.order.size(); ++k) {
      const auto& x = l.order[k];
      out += fmt::format("{}{{\"src_stage\":{},\"dst_stage\":{},\"dp\":{},\"micro\":{},\"flow\":\"{}\","
                         "\"bytes\":{},\"post_ms\":{:.6f},\"start_ms\":{:.6f},\"end_ms\":{:.6f},\"arrive_ms\":{:.6f}}}",
                         k ? "," : "", x.src_stage, x.dst_stage, x.dp, x.micro,
                         x.flow == Flow::Activation ? "activation" : "gradient", x.bytes, x.post_ms,
                         x.start_ms, x.end_ms, x.arrive_ms);
      if (t.virtual_stages > 1) {  // the sender's chunk, inside the transfer's object
        out.pop_back();
        out += fmt::format(",\"chunk\":{}}}", x.chunk);
      }
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

}  // namespace atlas::sched
