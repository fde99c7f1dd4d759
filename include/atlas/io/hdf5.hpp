// SPDX-License-Identifier: MIT
// RAII handles over the HDF5 *C* API (HDF5's C++ API is unsupported with parallel HDF5) and the
// ATLAS_H5_CHECK macro that turns a negative return into atlas::Error (ExitCode::Io) carrying the
// call text, HDF5's error stack and the file name. Small typed helpers for attributes and spaces.
// Not for checkpoint logic: that lives in checkpoint.hpp.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::h5 {

/// Turns HDF5's automatic error printing off for the process (H5Eset_auto2), so failures reach
/// the caller only through ATLAS_H5_CHECK. Runs at static initialisation of this library; also
/// idempotent and cheap to call again (every helper here does).
void init();

/// The current HDF5 error stack of this thread as one line ("H5Fopen(): unable to open file;
/// H5F_open(): truncated file: eof = 10, ..."), innermost cause last. "" when the stack is empty.
[[nodiscard]] std::string error_stack();

/// While alive, ATLAS_H5_CHECK failures on this thread name `path` as the file involved. Nests
/// (the innermost wins). Not copyable; create it on the stack around work on one file.
class FileContext {
 public:
  explicit FileContext(std::string path);
  ~FileContext();
  FileContext(const FileContext&) = delete;
  FileContext& operator=(const FileContext&) = delete;

 private:
  std::string m_previous;
};

/// The path named by the innermost live FileContext on this thread ("" if none).
[[nodiscard]] const std::string& current_file();

namespace detail {
/// Throws atlas::Error(ExitCode::Io): "HDF5 call failed: <call> [file '<path>']: <error stack>".
[[noreturn]] void throw_h5_error(const char* call, const char* src_file, int src_line);

template <class T>
T check(T rc, const char* call, const char* src_file, int src_line) {
  static_assert(std::is_signed_v<T>, "ATLAS_H5_CHECK needs a call returning herr_t/hid_t/htri_t");
  if (rc < 0) throw_h5_error(call, src_file, src_line);
  return rc;
}
}  // namespace detail

}  // namespace atlas::h5

/// Evaluates an HDF5 C call; a negative result throws atlas::Error (ExitCode::Io) naming the call,
/// the HDF5 error stack (walked with H5Ewalk2) and the current FileContext path. Yields the call's
/// value, so `h5::File f(ATLAS_H5_CHECK(H5Fopen(...)));` works.
#define ATLAS_H5_CHECK(call) ::atlas::h5::detail::check((call), #call, __FILE__, __LINE__)

namespace atlas::h5 {

/// A move-only owner of one HDF5 identifier, released with `Close`. get() gives the raw hid_t for
/// C calls (still owned here). The destructor never throws: a failed release is logged.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  /// Adopts `id`, which must be valid (wrap the creating call in ATLAS_H5_CHECK).
  explicit Handle(hid_t id) : m_id(id) {
    if (id < 0) detail::throw_h5_error("Handle(<invalid id>)", __FILE__, __LINE__);
  }
  Handle(Handle&& o) noexcept : m_id(std::exchange(o.m_id, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      m_id = std::exchange(o.m_id, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  [[nodiscard]] hid_t get() const noexcept { return m_id; }
  [[nodiscard]] bool valid() const noexcept { return m_id >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  /// Releases now and throws atlas::Error if HDF5 reports a failure. Use it where the release
  /// does real work whose failure matters (closing a file flushes it). Collective exactly when
  /// the release is (H5Fclose of a file opened with MPI-IO is collective over its communicator).
  void close() {
    if (m_id < 0) return;
    const hid_t id = std::exchange(m_id, H5I_INVALID_HID);
    ATLAS_H5_CHECK(Close(id));
  }

  /// Gives up ownership without releasing: the identifier stays open. For one case only: a
  /// local failure inside collective work on an MPI-IO file, where closing it would be a
  /// collective call that the other ranks may never join (a hang instead of an abort).
  [[nodiscard]] hid_t release() noexcept { return std::exchange(m_id, H5I_INVALID_HID); }

 private:
  void reset() noexcept;
  hid_t m_id = H5I_INVALID_HID;
};

namespace detail {
void log_close_failure(hid_t id) noexcept;
}  // namespace detail

template <herr_t (*Close)(hid_t)>
void Handle<Close>::reset() noexcept {
  if (m_id >= 0 && Close(m_id) < 0) detail::log_close_failure(m_id);
  m_id = H5I_INVALID_HID;
}

using File = Handle<H5Fclose>;       ///< H5Fcreate / H5Fopen
using Group = Handle<H5Gclose>;      ///< H5Gcreate2 / H5Gopen2
using Dataset = Handle<H5Dclose>;    ///< H5Dcreate2 / H5Dopen2
using Space = Handle<H5Sclose>;      ///< H5Screate* / H5Dget_space / H5Aget_space
using PropList = Handle<H5Pclose>;   ///< H5Pcreate / H5Dget_create_plist
using Attr = Handle<H5Aclose>;       ///< H5Acreate2 / H5Aopen
/// Only types this process made (H5Tcopy, H5Tcreate, H5Dget_type); never a predefined type such
/// as H5T_NATIVE_FLOAT, which must not be closed.
using Type = Handle<H5Tclose>;

/// The native HDF5 type of a C++ column element (int32, int64, float, double).
template <class T>
[[nodiscard]] hid_t native_type() {
  if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  else if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  else static_assert(sizeof(T) == 0, "native_type: int32, int64, float or double");
}

// ---- files ----

enum class Access { ReadOnly, ReadWrite };

/// File-access property list for the MPI-IO driver on `comm` (HDF5 duplicates the communicator).
/// Not collective itself; the opens that use it are.
[[nodiscard]] PropList mpio_file_access(const mpi::Comm& comm);
/// Creates (truncating) `path` with MPI-IO. **Collective over `comm`**: every rank calls it with
/// the same path, and every later metadata change (groups, datasets, attributes) must be made by
/// every rank of `comm` with identical arguments, in the same order.
[[nodiscard]] File create_file(const std::string& path, const mpi::Comm& comm);
/// Opens `path` with MPI-IO. **Collective over `comm`** (same path on every rank).
[[nodiscard]] File open_file(const std::string& path, Access access, const mpi::Comm& comm);
/// Serial (POSIX driver) create/open for one process; not collective. Throws atlas::Error.
[[nodiscard]] File create_file(const std::string& path);
[[nodiscard]] File open_file(const std::string& path, Access access);

// ---- groups, links, spaces ----

[[nodiscard]] Group create_group(hid_t loc, const std::string& name);
[[nodiscard]] Group open_group(hid_t loc, const std::string& name);
/// True when every component of the '/'-separated `path` exists below `loc`.
[[nodiscard]] bool exists(hid_t loc, const std::string& path);
/// Names of the links directly inside the group `loc`, in name order.
[[nodiscard]] std::vector<std::string> list_links(hid_t loc);
/// A simple dataspace of `dims` (elements). An empty `dims` gives a scalar space.
[[nodiscard]] Space simple_space(std::span<const hsize_t> dims);
/// Extent of a dataset's (or a dataspace's) dataspace, in elements per dimension.
[[nodiscard]] std::vector<hsize_t> dataset_dims(hid_t dataset);

// ---- attributes (metadata: in a file opened with MPI-IO, every rank writes the same value) ----

void write_attr(hid_t obj, const std::string& name, std::int64_t value);
void write_attr(hid_t obj, const std::string& name, std::span<const std::int64_t> values);
/// A row-major int64 array attribute of shape `dims` (H5T_STD_I64LE); values.size() must be
/// the product of `dims`.
void write_attr(hid_t obj, const std::string& name, std::span<const std::int64_t> values,
                std::span<const hsize_t> dims);
/// A one-dimensional uint32 array attribute (H5T_STD_U32LE), e.g. checksums.
void write_attr(hid_t obj, const std::string& name, std::span<const std::uint32_t> values);
/// Fixed-length (NUL-padded) ASCII string attribute; h5py reads it as bytes or str.
void write_attr(hid_t obj, const std::string& name, const std::string& value);
[[nodiscard]] bool has_attr(hid_t obj, const std::string& name);
/// Reads an integer attribute (any stored integer width). Throws atlas::Error if absent.
[[nodiscard]] std::int64_t read_attr_int(hid_t obj, const std::string& name);
[[nodiscard]] std::vector<std::int64_t> read_attr_ints(hid_t obj, const std::string& name);
/// Reads a fixed- or variable-length string attribute.
[[nodiscard]] std::string read_attr_string(hid_t obj, const std::string& name);

// ---- small string datasets ----

/// Creates a scalar fixed-length string dataset `name` under `loc` holding `text`. In a file
/// opened with MPI-IO the create is collective (every rank, same text); the data is written only
/// by the rank passing `write_data = true` (independent transfer).
void write_string_dataset(hid_t loc, const std::string& name, const std::string& text,
                          bool write_data);
[[nodiscard]] std::string read_string_dataset(hid_t loc, const std::string& name);

}  // namespace atlas::h5
