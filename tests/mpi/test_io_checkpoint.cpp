// SPDX-License-Identifier: MIT
// Checkpoint writer/reader under MPI: bit-exact round trips, resharding between layouts, the
// error texts for truncated / wrong-version / wrong-model files, checksums (a flipped bit in a
// tensor, a moment or a /state word is an I/O error; latest skips such files), atomicity and
// keep_last.
// Every test is valid at any np: ranks play the virtual ranks v with v % np == rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "atlas/core/crc32c.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/io/hdf5.hpp"
#include "support/flip_bit.hpp"
#include "test_io_model.hpp"

namespace atlas::io {
namespace {

using ::testing::HasSubstr;
using namespace atlas::io::testing;
namespace fs = std::filesystem;

mpi::Comm& world() {
  static mpi::Comm c = mpi::Comm::world();
  return c;
}

WriteResult write_toy(const std::string& dir, std::int64_t step, const VLayout& l,
                      std::uint64_t seed, WriteOptions opt = {},
                      const std::map<std::string, std::vector<std::uint64_t>>& extra_state = {}) {
  const auto shards = my_shards(world(), l, seed, /*fill=*/true);
  const auto views = write_views(shards);
  CheckpointMeta meta = toy_meta(step, l);
  meta.state.insert(extra_state.begin(), extra_state.end());
  // Each DP replica's loader position and RNG state, known by its first virtual rank.
  for (int v = world().rank(); v < l.size(); v += world().size()) {
    if (v % l.tp == 0 && v / (l.tp * l.dp) == 0) {
      const int dp = v / l.tp;
      meta.state["dp" + std::to_string(dp) + "/loader"] = {static_cast<std::uint64_t>(step),
                                                            static_cast<std::uint64_t>(1000 + dp)};
      meta.state["dp" + std::to_string(dp) + "/rng"] = {seed, 0xFFFFFFFFFFFFFFFFULL, 7};
    }
  }
  return write_checkpoint(world(), dir, meta, views, opt);
}

/// Reads into layout `l` and returns the number of wrong elements over all ranks.
std::int64_t read_toy_wrong(const std::string& path, const VLayout& l, std::uint64_t seed,
                            ReadOptions opt = {}, CheckpointMeta* meta_out = nullptr) {
  auto shards = my_shards(world(), l, seed, /*fill=*/false);
  const auto views = read_views(shards);
  CheckpointMeta meta = read_checkpoint(world(), path, views, opt);
  if (meta_out) *meta_out = meta;
  std::int64_t wrong = count_wrong(shards, seed);
  return world().allreduce(wrong, MPI_SUM);
}

template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

// ---- round trips ----

class RoundTrip : public ::testing::TestWithParam<Transfer> {};

TEST_P(RoundTrip, EveryElementOfEveryShardComesBackBitForBit) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 2, .dp = 2, .tp = 2};
  WriteOptions wopt;
  wopt.transfer = GetParam();
  const WriteResult w = write_toy(tmp.path(), 7, l, 42, wopt);
  EXPECT_EQ(w.path, tmp.path() + "/step-000007.h5");
  EXPECT_TRUE(fs::exists(w.path));
  EXPECT_FALSE(fs::exists(w.path + ".tmp"));
  std::int64_t elements = 0;
  for (const auto& t : toy_model()) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    elements += n;
  }
  EXPECT_EQ(w.tensor_bytes, static_cast<std::uint64_t>(elements) * 3 * 4);
  EXPECT_GE(w.file_bytes, w.tensor_bytes);

  ReadOptions ropt;
  ropt.transfer = GetParam();
  ropt.expect_model = toy_shape();
  CheckpointMeta meta;
  EXPECT_EQ(read_toy_wrong(w.path, l, 42, ropt, &meta), 0);

  CheckpointMeta expect = toy_meta(7, l);
  EXPECT_EQ(meta.step, 7);
  EXPECT_EQ(meta.git_sha, expect.git_sha);
  EXPECT_EQ(meta.deck, expect.deck);
  EXPECT_EQ(meta.layout, expect.layout);
  EXPECT_EQ(meta.model, expect.model);
  ASSERT_EQ(meta.state.size(), 4U);  // dp0/dp1 x loader/rng, gathered from whichever rank had them
  EXPECT_EQ(meta.state.at("dp1/loader"), (std::vector<std::uint64_t>{7, 1001}));
  EXPECT_EQ(meta.state.at("dp0/rng"), (std::vector<std::uint64_t>{42, 0xFFFFFFFFFFFFFFFFULL, 7}));
}

std::string transfer_name(const ::testing::TestParamInfo<Transfer>& p) {
  const char* const names[] = {"auto", "collective", "independent"};
  return names[static_cast<int>(p.param)];
}

INSTANTIATE_TEST_SUITE_P(Transfers, RoundTrip,
                         ::testing::Values(Transfer::Auto, Transfer::Collective,
                                           Transfer::Independent),
                         transfer_name);

TEST(Checkpoint, StoresFullLogicalTensorsThatASerialReaderSees) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 4};
  const WriteResult w = write_toy(tmp.path(), 1, l, 5);
  if (world().rank() == 0) {
    // Read whole datasets with plain serial HDF5 and check each element at its logical index.
    h5::File f = h5::open_file(w.path, h5::Access::ReadOnly);
    const auto model = toy_model();
    for (std::size_t i = 0; i < model.size(); ++i) {
      for (int k = 0; k < 3; ++k) {
        const std::string path = std::string(k == 0 ? "params/" : k == 1 ? "adam_m/" : "adam_v/") +
                                 model[i].name;
        h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT)));
        const auto dims = h5::dataset_dims(d.get());
        ASSERT_EQ(std::vector<std::int64_t>(dims.begin(), dims.end()), model[i].shape) << path;
        std::size_t n = 1;
        for (auto x : dims) n *= x;
        std::vector<std::uint32_t> bits(n);  // float32 read raw (no conversion), compared as bits
        ATLAS_H5_CHECK(
            H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()));
        std::size_t wrong = 0;
        for (std::size_t e = 0; e < n; ++e)
          wrong += bits[e] != element_bits(5, i, k, static_cast<std::int64_t>(e));
        EXPECT_EQ(wrong, 0U) << path;
      }
    }
  }
}

// ---- resharding ----

struct Reshard {
  VLayout written;
  VLayout read;
};

class Resharding : public ::testing::TestWithParam<Reshard> {};

TEST_P(Resharding, ALayoutReadsAnotherLayoutsCheckpoint) {
  SharedTempDir tmp(world());
  const auto [written, read] = GetParam();
  const WriteResult w = write_toy(tmp.path(), 3, written, 99);
  ReadOptions opt;
  opt.expect_model = toy_shape();
  for (const Transfer t : {Transfer::Auto, Transfer::Collective, Transfer::Independent}) {
    opt.transfer = t;
    EXPECT_EQ(read_toy_wrong(w.path, read, 99, opt), 0) << static_cast<int>(t);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Resharding,
    ::testing::Values(Reshard{{.pp = 2, .dp = 1, .tp = 2}, {.pp = 3, .dp = 2, .tp = 1}},
                      Reshard{{.pp = 3, .dp = 2, .tp = 1}, {.pp = 1, .dp = 1, .tp = 4}},
                      Reshard{{.pp = 1, .dp = 1, .tp = 1}, {.pp = 2, .dp = 1, .tp = 3}}));

TEST(Checkpoint, ReadingOnlyParametersLeavesMomentsAlone) {
  SharedTempDir tmp(world());
  const WriteResult w = write_toy(tmp.path(), 2, {.pp = 1, .dp = 1, .tp = 2}, 8);
  auto shards = my_shards(world(), {.pp = 2, .dp = 1, .tp = 1}, 8, false);
  const auto views = read_views(shards, /*moments=*/false);
  (void)read_checkpoint(world(), w.path, views);
  EXPECT_EQ(world().allreduce(count_wrong(shards, 8, /*kinds=*/1), MPI_SUM), 0);
}

// ---- errors with documented text ----

TEST(CheckpointErrors, TruncatedFileNamesTheFile) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  const WriteResult w = write_toy(tmp.path(), 4, l, 1);
  if (world().rank() == 0) fs::resize_file(w.path, w.file_bytes / 2);
  world().barrier();
  const std::string msg = config_error_of([&] { (void)read_toy_wrong(w.path, l, 1); });
  EXPECT_THAT(msg, HasSubstr("checkpoint '" + w.path + "' is truncated"));
  EXPECT_THAT(msg, HasSubstr("truncated file"));  // HDF5's own words follow ours
  EXPECT_THAT(config_error_of([&] { (void)resolve_resume(world(), w.path, tmp.path()); }),
              HasSubstr("checkpoint '" + w.path + "' is truncated"));
}

TEST(CheckpointErrors, WrongFormatVersionSaysFoundAndExpected) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult w = write_toy(tmp.path(), 4, l, 1);
  if (world().rank() == 0) {
    h5::File f = h5::open_file(w.path, h5::Access::ReadWrite);
    h5::Attr a(ATLAS_H5_CHECK(H5Aopen(f.get(), "format_version", H5P_DEFAULT)));
    const std::int64_t v = 99;
    ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &v));
  }
  world().barrier();
  EXPECT_THAT(config_error_of([&] { (void)read_toy_wrong(w.path, l, 1); }),
              HasSubstr("checkpoint '" + w.path +
                        "' has format version 99, but this build of atlas reads version 1"));
}

TEST(CheckpointErrors, WrongModelShapeNamesTheField) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult w = write_toy(tmp.path(), 4, l, 1);
  ReadOptions opt;
  opt.expect_model = toy_shape();
  opt.expect_model->hidden = 256;
  opt.expect_model->vocab = 50257;
  const std::string msg = config_error_of([&] { (void)read_toy_wrong(w.path, l, 1, opt); });
  EXPECT_THAT(msg, HasSubstr("checkpoint '" + w.path +
                             "': model.hidden is 8 in the checkpoint but 256 in the deck"));
  EXPECT_THAT(msg, HasSubstr("model.vocab is 13 in the checkpoint but 50257 in the deck"));
}

TEST(CheckpointErrors, MissingOrMisshapenTensorIsAConfigErrorOnEveryRank) {
  SharedTempDir tmp(world());
  const WriteResult w = write_toy(tmp.path(), 4, {.pp = 1, .dp = 1, .tp = 1}, 1);
  std::vector<float> buf(64);
  std::vector<ReadShard> views;
  if (world().rank() == world().size() - 1) {
    views.push_back({"h.9.nope", {4}, {0}, {4}, false, buf.data(), nullptr, nullptr});
    views.push_back({"wte", {kVocab, 4}, {0, 0}, {1, 4}, false, buf.data(), nullptr, nullptr});
  }
  const std::string msg = config_error_of([&] { (void)read_checkpoint(world(), w.path, views); });
  EXPECT_THAT(msg, HasSubstr("has no tensor 'h.9.nope'"));
  EXPECT_THAT(msg, HasSubstr("tensor 'wte' has shape [13, 8] in checkpoint"));
}

TEST(CheckpointErrors, NotACheckpointAndMissingFile) {
  SharedTempDir tmp(world());
  const std::string junk = tmp.path() + "/step-000001.h5";
  if (world().rank() == 0) std::ofstream(junk) << "not hdf5 at all";
  world().barrier();
  EXPECT_THAT(config_error_of([&] { (void)inspect_checkpoint(world(), junk); }),
              HasSubstr("checkpoint '" + junk + "' is not an HDF5 file"));
  EXPECT_THAT(config_error_of([&] { (void)inspect_checkpoint(world(), tmp.path() + "/nope.h5"); }),
              HasSubstr("checkpoint '" + tmp.path() + "/nope.h5' does not exist"));
}

std::string internal_error_of(const std::string& dir, std::span<const WriteShard> views) {
  try {
    (void)write_checkpoint(world(), dir, toy_meta(1, {}), views);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    return e.what();
  }
  return "<no atlas::Error>";
}

TEST(CheckpointErrors, WriterShardsMustTileEachTensor) {
  SharedTempDir tmp(world());
  std::vector<float> buf(16, 1.0F);
  std::vector<WriteShard> gap;
  if (world().rank() == 0) {  // rows [0, 2) of a [4, 4] tensor; nobody writes rows 2..3
    gap.push_back({"w", {4, 4}, {0, 0}, {2, 4}, true, buf.data(), buf.data(), buf.data()});
  }
  EXPECT_THAT(internal_error_of(tmp.path(), gap),
              HasSubstr("tensor 'w' (shape [4, 4]): writer shards cover 8 of 16 elements"));
  if (world().size() > 1) {  // every rank claims the whole tensor
    std::vector<WriteShard> overlap{
        {"w", {4, 4}, {0, 0}, {4, 4}, true, buf.data(), buf.data(), buf.data()}};
    EXPECT_THAT(internal_error_of(tmp.path(), overlap),
                HasSubstr("tensor 'w': writer shards on rank 0 (offset [0, 0], shape [4, 4]) and "
                          "rank 1 (offset [0, 0], shape [4, 4]) overlap"));
  }
  std::vector<WriteShard> null_buffer{
      {"w", {4, 4}, {0, 0}, {4, 4}, world().rank() == 0, buf.data(), nullptr, buf.data()}};
  EXPECT_THAT(internal_error_of(tmp.path(), null_buffer),
              HasSubstr("tensor 'w': a writer shard needs value, adam_m and adam_v buffers"));
  std::vector<WriteShard> bad_box{{"a/b", {4}, {2}, {4}, true, buf.data(), buf.data(), buf.data()}};
  const std::string msg = internal_error_of(tmp.path(), bad_box);
  EXPECT_THAT(msg, HasSubstr("tensor name 'a/b' is not usable"));
  bad_box[0].name = "v";
  EXPECT_THAT(internal_error_of(tmp.path(), bad_box),
              HasSubstr("tensor 'v': shard offset [2] + shape [4] does not fit in the full shape "
                        "[4]"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/step-000001.h5.tmp"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/step-000001.h5"));
}

// ---- checksums ----

template <class F>
std::string checksum_error_of(F&& f) {
  try {
    f();
  } catch (const ChecksumMismatch& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    return e.what();
  }
  return "<no ChecksumMismatch>";
}

/// Rank 0 flips one bit of `dataset` in `path`; every rank waits for it.
void damage(const std::string& path, const std::string& dataset, std::size_t byte = 1) {
  if (world().rank() == 0) atlas::test_support::flip_bit(path, dataset, byte, 3);
  world().barrier();
}

TEST(CheckpointChecksums, EveryDatasetCarriesTheCrc32cOfEachWriterBox) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  const WriteResult w = write_toy(tmp.path(), 1, l, 6);
  if (world().rank() == 0) {
    h5::File f = h5::open_file(w.path, h5::Access::ReadOnly);
    EXPECT_EQ(h5::read_attr_string(f.get(), "checksum"), "crc32c");
    // qkv.weight [3, 8, 8] split over tp 2 along its middle axis: two boxes, one per TP rank.
    h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), "adam_m/h.0.attn.qkv.weight", H5P_DEFAULT)));
    EXPECT_EQ(h5::read_attr_ints(d.get(), "crc32c_boxes"),
              (std::vector<std::int64_t>{0, 0, 0, 3, 4, 8, 0, 4, 0, 3, 4, 8}));
    const auto crcs = h5::read_attr_ints(d.get(), "crc32c");
    ASSERT_EQ(crcs.size(), 2U);
    for (int tp = 0; tp < 2; ++tp) {
      for (const auto& s : shards_of(l, tp, 6, true)) {
        if (s.name != "h.0.attn.qkv.weight") continue;
        EXPECT_EQ(crcs[static_cast<std::size_t>(tp)],
                  crc32c(s.buf[1].data(), s.buf[1].size() * 4)) << "tp " << tp;
      }
    }
    // A /state dataset: one checksum over its little-endian words.
    h5::Dataset st(ATLAS_H5_CHECK(H5Dopen2(f.get(), "state/dp0/loader", H5P_DEFAULT)));
    const std::uint64_t words[2] = {1, 1000};
    EXPECT_EQ(h5::read_attr_ints(st.get(), "crc32c"),
              (std::vector<std::int64_t>{crc32c(words, sizeof words)}));
    EXPECT_FALSE(h5::has_attr(st.get(), "crc32c_boxes"));
  }
}

TEST(CheckpointChecksums, AFlippedBitInATensorIsAnIoErrorNamingTheFileAndTheDataset) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  const WriteResult w = write_toy(tmp.path(), 4, l, 2);
  damage(w.path, "/params/h.1.attn.qkv.weight");
  // The writer's layout checks its own buffers; another layout reads the boxes once more.
  const std::string same = checksum_error_of([&] { (void)read_toy_wrong(w.path, l, 2); });
  EXPECT_THAT(same, HasSubstr("checkpoint '" + w.path + "': dataset /params/h.1.attn.qkv.weight "
                              "(box offset [0, 0, 0] shape [3, 4, 8]): checksum mismatch"));
  const std::string other =
      checksum_error_of([&] { (void)read_toy_wrong(w.path, {.pp = 2, .dp = 2, .tp = 1}, 2); });
  EXPECT_THAT(other, HasSubstr("dataset /params/h.1.attn.qkv.weight (box offset [0, 0, 0] shape "
                               "[3, 4, 8]): checksum mismatch"));
  // A damaged moment is found when the moments are read, and only then.
  const WriteResult w2 = write_toy(tmp.path(), 5, l, 2);
  damage(w2.path, "/adam_v/wte", 4 * 20 + 2);  // element 20: row 2 of the [13, 8], in tp 0's rows
  auto shards = my_shards(world(), l, 2, false);
  const auto params_only = read_views(shards, /*moments=*/false);
  EXPECT_NO_THROW((void)read_checkpoint(world(), w2.path, params_only));
  EXPECT_THAT(checksum_error_of([&] { (void)read_toy_wrong(w2.path, l, 2); }),
              HasSubstr("dataset /adam_v/wte (box offset [0, 0] shape [6, 8]): checksum mismatch"));
}

TEST(CheckpointChecksums, AFlippedBitInStateOrDeckIsAnIoErrorAndLatestSkipsTheFile) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 2, .dp = 1, .tp = 1};
  const WriteResult good = write_toy(tmp.path(), 1, l, 3, {}, {{"adam_t", {1}}});
  for (const std::string dataset : {"/state/adam_t", "/state/dp0/loader", "/deck"}) {
    const WriteResult w = write_toy(tmp.path(), 2, l, 3, {}, {{"adam_t", {2}}});
    damage(w.path, dataset, 0);
    const std::string want = "checkpoint '" + w.path + "': dataset " + dataset +
                             ": checksum mismatch";
    EXPECT_THAT(checksum_error_of([&] { (void)resolve_resume(world(), w.path, tmp.path()); }),
                HasSubstr(want));
    EXPECT_THAT(checksum_error_of([&] { (void)read_toy_wrong(w.path, l, 3); }), HasSubstr(want));
    const LatestCheckpoint latest = find_latest(world(), tmp.path());
    EXPECT_EQ(latest.path, good.path) << dataset;
    ASSERT_EQ(latest.skipped.size(), 1U) << dataset;
    EXPECT_THAT(latest.skipped[0].reason, HasSubstr(want));
    EXPECT_EQ(resolve_resume(world(), "latest", tmp.path()), good.path);
  }
}

TEST(CheckpointChecksums, ResumeLatestFallsBackPastATensorThatFailsItsChecksum) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 2, .tp = 2};
  const WriteResult s1 = write_toy(tmp.path(), 1, l, 9);
  const WriteResult s2 = write_toy(tmp.path(), 2, l, 9);
  damage(s2.path, "/adam_m/h.2.mlp.fc.weight");
  auto shards = my_shards(world(), l, 9, false);
  const auto views = read_views(shards);
  const auto r = resume_checkpoint(world(), "latest", tmp.path(), views);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->path, s1.path);
  EXPECT_EQ(r->meta.step, 1);
  EXPECT_EQ(world().allreduce(count_wrong(shards, 9), MPI_SUM), 0);
  // Named explicitly, the damaged file is an error.
  EXPECT_THAT(checksum_error_of([&] { (void)resume_checkpoint(world(), s2.path, "", views); }),
              HasSubstr("dataset /adam_m/h.2.mlp.fc.weight (box offset [0, 0] shape [8, 16]): "
                        "checksum mismatch"));
  // With no intact file left, latest neither resumes nor starts afresh from half-read tensors.
  damage(s1.path, "/params/wte");
  EXPECT_THAT(checksum_error_of([&] { (void)resume_checkpoint(world(), "latest", tmp.path(), views); }),
              HasSubstr("run.resume = latest: no intact checkpoint left in '" + tmp.path() + "'"));
}

TEST(CheckpointChecksums, AFileWithoutChecksumsIsReadUnverified) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult w = write_toy(tmp.path(), 1, l, 4);
  if (world().rank() == 0) {  // as a file written before checksums: no root 'checksum', no /deck crc32c
    h5::File f = h5::open_file(w.path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Adelete(f.get(), "checksum"));
    ATLAS_H5_CHECK(H5Adelete_by_name(f.get(), "deck", "crc32c", H5P_DEFAULT));
  }
  damage(w.path, "/params/wte");
  EXPECT_FALSE(inspect_checkpoint(world(), w.path).checksummed);
  EXPECT_EQ(read_toy_wrong(w.path, l, 4), 1);  // read, unverified: the flipped element differs
}

// Deleting the root attribute alone does not switch the checks off: the datasets still carry
// their crc32c, so the file was altered after it was written.
TEST(CheckpointChecksums, ARemovedRootAttributeIsAChecksumMismatch) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult w = write_toy(tmp.path(), 1, l, 4);
  if (world().rank() == 0) {
    h5::File f = h5::open_file(w.path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Adelete(f.get(), "checksum"));
  }
  world().barrier();
  EXPECT_THAT(checksum_error_of([&] { (void)inspect_checkpoint(world(), w.path); }),
              HasSubstr("its datasets carry CRC32C checksums but the root attribute 'checksum' is missing: the file "
                        "was changed after atlas wrote it (checksum mismatch)"));
}

TEST(CheckpointChecksums, AMissingChecksumOrAnUnknownAlgorithmIsAConfigError) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  const WriteResult w = write_toy(tmp.path(), 1, l, 4);
  if (world().rank() == 0) {  // a file that declares checksums but lost one
    h5::File f = h5::open_file(w.path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Adelete_by_name(f.get(), "adam_v/wte", "crc32c", H5P_DEFAULT));
  }
  world().barrier();
  EXPECT_THAT(config_error_of([&] { (void)read_toy_wrong(w.path, l, 4); }),
              HasSubstr("checkpoint '" + w.path + "' is corrupt or incomplete: dataset "
                        "/adam_v/wte has no 'crc32c' attribute although the file declares "
                        "checksums"));
  const WriteResult w2 = write_toy(tmp.path(), 2, l, 4);
  if (world().rank() == 0) {
    h5::File f = h5::open_file(w2.path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Adelete(f.get(), "checksum"));
    h5::write_attr(f.get(), "checksum", std::string("sha256"));
  }
  world().barrier();
  EXPECT_THAT(config_error_of([&] { (void)inspect_checkpoint(world(), w2.path); }),
              HasSubstr("checkpoint '" + w2.path + "' uses checksum 'sha256', but this build of "
                        "atlas knows only 'crc32c'"));
}

/// Rank 0 replaces the checksum attributes of `dataset` in `path` by `boxes` (int64 [n, 2 * rank])
/// and `crcs`, through the HDF5 C API, as a damaged or hand-edited file would hold them.
void set_crc_boxes(const std::string& path, const std::string& dataset, int rank,
                   const std::vector<std::int64_t>& boxes, const std::vector<std::uint32_t>& crcs) {
  if (world().rank() == 0) {
    h5::File f = h5::open_file(path, h5::Access::ReadWrite);
    h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT)));
    ATLAS_H5_CHECK(H5Adelete(d.get(), "crc32c_boxes"));
    ATLAS_H5_CHECK(H5Adelete(d.get(), "crc32c"));
    const hsize_t box_dims[2] = {crcs.size(), 2 * static_cast<hsize_t>(rank)};
    h5::Space bs(ATLAS_H5_CHECK(H5Screate_simple(2, box_dims, nullptr)));
    h5::Attr ba(ATLAS_H5_CHECK(H5Acreate2(d.get(), "crc32c_boxes", H5T_STD_I64LE, bs.get(),
                                          H5P_DEFAULT, H5P_DEFAULT)));
    ATLAS_H5_CHECK(H5Awrite(ba.get(), H5T_NATIVE_INT64, boxes.data()));
    const hsize_t crc_dims[1] = {crcs.size()};
    h5::Space cs(ATLAS_H5_CHECK(H5Screate_simple(1, crc_dims, nullptr)));
    h5::Attr ca(ATLAS_H5_CHECK(H5Acreate2(d.get(), "crc32c", H5T_STD_U32LE, cs.get(), H5P_DEFAULT,
                                          H5P_DEFAULT)));
    ATLAS_H5_CHECK(H5Awrite(ca.get(), H5T_NATIVE_UINT32, crcs.data()));
  }
  world().barrier();
}

TEST(CheckpointChecksums, BoxesThatOverlapOrLeaveAGapAreACorruptFile) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  const std::string qkv = "/adam_m/h.0.attn.qkv.weight";  // [3, 8, 8], boxes [3, 4, 8] per TP rank
  std::uint32_t crc0 = 0;  // tp 0's box, [0, 0, 0] + [3, 4, 8]
  for (const auto& s : shards_of(l, 0, 8, true)) {
    if (s.name == "h.0.attn.qkv.weight") crc0 = crc32c(s.buf[1].data(), s.buf[1].size() * 4);
  }
  // tp 0's box twice, each with its true checksum: the right total volume, but tp 1's half is
  // never verified, so a flipped bit there would be read unnoticed.
  WriteOptions keep_all;
  keep_all.keep_last = 0;
  const WriteResult good = write_toy(tmp.path(), 1, l, 8, keep_all);
  const WriteResult w = write_toy(tmp.path(), 2, l, 8, keep_all);
  set_crc_boxes(w.path, qkv, 3, {0, 0, 0, 3, 4, 8, 0, 0, 0, 3, 4, 8}, {crc0, crc0});
  damage(w.path, qkv, 4 * (4 * 8) + 2);  // element [0, 4, 0]: tp 1's half
  const std::string twice = config_error_of([&] { (void)read_toy_wrong(w.path, l, 8); });
  EXPECT_THAT(twice, HasSubstr("checkpoint '" + w.path + "' is corrupt or incomplete: dataset " +
                               qkv + ": checksum boxes 0 (offset [0, 0, 0], shape [3, 4, 8]) and "
                               "1 (offset [0, 0, 0], shape [3, 4, 8]) overlap"));
  EXPECT_THAT(config_error_of([&] { (void)resolve_resume(world(), w.path, tmp.path()); }),
              HasSubstr("checksum boxes 0 (offset [0, 0, 0], shape [3, 4, 8]) and 1"));
  // Partly overlapping boxes whose volumes add up (rows 3-4 twice, rows 6-7 never).
  const WriteResult w2 = write_toy(tmp.path(), 3, l, 8, keep_all);
  set_crc_boxes(w2.path, qkv, 3, {0, 0, 0, 3, 5, 8, 0, 3, 0, 3, 3, 8}, {crc0, crc0});
  EXPECT_THAT(config_error_of([&] { (void)read_toy_wrong(w2.path, l, 8); }),
              HasSubstr("dataset " + qkv + ": checksum boxes 0 (offset [0, 0, 0], shape "
                        "[3, 5, 8]) and 1 (offset [0, 3, 0], shape [3, 3, 8]) overlap"));
  // A box reaching outside the dataset.
  const WriteResult w3 = write_toy(tmp.path(), 4, l, 8, keep_all);
  set_crc_boxes(w3.path, qkv, 3, {0, 0, 0, 3, 4, 8, 0, 4, 0, 3, 5, 8}, {crc0, crc0});
  EXPECT_THAT(config_error_of([&] { (void)read_toy_wrong(w3.path, l, 8); }),
              HasSubstr("dataset " + qkv + ": checksum box 1 (offset [0, 4, 0], shape [3, 5, 8]) "
                        "lies outside [3, 8, 8]"));
  // latest passes over all three to the last intact file.
  const LatestCheckpoint latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, good.path);
  EXPECT_EQ(latest.skipped.size(), 3U);
}

// ---- atomicity, find_latest, keep_last ----

TEST(CheckpointAtomicity, InterruptedWriteLeavesPreviousCheckpointLoadable) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 2, .dp = 1, .tp = 2};
  const WriteResult good = write_toy(tmp.path(), 10, l, 3);
  WriteOptions crash;
  crash.before_rename = [](const std::string& tmp_path) {
    throw std::runtime_error("simulated crash before renaming " + tmp_path);
  };
  EXPECT_THROW((void)write_toy(tmp.path(), 20, l, 4, crash), std::runtime_error);
  const std::string tmp20 = tmp.path() + "/step-000020.h5.tmp";
  EXPECT_TRUE(fs::exists(tmp20));
  EXPECT_FALSE(fs::exists(tmp.path() + "/step-000020.h5"));

  const LatestCheckpoint latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, good.path);
  EXPECT_EQ(latest.step, 10);
  ASSERT_EQ(latest.skipped.size(), 1U);
  EXPECT_EQ(latest.skipped[0].path, tmp20);
  EXPECT_THAT(latest.skipped[0].reason, HasSubstr("interrupted write"));
  EXPECT_EQ(resolve_resume(world(), "latest", tmp.path()), good.path);
  EXPECT_EQ(read_toy_wrong(latest.path, l, 3), 0);
}

// Only atlas's own names count: a copy named step-0000005.h5 (another spelling of step 5) is not
// a checkpoint of step 5 that resume and pruning would tie with step-000005.h5.
// A rename that fails (a directory holds the checkpoint's name) says the data is whole in the
// .tmp and the earlier checkpoints are intact; the earlier one stays loadable.
TEST(CheckpointAtomicity, AFailedRenameSaysWhatIsWhole) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult good = write_toy(tmp.path(), 1, l, 3);
  if (world().rank() == 0) fs::create_directories(tmp.path() + "/step-000002.h5/x");
  world().barrier();
  std::string what = "<no error>";
  try {
    (void)write_toy(tmp.path(), 2, l, 3);
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_THAT(what, HasSubstr("cannot rename '" + tmp.path() + "/step-000002.h5.tmp' to '" + tmp.path() +
                              "/step-000002.h5'"));
  EXPECT_THAT(what, HasSubstr("hint: the checkpoint is whole in the .tmp"));
  EXPECT_EQ(read_toy_wrong(good.path, l, 3), 0);
}

// A .tmp name that is a symbolic link is refused, never written through (creating the .tmp
// truncates: through the link, another file).
TEST(CheckpointAtomicity, ALinkedTmpIsRefused) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const std::string victim = tmp.path() + "/victim.txt";
  if (world().rank() == 0) {
    std::ofstream(victim) << "keep me";
    fs::create_symlink(victim, tmp.path() + "/step-000003.h5.tmp");
  }
  world().barrier();
  std::string what = "<no error>";
  try {
    (void)write_toy(tmp.path(), 3, l, 3);
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_THAT(what, HasSubstr("checkpoint '" + tmp.path() + "/step-000003.h5.tmp' is a symbolic link: refused"));
  std::ifstream in(victim);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "keep me");
  EXPECT_FALSE(fs::exists(tmp.path() + "/step-000003.h5"));
}

TEST(CheckpointAtomicity, OnlyTheCanonicalNameIsACheckpoint) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 1};
  const WriteResult s5 = write_toy(tmp.path(), 5, l, 3);
  if (world().rank() == 0) fs::copy_file(s5.path, tmp.path() + "/step-0000007.h5");
  world().barrier();
  const LatestCheckpoint latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, s5.path);
  EXPECT_EQ(latest.step, 5);
  EXPECT_EQ(checkpoint_step_of(tmp.path() + "/step-0000007.h5"), std::nullopt);
  EXPECT_EQ(checkpoint_step_of(s5.path), 5);
  EXPECT_EQ(checkpoint_step_of(tmp.path() + "/step-1234567.h5"), 1234567);
}

TEST(CheckpointAtomicity, LatestFallsBackPastTruncatedAndCorruptFiles) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 2, .tp = 1};
  const WriteResult s1 = write_toy(tmp.path(), 1, l, 3);
  const WriteResult s2 = write_toy(tmp.path(), 2, l, 3);
  const WriteResult s3 = write_toy(tmp.path(), 3, l, 3);
  if (world().rank() == 0) {
    fs::resize_file(s3.path, s3.file_bytes - 100);  // lost its tail
    std::ofstream(s2.path, std::ios::trunc) << "garbage";  // overwritten by something else
    std::ofstream(tmp.path() + "/notes.txt") << "ignored";
  }
  world().barrier();
  const LatestCheckpoint latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, s1.path);
  ASSERT_EQ(latest.skipped.size(), 2U);
  EXPECT_EQ(latest.skipped[0].path, s3.path);
  EXPECT_THAT(latest.skipped[0].reason, HasSubstr("is truncated"));
  EXPECT_EQ(latest.skipped[1].path, s2.path);
  EXPECT_THAT(latest.skipped[1].reason, HasSubstr("is not an HDF5 file"));
  EXPECT_EQ(read_toy_wrong(latest.path, l, 3), 0);
  EXPECT_FALSE(find_latest(world(), tmp.path() + "/absent").found());
  EXPECT_EQ(resolve_resume(world(), "", tmp.path()), "");
}

// latest skips a file whose step attribute differs from its name (a copy renamed by hand: it
// would be found again on every fallback and resume at the wrong step) and a name whose step does
// not fit 64 bits; a /state entry that is not a vector is a damaged file (read into a buffer of
// its first dimension it overflowed the heap); and when the directory holds checkpoints but none
// can be read, latest refuses to start from step 0 over the run that is there.
TEST(CheckpointAtomicity, LatestSkipsMisnamedFilesAndNeverForksARunFromStepZero) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 2, .tp = 1};
  const WriteResult s1 = write_toy(tmp.path(), 1, l, 3);
  const WriteResult s2 = write_toy(tmp.path(), 2, l, 3);
  const std::string renamed = tmp.path() + "/step-000007.h5";
  const std::string huge = tmp.path() + "/step-99999999999999999999.h5";
  if (world().rank() == 0) {
    fs::copy_file(s2.path, renamed);
    std::ofstream(huge) << "x";
  }
  world().barrier();
  LatestCheckpoint latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, s2.path);
  ASSERT_EQ(latest.skipped.size(), 2U);
  EXPECT_EQ(latest.skipped[0].path, huge);
  EXPECT_THAT(latest.skipped[0].reason, HasSubstr("does not fit 64 bits"));
  EXPECT_EQ(latest.skipped[1].path, renamed);
  EXPECT_THAT(latest.skipped[1].reason, HasSubstr("its step attribute says step 2, its name step 7"));

  if (world().rank() == 0) {  // /state/dp0/loader rewritten as a [3, 2] array
    h5::File f = h5::open_file(s2.path, h5::Access::ReadWrite);
    ATLAS_H5_CHECK(H5Ldelete(f.get(), "/state/dp0/loader", H5P_DEFAULT));
    const hsize_t dims[2] = {3, 2};
    const hid_t space = ATLAS_H5_CHECK(H5Screate_simple(2, dims, nullptr));
    const hid_t d = ATLAS_H5_CHECK(
        H5Dcreate2(f.get(), "/state/dp0/loader", H5T_NATIVE_UINT64, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dclose(d);
    H5Sclose(space);
  }
  world().barrier();
  EXPECT_THAT(config_error_of([&] { (void)inspect_checkpoint(world(), s2.path); }),
              ::testing::AllOf(HasSubstr("checkpoint '" + s2.path + "' is corrupt or incomplete: "),
                               HasSubstr("dataset /state/dp0/loader has shape [3, 2]; atlas writes a vector")));
  latest = find_latest(world(), tmp.path());
  EXPECT_EQ(latest.path, s1.path);

  // Nothing readable left: an error, not a fresh start.
  if (world().rank() == 0) std::ofstream(s1.path, std::ios::trunc) << "garbage";
  world().barrier();
  auto shards = my_shards(world(), l, 3, false);
  const auto views = read_views(shards);
  const std::string m = config_error_of([&] { (void)resume_checkpoint(world(), "latest", tmp.path(), views); });
  EXPECT_THAT(m, HasSubstr("run.resume = latest: '" + tmp.path() + "' holds 4 checkpoint(s), and none can be read"));
  EXPECT_THAT(m, HasSubstr("hint: "));
}

TEST(CheckpointAtomicity, KeepLastPrunesOlderCheckpointsAndStaleTemporaries) {
  SharedTempDir tmp(world());
  const VLayout l{.pp = 1, .dp = 1, .tp = 2};
  WriteOptions opt;
  opt.keep_last = 2;
  if (world().rank() == 0) {
    fs::create_directories(tmp.path());
    std::ofstream(tmp.path() + "/step-000000.h5.tmp") << "left by a crash";
    // a name whose step does not fit 64 bits: no checkpoint of ours, left alone (it failed every save)
    std::ofstream(tmp.path() + "/step-99999999999999999999.h5") << "x";
  }
  world().barrier();
  std::vector<std::string> pruned;
  for (int step = 1; step <= 5; ++step) {
    const WriteResult w = write_toy(tmp.path(), step, l, 3, opt);
    pruned.insert(pruned.end(), w.pruned.begin(), w.pruned.end());
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path())) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-000004.h5", "step-000005.h5", "step-99999999999999999999.h5"}));
  std::sort(pruned.begin(), pruned.end());
  const std::string d = tmp.path() + "/";
  EXPECT_EQ(pruned, (std::vector<std::string>{d + "step-000000.h5.tmp", d + "step-000001.h5",
                                              d + "step-000002.h5", d + "step-000003.h5"}));
}

}  // namespace
}  // namespace atlas::io
