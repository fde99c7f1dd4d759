// SPDX-License-Identifier: MIT
// HDF5 RAII wrappers and ATLAS_H5_CHECK, on serial files (no MPI): error text, ownership,
// attribute and string round trips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <type_traits>

#include "atlas/io/hdf5.hpp"

namespace atlas::h5 {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class TempFile {
 public:
  TempFile() {
    std::string templ = (fs::temp_directory_path() / "atlas_h5_XXXXXX").string();
    const int fd = mkstemp(templ.data());
    if (fd >= 0) close(fd);
    m_path = templ;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(m_path, ec);
  }
  [[nodiscard]] const std::string& path() const { return m_path; }

 private:
  std::string m_path;
};

static_assert(!std::is_copy_constructible_v<File> && !std::is_copy_assignable_v<File>);
static_assert(std::is_nothrow_move_constructible_v<Dataset>);
static_assert(std::is_nothrow_move_assignable_v<Space>);

TEST(H5Check, NegativeReturnBecomesIoErrorWithCallFileAndHdf5Stack) {
  init();
  FileContext ctx("/no/such/dir/x.h5");
  try {
    (void)ATLAS_H5_CHECK(H5Fopen("/no/such/dir/x.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), HasSubstr("HDF5 call failed: H5Fopen(\"/no/such/dir/x.h5\""));
    EXPECT_THAT(e.what(), HasSubstr("[file '/no/such/dir/x.h5']"));
    EXPECT_THAT(e.what(), HasSubstr("unable to open file"));  // from HDF5's error stack
    EXPECT_THAT(e.what(), HasSubstr("test_io_hdf5.cpp:"));    // call site
  }
  EXPECT_EQ(error_stack(), "");  // the stack was consumed
}

TEST(H5Check, OpenHelpersNameTheFile) {
  try {
    (void)open_file("/no/such/file.h5", Access::ReadOnly);
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[file '/no/such/file.h5']"));
  }
  EXPECT_EQ(current_file(), "");  // the helper's context ended with it
}

TEST(H5Check, FileContextsNest) {
  FileContext outer("a.h5");
  {
    FileContext inner("b.h5");
    EXPECT_EQ(current_file(), "b.h5");
  }
  EXPECT_EQ(current_file(), "a.h5");
}

TEST(H5Handle, MoveTransfersOwnershipAndDestructorReleases) {
  const hsize_t n = 3;
  Space a = simple_space({&n, 1});
  const hid_t id = a.get();
  EXPECT_GT(H5Iis_valid(id), 0);
  Space b = std::move(a);
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.get(), id);
  { Space c = std::move(b); }
  EXPECT_LE(H5Iis_valid(id), 0);
}

TEST(H5Handle, FailedReleaseIsLoggedNotThrown) {
  const hsize_t n = 3;
  ::testing::internal::CaptureStderr();
  {
    Space s = simple_space({&n, 1});
    H5Sclose(s.get());  // someone else closed it: the destructor's close fails
  }
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("HDF5 failed to release identifier"));
}

TEST(H5Handle, ExplicitCloseReportsFailure) {
  const hsize_t n = 3;
  Space s = simple_space({&n, 1});
  H5Sclose(s.get());
  EXPECT_THROW(s.close(), Error);
  EXPECT_FALSE(s.valid());
}

TEST(H5Attributes, RoundTripIntegersStringsAndStringDatasets) {
  TempFile tmp;
  {
    File f = create_file(tmp.path());
    write_attr(f.get(), "answer", std::int64_t{42});
    const std::vector<std::int64_t> v{1, -2, 3000000000LL};
    write_attr(f.get(), "list", std::span<const std::int64_t>(v));
    write_attr(f.get(), "empty_list", std::span<const std::int64_t>());
    write_attr(f.get(), "text", std::string("atlas-checkpoint"));
    write_attr(f.get(), "empty_text", std::string());
    Group g = create_group(f.get(), "a");
    Group g2 = create_group(g.get(), "b");
    std::string deck(100000, 'x');  // larger than an attribute may be
    deck += "\nend";
    write_string_dataset(g2.get(), "deck", deck, true);
    f.close();
  }
  File f = open_file(tmp.path(), Access::ReadOnly);
  EXPECT_EQ(read_attr_int(f.get(), "answer"), 42);
  EXPECT_EQ(read_attr_ints(f.get(), "list"), (std::vector<std::int64_t>{1, -2, 3000000000LL}));
  EXPECT_TRUE(read_attr_ints(f.get(), "empty_list").empty());
  EXPECT_EQ(read_attr_string(f.get(), "text"), "atlas-checkpoint");
  EXPECT_EQ(read_attr_string(f.get(), "empty_text"), "");
  EXPECT_TRUE(has_attr(f.get(), "answer"));
  EXPECT_FALSE(has_attr(f.get(), "question"));
  EXPECT_TRUE(exists(f.get(), "a/b/deck"));
  EXPECT_FALSE(exists(f.get(), "a/c/deck"));  // a missing middle component is just "false"
  EXPECT_EQ(list_links(f.get()), (std::vector<std::string>{"a"}));
  const std::string deck = read_string_dataset(f.get(), "a/b/deck");
  EXPECT_EQ(deck.size(), 100004U);
  EXPECT_EQ(deck.substr(deck.size() - 4), "\nend");
  FileContext ctx(tmp.path());
  try {
    (void)read_attr_int(f.get(), "question");
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("HDF5 attribute 'question' is missing in '" + tmp.path()));
  }
  EXPECT_THROW((void)read_attr_int(f.get(), "text"), Error);  // not an integer
}

}  // namespace
}  // namespace atlas::h5
