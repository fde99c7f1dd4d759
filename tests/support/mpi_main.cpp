// SPDX-License-Identifier: MIT
// gtest main for MPI tests: MPI_Init, forward failures from non-root ranks to stdout with a
// [rank N] prefix, agree on the result with an MPI_Allreduce MAX, finalize.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "atlas/core/log.hpp"

namespace {

class RankPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankPrinter(int rank) : m_rank(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stdout, "[rank %d] %s:%d: Failure\n%s\n", m_rank,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    std::fflush(stdout);
  }

 private:
  int m_rank;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  atlas::log::init(rank, "test");
  atlas::log::set_quiet(true);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankPrinter(rank));
  }
  int result = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&result, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return global;
}
