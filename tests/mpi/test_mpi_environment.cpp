// SPDX-License-Identifier: MIT
// mpi::Environment when it starts MPI itself (its own main, not support/mpi_main.cpp): reading
// Open MPI's btl_tcp_flags back through the MPI tool interface keeps the thread level atlas asked
// for (Open MPI's MPI_T_init_thread resets it to the level it is given; a SINGLE there turned a
// MULTIPLE job's locking and Boundary's progress thread off), and put is off where atlas set the
// variable (docs/wan.md, "Open MPI's put protocol").
#include <mpi.h>

#include <gtest/gtest.h>

#include <string>

#include "atlas/mpi/comm.hpp"

namespace {

TEST(MpiEnvironment, TheThreadLevelIsStillMultipleAfterTheReadBack) {
  int level = MPI_THREAD_SINGLE;
  ASSERT_EQ(MPI_Query_thread(&level), MPI_SUCCESS);
  EXPECT_EQ(level, MPI_THREAD_MULTIPLE);
}

TEST(MpiEnvironment, PutIsOffWhereAtlasSetTheFlags) {
#if defined(OPEN_MPI) && (OMPI_MAJOR_VERSION == 4 || OMPI_MAJOR_VERSION == 5)
  const std::string note = atlas::mpi::Environment::tcp_protocol_note();
  ASSERT_TRUE(atlas::mpi::Environment::tcp_put_protocol().has_value()) << "btl_tcp_flags not read back";
  if (note.find("atlas's default") == std::string::npos) GTEST_SKIP() << "the flags are the user's: " << note;
  EXPECT_FALSE(*atlas::mpi::Environment::tcp_put_protocol()) << note;
  EXPECT_EQ(note.rfind("# Open MPI's TCP transport: put protocol off (OMPI_MCA_btl_tcp_flags=", 0), 0u) << note;
#else
  GTEST_SKIP() << "not Open MPI 4 or 5";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  atlas::mpi::Environment env(argc, argv, atlas::mpi::ThreadLevel::Multiple);
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
