// SPDX-License-Identifier: MIT
// profile.h5 reader (see profile_reader.hpp): the columns the in-situ compute costs need.
#include "atlas/runtime/profile_reader.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "atlas/core/check.hpp"
#include "atlas/io/hdf5.hpp"
#include "atlas/runtime/profile_writer.hpp"
#include "atlas/sched/slot.hpp"

namespace atlas::runtime {

namespace {

/// The longest event a profile may hold (a week): longer is a damaged time stamp, whose cost
/// would reach the simulator as infinity.
constexpr double kMaxEventSeconds = 7 * 24 * 3600.0;

const char* const kDamagedHint = "\n  hint: the file is damaged or not written by atlas; profile it again (atlas train "
                                 "with profile.enabled = true, or atlas simulate --profile FILE)";

/// The length of 1-D dataset `d` (`group`/`name` of file `path`), checked.
hsize_t rows_of(hid_t d, const std::string& path, const std::string& group, const char* name) {
  const std::vector<hsize_t> dims = h5::dataset_dims(d);
  if (dims.size() != 1)
    ATLAS_THROW(Io, "'" << path << "': " << group << "/" << name << " is not 1-D (" << dims.size() << " dimensions)"
                        << kDamagedHint);
  // The rows must be in the file: a damaged header can claim 2^40 of them in a small file, and the
  // reader would allocate for them before reading. The writer stores every column whole and
  // unfiltered; a copy compressed since (h5repack -f GZIP) may hold up to ~1032x fewer bytes than
  // its rows (deflate's best ratio), so a filtered column gets that much room.
  h5::Type type(ATLAS_H5_CHECK(H5Dget_type(d)));
  const hsize_t stored = H5Dget_storage_size(d);
  const std::size_t row_bytes = H5Tget_size(type.get());
  const h5::PropList dcpl(ATLAS_H5_CHECK(H5Dget_create_plist(d)));
  const int filters = H5Pget_nfilters(dcpl.get());
  const hsize_t room = filters > 0 ? stored * 1100 : stored;
  if (row_bytes == 0 || dims[0] > room / row_bytes)
    ATLAS_THROW(Io, "'" << path << "': " << group << "/" << name << " claims " << dims[0] << " rows of " << row_bytes
                        << " bytes, but the file holds " << stored << " bytes for it" << kDamagedHint);
  return dims[0];
}

/// A 1-D column `name` under `loc`, converted to T by HDF5.
template <class T>
std::vector<T> read_column(hid_t loc, const std::string& path, const std::string& group, const char* name) {
  if (!h5::exists(loc, name)) ATLAS_THROW(Io, "'" << path << "': no dataset " << group << "/" << name << kDamagedHint);
  h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(loc, name, H5P_DEFAULT)));
  std::vector<T> v(static_cast<std::size_t>(rows_of(d.get(), path, group, name)));
  if (!v.empty())
    ATLAS_H5_CHECK(H5Dread(d.get(), h5::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  return v;
}

/// A 1-D array of variable-length strings (the writer's) or fixed-length ones.
std::vector<std::string> read_strings(hid_t loc, const std::string& path, const char* name) {
  if (!h5::exists(loc, name)) ATLAS_THROW(Io, "'" << path << "': no dataset /ranks/" << name << kDamagedHint);
  h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(loc, name, H5P_DEFAULT)));
  const auto n = static_cast<std::size_t>(rows_of(d.get(), path, "/ranks", name));
  h5::Type file_type(ATLAS_H5_CHECK(H5Dget_type(d.get())));
  std::vector<std::string> out;
  if (n == 0) return out;
  if (H5Tis_variable_str(file_type.get()) > 0) {
    h5::Type mem(ATLAS_H5_CHECK(H5Tcopy(H5T_C_S1)));
    ATLAS_H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    ATLAS_H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(file_type.get())));  // no conversion between sets
    std::vector<char*> ptrs(n, nullptr);
    ATLAS_H5_CHECK(H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()));
    for (char* p : ptrs) {
      out.emplace_back(p ? p : "");
      std::free(p);  // HDF5 allocates each string with malloc (the default vlen allocator)
    }
    return out;
  }
  const std::size_t len = H5Tget_size(file_type.get());
  if (len == 0 || len > 4096)
    ATLAS_THROW(Io, "'" << path << "': /ranks/" << name << " holds strings of " << len << " bytes (at most 4096)"
                        << kDamagedHint);
  std::vector<char> buf(n * len);
  ATLAS_H5_CHECK(H5Dread(d.get(), file_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
  for (std::size_t i = 0; i < n; ++i) {
    const char* s = buf.data() + i * len;
    std::size_t k = 0;
    while (k < len && s[k] != '\0') ++k;
    out.emplace_back(s, k);
  }
  return out;
}

}  // namespace

ProfileSlots read_profile_slots(const std::string& path_in) {
  namespace fs = std::filesystem;
  std::string path = path_in;
  if (fs::is_directory(path)) path = (fs::path(path) / "profile.h5").string();
  if (!fs::exists(path))
    ATLAS_THROW(Io, "cannot read profile '" << path << "': no such file\n  hint: a run writes runs/NAME/profile.h5 "
                                            "when profile.enabled = true (the default)");
  h5::FileContext ctx(path);
  h5::File f;
  try {
    f = h5::open_file(path, h5::Access::ReadOnly);
  } catch (const Error& e) {
    ATLAS_THROW(Io, "cannot read profile '" << path << "': " << e.what()
                                            << "\n  hint: give a run directory or its profile.h5 (atlas train writes "
                                               "runs/NAME/profile.h5; atlas simulate --profile FILE a simulated one)");
  }
  ProfileSlots p;
  const std::string format = h5::has_attr(f.get(), "format") ? h5::read_attr_string(f.get(), "format") : "";
  if (format != kProfileFormatName)
    ATLAS_THROW(Io, "'" << path << "' is not an atlas profile (root attribute format = '" << format << "', expected '"
                        << kProfileFormatName << "')");
  const std::int64_t version = h5::has_attr(f.get(), "version") ? h5::read_attr_int(f.get(), "version") : -1;
  if (version != kProfileFormatVersion)
    ATLAS_THROW(Io, "'" << path << "' is an atlas profile of version " << version << "; this atlas reads version "
                        << kProfileFormatVersion
                        << "\n  hint: profile it again with this atlas (atlas train with profile.enabled = true, or "
                           "atlas simulate --profile FILE)");
  p.source = h5::has_attr(f.get(), "source") ? h5::read_attr_string(f.get(), "source") : "measured";
  p.run_name = h5::has_attr(f.get(), "run_name") ? h5::read_attr_string(f.get(), "run_name") : "";
  if (!h5::exists(f.get(), "events") || !h5::exists(f.get(), "ranks"))
    ATLAS_THROW(Io, "'" << path << "' has no /events or /ranks group (not an atlas profile, or truncated)");
  h5::Group ev = h5::open_group(f.get(), "events");
  const auto rank = read_column<std::int32_t>(ev.get(), path, "/events", "world_rank");
  const auto step = read_column<std::int32_t>(ev.get(), path, "/events", "step");
  const auto kind = read_column<std::int32_t>(ev.get(), path, "/events", "kind");
  const auto micro = read_column<std::int32_t>(ev.get(), path, "/events", "micro");
  const auto start = read_column<double>(ev.get(), path, "/events", "start_s");
  const auto end = read_column<double>(ev.get(), path, "/events", "end_s");
  const std::size_t n = rank.size();
  for (const std::size_t len : {step.size(), kind.size(), micro.size(), start.size(), end.size()})
    if (len != n)
      ATLAS_THROW(Io, "'" << path << "': the /events columns have different lengths (" << n << " and " << len
                          << "): a truncated or damaged profile");
  h5::Group ranks = h5::open_group(f.get(), "ranks");
  const auto stage = read_column<std::int32_t>(ranks.get(), path, "/ranks", "stage");
  p.rank_stage.assign(stage.begin(), stage.end());
  p.rank_host = read_strings(ranks.get(), path, "host");
  if (p.rank_host.size() != p.rank_stage.size())
    ATLAS_THROW(Io, "'" << path << "': /ranks/host has " << p.rank_host.size() << " rows, /ranks/stage "
                        << p.rank_stage.size());
  p.events.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (rank[i] < 0 || static_cast<std::size_t>(rank[i]) >= p.rank_stage.size() || kind[i] < 0 ||
        kind[i] >= static_cast<int>(sched::kSlotKindCount) || !std::isfinite(start[i]) || !std::isfinite(end[i]) ||
        !(end[i] >= start[i]) || end[i] - start[i] > kMaxEventSeconds)
      ATLAS_THROW(Io, "'" << path << "': /events row " << i << " is out of range (rank " << rank[i] << ", kind "
                          << kind[i] << ", " << start[i] << " .. " << end[i] << " s)");
    SlotEvent& e = p.events[i];
    e.world_rank = rank[i];
    e.step = step[i];
    e.kind = kind[i];
    e.micro = micro[i];
    e.start_s = start[i];
    e.end_s = end[i];
    e.complete_s = end[i];
  }
  return p;
}

}  // namespace atlas::runtime
