// SPDX-License-Identifier: MIT
// profile.h5 writer: plain 1-D columns (h5py reads each as a NumPy array), string arrays as
// variable-length strings.
#include "atlas/runtime/profile_writer.hpp"

#include <exception>
#include <filesystem>
#include <limits>

#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/io/hdf5.hpp"

namespace atlas::runtime {

namespace {

template <class T>
void column(hid_t loc, const char* name, const std::vector<T>& v) {
  const hsize_t n = v.size();
  h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
  h5::Dataset ds(
      ATLAS_H5_CHECK(H5Dcreate2(loc, name, h5::native_type<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (n > 0) ATLAS_H5_CHECK(H5Dwrite(ds.get(), h5::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
}

/// One column of `rows`: the member `field` of each row, stored with the member's own type.
template <class Row, class T>
void column_of(hid_t loc, const char* name, const std::vector<Row>& rows, T Row::*field) {
  std::vector<T> v;
  v.reserve(rows.size());
  for (const auto& r : rows) v.push_back(r.*field);
  column(loc, name, v);
}

h5::Type vlen_string() {
  h5::Type t(ATLAS_H5_CHECK(H5Tcopy(H5T_C_S1)));
  ATLAS_H5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE));
  ATLAS_H5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8));
  return t;
}

void string_array_attr(hid_t obj, const char* name, const std::vector<std::string>& values) {
  std::vector<const char*> ptrs;
  for (const auto& s : values) ptrs.push_back(s.c_str());
  const hsize_t n = ptrs.size();
  h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
  h5::Type t = vlen_string();
  h5::Attr a(ATLAS_H5_CHECK(H5Acreate2(obj, name, t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  ATLAS_H5_CHECK(H5Awrite(a.get(), t.get(), ptrs.data()));
}

void string_array_dataset(hid_t loc, const char* name, const std::vector<std::string>& values) {
  std::vector<const char*> ptrs;
  for (const auto& s : values) ptrs.push_back(s.c_str());
  const hsize_t n = ptrs.size();
  h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
  h5::Type t = vlen_string();
  h5::Dataset ds(ATLAS_H5_CHECK(H5Dcreate2(loc, name, t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (n > 0) ATLAS_H5_CHECK(H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()));
}

void double_attr(hid_t obj, const char* name, double v) {
  h5::Space space(ATLAS_H5_CHECK(H5Screate(H5S_SCALAR)));
  h5::Attr a(ATLAS_H5_CHECK(H5Acreate2(obj, name, H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_DOUBLE, &v));
}

}  // namespace

std::vector<SlotEvent> table_events(const sched::ScheduleTable& table, const topo::Layout& layout, int steps) {
  ATLAS_ASSERT(steps >= 1, "table_events needs at least one step");
  ATLAS_ASSERT(layout.pp_size() == table.pp && layout.dp_size() == table.dp && layout.tp_size() == table.tp,
               "table " << table.pp << "x" << table.dp << "x" << table.tp << " vs layout " << layout.pp_size() << "x"
                        << layout.dp_size() << "x" << layout.tp_size());
  std::size_t per_step = 0;
  for (const auto& row : table.rows) per_step += row.size();
  std::vector<SlotEvent> events;
  events.reserve(per_step * static_cast<std::size_t>(table.tp) * static_cast<std::size_t>(steps));
  // Rank order, then step, then the row's order: what Profiler::gather gives for a run.
  for (int r = 0; r < layout.world_size(); ++r) {
    const topo::Coord c = layout.coord(r);
    const auto& row = table.row(c.stage, c.dp);
    for (int k = 0; k < steps; ++k) {
      const double t0_ms = k * table.step_ms;
      for (std::size_t i = 0; i < row.size(); ++i) {
        const sched::Slot& slot = row[i];
        SlotEvent e;
        e.world_rank = r;
        e.step = k;
        e.slot_index = static_cast<std::int32_t>(i);
        e.kind = static_cast<std::int32_t>(slot.kind);
        e.micro = slot.micro;
        e.peer = slot.peer_stage >= 0 ? layout.world_rank(slot.peer_stage, c.dp, c.tp) : -1;
        e.link = slot.link;
        e.request = slot.request;
        e.bytes = sched::is_send(slot.kind) || sched::is_recv(slot.kind) ? slot.bytes : 0;
        e.start_s = (t0_ms + slot.start_ms) / 1e3;
        e.end_s = (t0_ms + slot.end_ms()) / 1e3;
        e.complete_s = e.end_s;
        if (slot.kind == sched::SlotKind::WanSend && slot.link >= 0 && slot.link_pos >= 0) {
          // As the runtime records it: posted when the link order lets the transfer start,
          // complete when its last byte is on the link.
          const auto& t = table.links[static_cast<std::size_t>(slot.link)].order[static_cast<std::size_t>(slot.link_pos)];
          e.start_s = e.end_s = (t0_ms + t.start_ms) / 1e3;
          e.complete_s = (t0_ms + t.end_ms) / 1e3;
        }
        e.predicted_start_ms = slot.start_ms;
        e.predicted_ms = slot.duration_ms;
        events.push_back(e);
      }
    }
  }
  return events;
}

std::vector<StepRow> table_steps(const sched::ScheduleTable& table, const topo::Layout& layout, int steps,
                                 double tokens_per_step) {
  const topo::Coord c0 = layout.coord(0);
  std::int64_t prefill = 0;
  for (int s = 0; s < table.pp; ++s)
    for (int d = 0; d < table.dp; ++d)
      for (const auto& slot : table.row(s, d))
        if (slot.kind == sched::SlotKind::Prefill) prefill += slot.tokens;
  std::vector<StepRow> rows(static_cast<std::size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    StepRow& r = rows[static_cast<std::size_t>(k)];
    r.step = k;
    r.loss = std::numeric_limits<double>::quiet_NaN();
    r.step_time_s = table.step_ms / 1e3;
    r.tokens_per_s = table.step_ms > 0 ? tokens_per_step / (table.step_ms / 1e3) : 0.0;
    r.bubble_fraction = table.bubble_fraction(c0.stage, c0.dp);
    r.prefill_tokens = prefill;
  }
  return rows;
}

TraceLabels trace_labels(const topo::Layout& layout, const sched::ScheduleTable& table,
                         const std::vector<std::string>& dc_names) {
  TraceLabels labels;
  labels.dc_names = dc_names;
  for (int r = 0; r < layout.world_size(); ++r) {
    labels.rank_names.push_back("rank " + std::to_string(r) + ": " + layout.describe(r, dc_names));
    labels.rank_dc.push_back(layout.coord(r).dc);
  }
  for (const auto& l : table.links) {
    labels.link_names.push_back("WAN " + dc_names[static_cast<std::size_t>(l.src_dc)] + ">" +
                                dc_names[static_cast<std::size_t>(l.dst_dc)]);
    labels.link_src_dc.push_back(l.src_dc);
    labels.link_dst_dc.push_back(l.dst_dc);
  }
  return labels;
}

void write_profile(const std::string& path, const ProfileMeta& meta, const std::vector<SlotEvent>& all,
                   const std::vector<StepRow>& steps) {
  ATLAS_ASSERT(meta.table && meta.layout, "profile without a table or layout");
  // The table's slots (and BubbleTea's chunks) to /events; the tied-embedding exchanges, which no
  // slot of the table holds, to /exchanges.
  std::vector<SlotEvent> events, exchanges;
  for (const SlotEvent& e : all) (is_exchange_event(e) ? exchanges : events).push_back(e);
  const std::string tmp = path + ".tmp";
  // A failed write removes its .tmp (the earlier profile.h5, if any, stays as it was).
  struct RemoveOnError {
    const std::string& file;
    ~RemoveOnError() {
      if (std::uncaught_exceptions() > 0) {
        std::error_code ignored;
        std::filesystem::remove(file, ignored);
      }
    }
  } cleanup{tmp};
  {
    h5::FileContext ctx(tmp);
    h5::File f = h5::create_file(tmp);
    const hid_t root = f.get();
    h5::write_attr(root, "format", std::string(kProfileFormatName));
    h5::write_attr(root, "version", kProfileFormatVersion);
    h5::write_attr(root, "run_name", meta.run_name);
    h5::write_attr(root, "schedule_kind", std::string(to_string(meta.table->kind)));
    h5::write_attr(root, "world_size", static_cast<std::int64_t>(meta.layout->world_size()));
    double_attr(root, "predicted_step_ms", meta.table->step_ms);
    string_array_attr(root, "dc_names", meta.dc_names);
    std::vector<std::string> kinds(sched::kSlotKindNames, sched::kSlotKindNames + sched::kSlotKindCount);
    string_array_attr(root, "slot_kind_names", kinds);
    h5::write_attr(root, "deck", meta.deck);
    h5::write_attr(root, "source", meta.source);

    {
      h5::Group g = h5::create_group(root, "events");
      const hid_t ev = g.get();
      column_of(ev, "world_rank", events, &SlotEvent::world_rank);
      column_of(ev, "step", events, &SlotEvent::step);
      column_of(ev, "slot_index", events, &SlotEvent::slot_index);
      column_of(ev, "kind", events, &SlotEvent::kind);
      column_of(ev, "micro", events, &SlotEvent::micro);
      column_of(ev, "peer", events, &SlotEvent::peer);
      column_of(ev, "link", events, &SlotEvent::link);
      column_of(ev, "request", events, &SlotEvent::request);
      column_of(ev, "bytes", events, &SlotEvent::bytes);
      column_of(ev, "start_s", events, &SlotEvent::start_s);
      column_of(ev, "end_s", events, &SlotEvent::end_s);
      column_of(ev, "complete_s", events, &SlotEvent::complete_s);
      column_of(ev, "predicted_start_ms", events, &SlotEvent::predicted_start_ms);
      column_of(ev, "predicted_ms", events, &SlotEvent::predicted_ms);
      column_of(ev, "wan_wait_s", events, &SlotEvent::wan_wait_s);  // added within v1 (optional)
      column_of(ev, "intra_wait_s", events, &SlotEvent::intra_wait_s);
    }
    {
      h5::Group g = h5::create_group(root, "ranks");
      std::vector<topo::Coord> coords;
      for (int r = 0; r < meta.layout->world_size(); ++r) coords.push_back(meta.layout->coord(r));
      column_of(g.get(), "dc", coords, &topo::Coord::dc);
      column_of(g.get(), "stage", coords, &topo::Coord::stage);
      column_of(g.get(), "dp", coords, &topo::Coord::dp);
      column_of(g.get(), "tp", coords, &topo::Coord::tp);
      string_array_dataset(g.get(), "host", meta.hosts);
    }
    {
      h5::Group g = h5::create_group(root, "links");
      column_of(g.get(), "src_dc", meta.table->links, &sched::WanLink::src_dc);
      column_of(g.get(), "dst_dc", meta.table->links, &sched::WanLink::dst_dc);
    }
    {
      h5::Group g = h5::create_group(root, "steps");
      column_of(g.get(), "step", steps, &StepRow::step);
      column_of(g.get(), "loss", steps, &StepRow::loss);
      column_of(g.get(), "step_time_s", steps, &StepRow::step_time_s);
      column_of(g.get(), "tokens_per_s", steps, &StepRow::tokens_per_s);
      column_of(g.get(), "bubble_fraction", steps, &StepRow::bubble_fraction);
      column_of(g.get(), "prefill_tokens", steps, &StepRow::prefill_tokens);
    }
    {
      // Added within v1 (optional: older profiles and simulations have none).
      h5::Group g = h5::create_group(root, "exchanges");
      std::vector<std::int32_t> src_dc, dst_dc;
      for (const SlotEvent& e : exchanges) {
        src_dc.push_back(meta.layout->coord(e.world_rank).dc);
        dst_dc.push_back(meta.layout->coord(e.peer).dc);
      }
      column_of(g.get(), "world_rank", exchanges, &SlotEvent::world_rank);
      column_of(g.get(), "step", exchanges, &SlotEvent::step);
      column_of(g.get(), "peer", exchanges, &SlotEvent::peer);
      column(g.get(), "src_dc", src_dc);
      column(g.get(), "dst_dc", dst_dc);
      column_of(g.get(), "bytes", exchanges, &SlotEvent::bytes);
      column_of(g.get(), "start_s", exchanges, &SlotEvent::start_s);
      column_of(g.get(), "complete_s", exchanges, &SlotEvent::complete_s);
    }
    h5::write_string_dataset(root, "schedule_json", sched::to_json(*meta.table, meta.dc_names), true);
    f.close();
  }
  fsync_path(tmp, false);  // the data on disk before the name says it is whole
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) ATLAS_THROW(Io, "cannot rename " << tmp << " to " << path << ": " << ec.message());
}

}  // namespace atlas::runtime
