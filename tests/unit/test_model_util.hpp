// SPDX-License-Identifier: MIT
// Helpers shared by the model/device tests: host<->Buffer transfers, seeded test data, hyperslab
// extraction of a shard from a full tensor, and a tolerance check that reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::testutil {

inline device::Buffer upload(device::Backend& be, const std::vector<float>& host) {
  device::Buffer b = be.alloc_floats(host.size());
  be.upload(b.data(), host.data(), host.size() * sizeof(float));
  return b;
}

inline device::Buffer upload_ids(device::Backend& be, const std::vector<std::int32_t>& host) {
  device::Buffer b = be.alloc(host.size() * sizeof(std::int32_t));
  be.upload(b.data(), host.data(), host.size() * sizeof(std::int32_t));
  return b;
}

inline std::vector<float> download(device::Backend& be, const device::Buffer& b) {
  std::vector<float> host(b.floats());
  be.download(host.data(), b.data(), host.size() * sizeof(float));
  return host;
}

/// n values uniform in [lo, hi), a pure function of (seed, i).
inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed, float lo = -1.0F,
                                     float hi = 1.0F) {
  std::vector<float> v(n);
  const std::uint64_t key = model::rng::key(seed, "test");
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = lo + (hi - lo) * static_cast<float>(model::rng::uniform(key, i));
  }
  return v;
}

/// The elements of `full` (a row-major tensor of p.full_shape) that p's shard holds, in shard
/// order.
inline std::vector<float> hyperslab(const std::vector<float>& full, const model::ParamTensor& p) {
  std::vector<float> out;
  const std::size_t dims = p.full_shape.size();
  std::vector<std::int64_t> idx(dims, 0);
  const auto n = static_cast<std::size_t>(p.shard_numel());
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < dims; ++d)
      flat = flat * p.full_shape[d] + p.shard_offset[d] + idx[d];
    out.push_back(full[static_cast<std::size_t>(flat)]);
    for (std::size_t d = dims; d-- > 0;) {
      if (++idx[d] < p.shard_shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// Max-norm relative difference: max|a - b| / max|b| (0 when both are all zero).
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0;
  double scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0.0 ? diff : diff / scale;
}

/// Checks |got - want| <= atol + rtol * |want| element-wise; reports the first few failures.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::abs(want[i]);
    if (std::abs(got[i] - want[i]) > tol && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

}  // namespace atlas::testutil
