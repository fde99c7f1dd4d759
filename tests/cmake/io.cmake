# SPDX-License-Identifier: MIT
# io/ tests: HDF5 wrappers (unit), checkpoint write/read/reshard/atomicity (MPI), and the
# documented h5py snippet / h5dump (MPI np 1, needs /usr/bin/python3 with h5py, else skips).
atlas_unit_test(test_io_hdf5 unit/test_io_hdf5.cpp)
set_tests_properties(test_io_hdf5 PROPERTIES TIMEOUT 30)

atlas_mpi_test(test_io_checkpoint SOURCES mpi/test_io_checkpoint.cpp NP 1 2 4 TIMEOUT 90)

atlas_mpi_test(test_io_formats SOURCES mpi/test_io_formats.cpp NP 1 TIMEOUT 60)

atlas_mpi_test(test_io_bench SOURCES mpi/test_io_bench.cpp NP 1 2 TIMEOUT 60)
