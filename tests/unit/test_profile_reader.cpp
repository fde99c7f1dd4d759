// SPDX-License-Identifier: MIT
// runtime::read_profile_slots: a profile written by write_profile reads back (every slot, the
// ranks' stages and hosts), and each way a file can be unusable is a clear error naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/cost_models.hpp"

#include <filesystem>
#include <limits>
#include <fstream>

#include "atlas/core/error.hpp"
#include "atlas/io/hdf5.hpp"
#include "atlas/runtime/profile_reader.hpp"
#include "atlas/runtime/profile_writer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Written {
  fs::path dir;
  std::vector<SlotEvent> events;
};

// A 2-stage x 2-replica job's table, three steps of its slots, as a run would write them.
Written write_one(const std::string& name) {
  const sched::CostModel c = testing::uniform_cost_model({1, 1}, 2, 1.0, 2.0, 1000, 1e6, 1e6, 5.0);
  sched::ScheduleOptions o;
  o.kind = ScheduleKind::OneFOneB;
  o.micro_batches = 3;
  const sched::ScheduleTable table = sched::build_schedule(c, o);
  const topo::Layout layout(std::vector<int>{1, 1}, 2, 1);
  Written w;
  w.dir = fs::temp_directory_path() / ("atlas_profile_reader_" + name);
  fs::create_directories(w.dir);
  w.events = table_events(table, layout, 3);
  ProfileMeta meta;
  meta.run_name = name;
  meta.dc_names = {"east", "west"};
  meta.hosts = {"a", "a", "b", "b"};
  meta.table = &table;
  meta.layout = &layout;
  write_profile((w.dir / "profile.h5").string(), meta, w.events, table_steps(table, layout, 3, 1.0));
  return w;
}

std::string error_of(const std::string& path) {
  try {
    (void)read_profile_slots(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for " << path;
  return "";
}

TEST(ProfileReader, ReadsBackWhatTheWriterWrote) {
  const Written w = write_one("roundtrip");
  const ProfileSlots p = read_profile_slots(w.dir.string());  // the run directory
  EXPECT_EQ(p.run_name, "roundtrip");
  EXPECT_EQ(p.rank_stage, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.rank_host, (std::vector<std::string>{"a", "a", "b", "b"}));
  ASSERT_EQ(p.events.size(), w.events.size());
  for (std::size_t i = 0; i < w.events.size(); ++i) {
    EXPECT_EQ(p.events[i].world_rank, w.events[i].world_rank);
    EXPECT_EQ(p.events[i].step, w.events[i].step);
    EXPECT_EQ(p.events[i].kind, w.events[i].kind);
    EXPECT_EQ(p.events[i].micro, w.events[i].micro);
    EXPECT_DOUBLE_EQ(p.events[i].start_s, w.events[i].start_s);
    EXPECT_DOUBLE_EQ(p.events[i].end_s, w.events[i].end_s);
  }
  fs::remove_all(w.dir);
}

TEST(ProfileReader, UnusableFilesAreClearErrors) {
  const fs::path dir = fs::temp_directory_path() / "atlas_profile_reader_bad";
  fs::create_directories(dir);
  // No file.
  EXPECT_THAT(error_of((dir / "none.h5").string()), HasSubstr("no such file\n  hint: a run writes runs/NAME/profile.h5"));
  // Not HDF5 at all: HDF5's own message, naming the file, and what to give instead.
  std::ofstream((dir / "text.h5").string()) << "run.steps = 1\n";
  const std::string not_h5 = error_of((dir / "text.h5").string());
  EXPECT_THAT(not_h5, HasSubstr("cannot read profile '" + (dir / "text.h5").string() + "'"));
  EXPECT_THAT(not_h5, HasSubstr("hint: give a run directory or its profile.h5"));
  // HDF5, but not an atlas profile.
  { h5::File f = h5::create_file((dir / "other.h5").string()); }
  EXPECT_THAT(error_of((dir / "other.h5").string()), HasSubstr("is not an atlas profile"));
  // A profile whose /events columns disagree (one cut short).
  const Written w = write_one("cut");
  const std::string cut = (w.dir / "profile.h5").string();
  {
    h5::File f = h5::open_file(cut, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Ldelete(f.get(), "/events/end_s", H5P_DEFAULT));
    const std::vector<double> shorter(w.events.size() - 1, 0.5);
    const hsize_t n = shorter.size();
    h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
    h5::Dataset d(ATLAS_H5_CHECK(
        H5Dcreate2(f.get(), "/events/end_s", H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    ATLAS_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, shorter.data()));
  }
  EXPECT_THAT(error_of(cut), HasSubstr("the /events columns have different lengths"));
  // A column missing.
  {
    h5::File f = h5::open_file(cut, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Ldelete(f.get(), "/events/kind", H5P_DEFAULT));
  }
  EXPECT_THAT(error_of(cut), HasSubstr("'" + cut + "': no dataset /events/kind\n  hint: the file is damaged"));
  fs::remove_all(w.dir);
  fs::remove_all(dir);
}

// A damaged profile's sizes and times are checked before they cost memory or reach the simulator:
// a column claiming 2^40 rows the file does not hold (an unlimited dataset of that extent is a
// small file; a real run's profile may hold any number of rows) was an
// internal error (bad_alloc), and an event of 1e306 s an infinite cost in the schedule engine.
TEST(ProfileReader, DamagedSizesAndTimesAreClearErrors) {
  const Written w = write_one("damaged");
  const std::string path = (w.dir / "profile.h5").string();
  auto replace_end = [&](hsize_t rows, hsize_t written, double value) {
    h5::File f = h5::open_file(path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Ldelete(f.get(), "/events/end_s", H5P_DEFAULT));
    const hsize_t max = H5S_UNLIMITED;
    h5::Space space(ATLAS_H5_CHECK(H5Screate_simple(1, &rows, &max)));
    h5::PropList dcpl(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    const hsize_t chunk = 1024;
    ATLAS_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk));
    h5::Dataset d(ATLAS_H5_CHECK(
        H5Dcreate2(f.get(), "/events/end_s", H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
    if (written > 0) {
      std::vector<double> v(written, value);
      ATLAS_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
    }
  };
  replace_end(hsize_t{1} << 40, 0, 0.0);
  EXPECT_LT(fs::file_size(path), 1u << 20);
  EXPECT_THAT(error_of(path), HasSubstr("'" + path + "': /events/end_s claims 1099511627776 rows of 8 bytes, but the "
                                        "file holds 0 bytes for it\n  hint: the file is damaged"));
  replace_end(w.events.size(), w.events.size(), 1e306);
  EXPECT_THAT(error_of(path), HasSubstr("'" + path + "': /events row 0 is out of range"));
  replace_end(w.events.size(), w.events.size(), std::numeric_limits<double>::infinity());
  EXPECT_THAT(error_of(path), HasSubstr("/events row 0 is out of range"));
  fs::remove_all(w.dir);
}

// A write that fails leaves no profile.h5.tmp behind (here the rename: profile.h5 is a directory).
TEST(ProfileWriter, AFailedWriteRemovesItsTmp) {
  const fs::path dir = fs::temp_directory_path() / "atlas_profile_reader_fail";  // write_one("fail")'s
  fs::remove_all(dir);
  fs::create_directories(dir / "profile.h5" / "x");
  try {
    (void)write_one("fail");
    ADD_FAILURE() << "no error renaming onto a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), HasSubstr("cannot rename"));
  }
  EXPECT_FALSE(fs::exists(dir / "profile.h5.tmp"));
  EXPECT_TRUE(fs::exists(dir / "profile.h5" / "x"));
  fs::remove_all(dir);
}

// The version is checked (as atlas report does): a profile of another version is refused by name.
TEST(ProfileReader, AnotherVersionIsRefused) {
  const Written w = write_one("version");
  const std::string path = (w.dir / "profile.h5").string();
  {
    h5::File f = h5::open_file(path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Adelete(f.get(), "version"));
    h5::write_attr(f.get(), "version", std::int64_t{2});
  }
  EXPECT_THAT(error_of(path), HasSubstr("'" + path + "' is an atlas profile of version 2; this atlas reads version 1"));
  fs::remove_all(w.dir);
}

// A copy compressed since it was written (its columns deflated, as h5repack -f GZIP makes them)
// reads back the same events: the row-count check allows a filtered column its compression.
TEST(ProfileReader, ACompressedCopyReadsBackTheSame) {
  const Written w = write_one("gzip");
  const std::string path = (w.dir / "profile.h5").string();
  const ProfileSlots plain = read_profile_slots(path);
  {
    h5::File f = h5::open_file(path, h5::Access::ReadWrite);
    const std::vector<std::int32_t> step = [&] {
      std::vector<std::int32_t> v;
      for (const SlotEvent& e : plain.events) v.push_back(e.step);
      return v;
    }();
    ATLAS_H5_CHECK(H5Ldelete(f.get(), "/events/step", H5P_DEFAULT));
    const hsize_t n = step.size();
    h5::Space space = h5::simple_space(std::span<const hsize_t>(&n, 1));
    h5::PropList dcpl(ATLAS_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    const hsize_t chunk = n;
    ATLAS_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk));
    ATLAS_H5_CHECK(H5Pset_deflate(dcpl.get(), 9));
    h5::Dataset d(ATLAS_H5_CHECK(
        H5Dcreate2(f.get(), "/events/step", H5T_NATIVE_INT32, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
    ATLAS_H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, step.data()));
    EXPECT_LT(H5Dget_storage_size(d.get()), n * sizeof(std::int32_t)) << "the column is not compressed: no test";
  }
  const ProfileSlots gz = read_profile_slots(path);
  ASSERT_EQ(gz.events.size(), plain.events.size());
  for (std::size_t i = 0; i < gz.events.size(); ++i) EXPECT_EQ(gz.events[i].step, plain.events[i].step) << i;
  fs::remove_all(w.dir);
}

}  // namespace
}  // namespace atlas::runtime
