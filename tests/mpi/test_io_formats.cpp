// SPDX-License-Identifier: MIT
// docs/formats.md promises that h5py and h5dump read checkpoints: write one, then run the h5py
// snippet copied verbatim from docs/formats.md and `h5dump -H`, and check what they print.
// Skips (with the reason) when /usr/bin/python3 has no h5py or h5dump is not installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "atlas/io/checkpoint.hpp"
#include "test_io_model.hpp"

namespace atlas::io {
namespace {

using ::testing::HasSubstr;
using namespace atlas::io::testing;
namespace fs = std::filesystem;

struct CmdResult {
  int status = -1;
  std::string out;
};

CmdResult run(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  return r;
}

std::string source_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return env != nullptr ? env : ATLAS_SOURCE_DIR;
}

/// The first ```python block after the marker line in docs/formats.md.
std::string doc_snippet(const std::string& marker) {
  std::ifstream in(source_dir() + "/docs/formats.md");
  std::string line;
  std::string code;
  bool seen_marker = false;
  bool in_code = false;
  while (std::getline(in, line)) {
    if (!seen_marker) {
      seen_marker = line.find(marker) != std::string::npos;
    } else if (!in_code) {
      in_code = line.rfind("```python", 0) == 0;
    } else if (line.rfind("```", 0) == 0) {
      return code;
    } else {
      code += line + "\n";
    }
  }
  return "";
}

WriteResult write_sample(const std::string& dir) {
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  mpi::Comm world = mpi::Comm::world();
  const auto shards = my_shards(world, l, 11, true);
  const auto views = write_views(shards);
  CheckpointMeta meta = toy_meta(12, l);
  meta.state["dp0/loader"] = {12, 3};
  return write_checkpoint(world, dir, meta, views);
}

TEST(Formats, H5pySnippetFromTheDocsListsEveryTensorAndShape) {
  SharedTempDir tmp(mpi::Comm::world());
  const WriteResult w = write_sample(tmp.path());
  if (mpi::Comm::world().rank() != 0) return;
  if (run("/usr/bin/python3 -c 'import h5py'").status != 0) {
    std::printf("SKIP reason: /usr/bin/python3 cannot import h5py (apt-get install python3-h5py)\n");
    GTEST_SKIP() << "/usr/bin/python3 cannot import h5py";
  }
  const std::string code = doc_snippet("<!-- snippet: h5py-list-tensors -->");
  ASSERT_FALSE(code.empty()) << "docs/formats.md lost its h5py snippet";
  const std::string script = tmp.path() + "/list_tensors.py";
  std::ofstream(script) << code;
  const CmdResult r = run("/usr/bin/python3 " + script + " " + w.path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("atlas-checkpoint version 1 step 12"));
  for (const auto& t : toy_model()) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    // One line per tensor: name, full logical shape, dtype.
    std::istringstream lines(r.out);
    std::string line;
    bool found = false;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      if (name == t.name) {
        found = true;
        EXPECT_THAT(line, HasSubstr("(" + shape + (t.shape.size() == 1 ? ",)" : ")")));
        EXPECT_THAT(line, HasSubstr("float32"));
      }
    }
    EXPECT_TRUE(found) << t.name << " missing from:\n" << r.out;
  }
}

TEST(Formats, H5dumpReadsTheHeader) {
  SharedTempDir tmp(mpi::Comm::world());
  const WriteResult w = write_sample(tmp.path());
  if (mpi::Comm::world().rank() != 0) return;
  if (run("h5dump --version").status != 0) {
    std::printf("SKIP reason: h5dump not installed (apt-get install hdf5-tools)\n");
    GTEST_SKIP() << "h5dump not installed";
  }
  const CmdResult r = run("h5dump -H " + w.path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("ATTRIBUTE \"format\""));
  EXPECT_THAT(r.out, HasSubstr("DATASET \"h.1.attn.qkv.weight\""));
  EXPECT_THAT(r.out, HasSubstr("H5T_IEEE_F32LE"));
  EXPECT_THAT(r.out, HasSubstr("DATASPACE  SIMPLE { ( 3, 8, 8 ) / ( 3, 8, 8 ) }"));
  EXPECT_THAT(r.out, HasSubstr("ATTRIBUTE \"crc32c_boxes\""));
  EXPECT_THAT(r.out, HasSubstr("GROUP \"adam_v\""));
  EXPECT_THAT(r.out, HasSubstr("DATASET \"loader\""));
  const CmdResult attrs = run("h5dump -a /format -a /format_version " + w.path);
  ASSERT_EQ(attrs.status, 0) << attrs.out;
  EXPECT_THAT(attrs.out, HasSubstr("(0): \"atlas-checkpoint\""));
  EXPECT_THAT(attrs.out, HasSubstr("(0): 1"));
}

}  // namespace
}  // namespace atlas::io
