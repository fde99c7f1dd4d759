// SPDX-License-Identifier: MIT
// Test helper: damage one bit of one HDF5 dataset through the HDF5 C API (read the dataset,
// flip the bit, H5Dwrite it back), so the file stays valid HDF5 and only the data differs, as
// bit rot or a stray write would leave it. Serial; call it on one rank while no job has the
// file open.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/io/hdf5.hpp"

namespace atlas::test_support {

/// Flips bit `bit` (0 = lowest) of byte `byte` of dataset `dataset` (e.g. "/state/adam_t") in
/// the HDF5 file `path`. Byte order is the file's little-endian element order, so for element
/// i of a float32 dataset, byte 4 * i + 3 holds its sign bit.
inline void flip_bit(const std::string& path, const std::string& dataset, std::size_t byte,
                     int bit) {
  h5::File f = h5::open_file(path, h5::Access::ReadWrite);
  h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT)));
  h5::Type stored(ATLAS_H5_CHECK(H5Dget_type(d.get())));
  h5::Type native(ATLAS_H5_CHECK(H5Tget_native_type(stored.get(), H5T_DIR_ASCEND)));
  std::size_t n = 1;
  for (auto x : h5::dataset_dims(d.get())) n *= x;
  std::vector<unsigned char> bytes(n * H5Tget_size(native.get()));
  ATLAS_H5_CHECK(H5Dread(d.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
  ATLAS_ASSERT(byte < bytes.size(), "flip_bit: byte " << byte << " past the " << bytes.size()
                                                      << " bytes of " << dataset);
  bytes[byte] ^= static_cast<unsigned char>(1U << bit);
  ATLAS_H5_CHECK(H5Dwrite(d.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
}

}  // namespace atlas::test_support
