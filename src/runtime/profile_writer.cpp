// SPDX-License-Identifier: MIT
// profile.h5 writer: plain 1-D columns (h5py reads each as a NumPy array), string arrays as
// variable-length strings.
#include "atlas/runtime/profile_writer.hpp"

#include <filesystem>

#include "atlas/core/check.hpp"
#include "atlas/io/hdf5.hpp"

namespace atlas::runtime {

namespace {

template <class T>
hid_t native() {
  if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  else return H5T_NATIVE_DOUBLE;
}

template <class T>
void column(hid_t loc, const char* name, const std::vector<T>& v) {
  const hsize_t n = v.size();
  h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
  h5::Dataset ds(ATLAS_H5_CHECK(H5Dcreate2(loc, name, native<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (n > 0) ATLAS_H5_CHECK(H5Dwrite(ds.get(), native<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
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

void write_profile(const std::string& path, const ProfileMeta& meta, const std::vector<SlotEvent>& events,
                   const std::vector<StepRow>& steps) {
  ATLAS_ASSERT(meta.table && meta.layout, "profile without a table or layout");
  const std::string tmp = path + ".tmp";
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

    {
      h5::Group g = h5::create_group(root, "events");
      auto col32 = [&](const char* name, auto get) {
        std::vector<std::int32_t> v;
        v.reserve(events.size());
        for (const auto& e : events) v.push_back(get(e));
        column(g.get(), name, v);
      };
      auto colf = [&](const char* name, auto get) {
        std::vector<double> v;
        v.reserve(events.size());
        for (const auto& e : events) v.push_back(get(e));
        column(g.get(), name, v);
      };
      col32("world_rank", [](const SlotEvent& e) { return e.world_rank; });
      col32("step", [](const SlotEvent& e) { return e.step; });
      col32("slot_index", [](const SlotEvent& e) { return e.slot_index; });
      col32("kind", [](const SlotEvent& e) { return e.kind; });
      col32("micro", [](const SlotEvent& e) { return e.micro; });
      col32("peer", [](const SlotEvent& e) { return e.peer; });
      col32("link", [](const SlotEvent& e) { return e.link; });
      col32("request", [](const SlotEvent& e) { return e.request; });
      std::vector<std::int64_t> bytes;
      for (const auto& e : events) bytes.push_back(e.bytes);
      column(g.get(), "bytes", bytes);
      colf("start_s", [](const SlotEvent& e) { return e.start_s; });
      colf("end_s", [](const SlotEvent& e) { return e.end_s; });
      colf("complete_s", [](const SlotEvent& e) { return e.complete_s; });
      colf("predicted_start_ms", [](const SlotEvent& e) { return e.predicted_start_ms; });
      colf("predicted_ms", [](const SlotEvent& e) { return e.predicted_ms; });
    }
    {
      h5::Group g = h5::create_group(root, "ranks");
      std::vector<std::int32_t> dc, stage, dp, tp;
      for (int r = 0; r < meta.layout->world_size(); ++r) {
        const topo::Coord c = meta.layout->coord(r);
        dc.push_back(c.dc);
        stage.push_back(c.stage);
        dp.push_back(c.dp);
        tp.push_back(c.tp);
      }
      column(g.get(), "dc", dc);
      column(g.get(), "stage", stage);
      column(g.get(), "dp", dp);
      column(g.get(), "tp", tp);
      string_array_dataset(g.get(), "host", meta.hosts);
    }
    {
      h5::Group g = h5::create_group(root, "links");
      std::vector<std::int32_t> src, dst;
      for (const auto& l : meta.table->links) {
        src.push_back(l.src_dc);
        dst.push_back(l.dst_dc);
      }
      column(g.get(), "src_dc", src);
      column(g.get(), "dst_dc", dst);
    }
    {
      h5::Group g = h5::create_group(root, "steps");
      std::vector<std::int32_t> step;
      std::vector<double> loss, t, tok, bub;
      std::vector<std::int64_t> pre;
      for (const auto& s : steps) {
        step.push_back(s.step);
        loss.push_back(s.loss);
        t.push_back(s.step_time_s);
        tok.push_back(s.tokens_per_s);
        bub.push_back(s.bubble_fraction);
        pre.push_back(s.prefill_tokens);
      }
      column(g.get(), "step", step);
      column(g.get(), "loss", loss);
      column(g.get(), "step_time_s", t);
      column(g.get(), "tokens_per_s", tok);
      column(g.get(), "bubble_fraction", bub);
      column(g.get(), "prefill_tokens", pre);
    }
    h5::write_string_dataset(root, "schedule_json", sched::to_json(*meta.table, meta.dc_names), true);
    f.close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) ATLAS_THROW(Io, "cannot rename " << tmp << " to " << path << ": " << ec.message());
}

}  // namespace atlas::runtime
