// SPDX-License-Identifier: MIT
// HDF5 C API wrappers: error-stack capture, file opens (serial and MPI-IO), attribute and small
// string-dataset helpers. Everything here either succeeds or throws atlas::Error (ExitCode::Io).
#include "atlas/io/hdf5.hpp"

#include <algorithm>
#include <sstream>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"

namespace atlas::h5 {

namespace {

thread_local std::string t_current_file;

struct WalkState {
  std::string text;
};

herr_t walk_cb(unsigned /*n*/, const H5E_error2_t* err, void* client) {
  auto* state = static_cast<WalkState*>(client);
  if (!state->text.empty()) state->text += "; ";
  state->text += err->func_name ? err->func_name : "?";
  state->text += "(): ";
  state->text += err->desc ? err->desc : "";
  // The minor message is the most specific cause ("truncated file", "file signature not found").
  char minor[256] = {};
  if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) > 0 && minor[0] != '\0') {
    state->text += " [";
    state->text += minor;
    state->text += "]";
  }
  return 0;
}

}  // namespace

void init() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

namespace {
// Silence HDF5's own stderr dumps as soon as this file is linked in, so even a raw C call made
// before any helper reports its failure only through ATLAS_H5_CHECK.
[[maybe_unused]] const bool g_silenced = (init(), true);
}  // namespace

std::string error_stack() {
  WalkState state;
  // Outermost call first, innermost cause last: reads like "X failed because Y because Z".
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &state);
  return state.text;
}

FileContext::FileContext(std::string path) : m_previous(std::move(t_current_file)) {
  t_current_file = std::move(path);
}

FileContext::~FileContext() { t_current_file = std::move(m_previous); }

const std::string& current_file() { return t_current_file; }

namespace detail {

void throw_h5_error(const char* call, const char* src_file, int src_line) {
  std::ostringstream os;
  os << "HDF5 call failed: " << call;
  if (!t_current_file.empty()) os << " [file '" << t_current_file << "']";
  const std::string stack = error_stack();
  os << ": " << (stack.empty() ? std::string("(HDF5 left no error stack)") : stack);
  H5Eclear2(H5E_DEFAULT);
  atlas::detail::throw_error(ExitCode::Io, os.str(), src_file, src_line);
}

void log_close_failure(hid_t id) noexcept {
  try {
    const std::string stack = error_stack();
    H5Eclear2(H5E_DEFAULT);
    log::warn("HDF5 failed to release identifier {}{}: {}", id,
              t_current_file.empty() ? std::string() : " of file '" + t_current_file + "'", stack);
  } catch (...) {
    // Logging must never throw out of a destructor.
  }
}

}  // namespace detail

// ---- files ----

PropList mpio_file_access(const mpi::Comm& comm) {
  init();
  PropList fapl(ATLAS_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  ATLAS_H5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm.get(), MPI_INFO_NULL));
  return fapl;
}

File create_file(const std::string& path, const mpi::Comm& comm) {
  FileContext ctx(path);
  PropList fapl = mpio_file_access(comm);
  return File(ATLAS_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get())));
}

File open_file(const std::string& path, Access access, const mpi::Comm& comm) {
  FileContext ctx(path);
  PropList fapl = mpio_file_access(comm);
  const unsigned flags = access == Access::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR;
  return File(ATLAS_H5_CHECK(H5Fopen(path.c_str(), flags, fapl.get())));
}

File create_file(const std::string& path) {
  init();
  FileContext ctx(path);
  return File(ATLAS_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
}

File open_file(const std::string& path, Access access) {
  init();
  FileContext ctx(path);
  const unsigned flags = access == Access::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR;
  return File(ATLAS_H5_CHECK(H5Fopen(path.c_str(), flags, H5P_DEFAULT)));
}

// ---- groups, links, spaces ----

Group create_group(hid_t loc, const std::string& name) {
  init();
  return Group(
      ATLAS_H5_CHECK(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

Group open_group(hid_t loc, const std::string& name) {
  init();
  return Group(ATLAS_H5_CHECK(H5Gopen2(loc, name.c_str(), H5P_DEFAULT)));
}

bool exists(hid_t loc, const std::string& path) {
  init();
  // H5Lexists fails (rather than answering false) when an intermediate component is missing, so
  // walk the path one component at a time.
  std::string prefix;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos
                                                                            : slash - start);
    if (!part.empty()) {
      prefix += (prefix.empty() ? "" : "/") + part;
      if (ATLAS_H5_CHECK(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

namespace {
herr_t collect_link(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_links(hid_t loc) {
  init();
  std::vector<std::string> names;
  hsize_t idx = 0;
  ATLAS_H5_CHECK(H5Literate(loc, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &names));
  return names;
}

Space simple_space(std::span<const hsize_t> dims) {
  init();
  if (dims.empty()) return Space(ATLAS_H5_CHECK(H5Screate(H5S_SCALAR)));
  return Space(ATLAS_H5_CHECK(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
}

std::vector<hsize_t> dataset_dims(hid_t dataset) {
  init();
  Space space(ATLAS_H5_CHECK(H5Dget_space(dataset)));
  const int rank = ATLAS_H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) ATLAS_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return dims;
}

// ---- attributes ----

namespace {

Attr create_attr(hid_t obj, const std::string& name, hid_t type, hid_t space) {
  init();
  return Attr(ATLAS_H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)));
}

Attr open_attr(hid_t obj, const std::string& name) {
  init();
  if (ATLAS_H5_CHECK(H5Aexists(obj, name.c_str())) <= 0) {
    std::string where = current_file().empty() ? "" : " in '" + current_file() + "'";
    ATLAS_THROW(Io, "HDF5 attribute '" << name << "' is missing" << where);
  }
  return Attr(ATLAS_H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
}

Type fixed_string_type(std::size_t len) {
  Type t(ATLAS_H5_CHECK(H5Tcopy(H5T_C_S1)));
  // HDF5 rejects zero-size strings; an empty string is stored as one NUL byte.
  ATLAS_H5_CHECK(H5Tset_size(t.get(), std::max<std::size_t>(len, 1)));
  ATLAS_H5_CHECK(H5Tset_strpad(t.get(), H5T_STR_NULLPAD));
  ATLAS_H5_CHECK(H5Tset_cset(t.get(), H5T_CSET_ASCII));
  return t;
}

std::string read_string_from(hid_t obj, bool is_attr) {
  Type file_type(ATLAS_H5_CHECK(is_attr ? H5Aget_type(obj) : H5Dget_type(obj)));
  if (H5Tget_class(file_type.get()) != H5T_STRING) {
    ATLAS_THROW(Io, "HDF5 object holds a non-string type where a string was expected"
                        << (current_file().empty() ? "" : " in '" + current_file() + "'"));
  }
  if (ATLAS_H5_CHECK(H5Tis_variable_str(file_type.get())) > 0) {
    Type mem(ATLAS_H5_CHECK(H5Tcopy(H5T_C_S1)));
    ATLAS_H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    char* buf = nullptr;
    ATLAS_H5_CHECK(is_attr ? H5Aread(obj, mem.get(), &buf)
                           : H5Dread(obj, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &buf));
    std::string out = buf ? buf : "";
    H5free_memory(buf);
    return out;
  }
  const std::size_t size = H5Tget_size(file_type.get());
  std::string out(size, '\0');
  Type mem = fixed_string_type(size);
  ATLAS_H5_CHECK(is_attr ? H5Aread(obj, mem.get(), out.data())
                         : H5Dread(obj, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
  if (const auto nul = out.find('\0'); nul != std::string::npos) out.resize(nul);
  return out;
}

}  // namespace

void write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  Space space = simple_space({});
  Attr a = create_attr(obj, name, H5T_STD_I64LE, space.get());
  ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &value));
}

void write_attr(hid_t obj, const std::string& name, std::span<const std::int64_t> values) {
  const hsize_t n = values.size();
  Space space = n == 0 ? Space(ATLAS_H5_CHECK(H5Screate(H5S_NULL))) : simple_space({&n, 1});
  Attr a = create_attr(obj, name, H5T_STD_I64LE, space.get());
  if (n > 0) ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, values.data()));
}

void write_attr(hid_t obj, const std::string& name, std::span<const std::int64_t> values,
                std::span<const hsize_t> dims) {
  hsize_t n = 1;
  for (auto d : dims) n *= d;
  ATLAS_ASSERT(n == values.size(), "attribute '" << name << "': " << values.size()
                                                 << " values for " << n << " elements");
  Space space = simple_space(dims);
  Attr a = create_attr(obj, name, H5T_STD_I64LE, space.get());
  if (n > 0) ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, values.data()));
}

void write_attr(hid_t obj, const std::string& name, std::span<const std::uint32_t> values) {
  const hsize_t n = values.size();
  Space space = n == 0 ? Space(ATLAS_H5_CHECK(H5Screate(H5S_NULL))) : simple_space({&n, 1});
  Attr a = create_attr(obj, name, H5T_STD_U32LE, space.get());
  if (n > 0) ATLAS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_UINT32, values.data()));
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Type t = fixed_string_type(value.size());
  Space space = simple_space({});
  Attr a = create_attr(obj, name, t.get(), space.get());
  std::string buf = value;
  buf.resize(std::max<std::size_t>(value.size(), 1), '\0');
  ATLAS_H5_CHECK(H5Awrite(a.get(), t.get(), buf.data()));
}

bool has_attr(hid_t obj, const std::string& name) {
  init();
  return ATLAS_H5_CHECK(H5Aexists(obj, name.c_str())) > 0;
}

std::int64_t read_attr_int(hid_t obj, const std::string& name) {
  const auto values = read_attr_ints(obj, name);
  if (values.size() != 1) {
    ATLAS_THROW(Io, "HDF5 attribute '" << name << "' holds " << values.size()
                                       << " values where one integer was expected");
  }
  return values[0];
}

std::vector<std::int64_t> read_attr_ints(hid_t obj, const std::string& name) {
  Attr a = open_attr(obj, name);
  Type t(ATLAS_H5_CHECK(H5Aget_type(a.get())));
  if (H5Tget_class(t.get()) != H5T_INTEGER) {
    ATLAS_THROW(Io, "HDF5 attribute '" << name << "' is not an integer"
                                       << (current_file().empty() ? "" : " in '" + current_file() + "'"));
  }
  Space space(ATLAS_H5_CHECK(H5Aget_space(a.get())));
  const hssize_t n = ATLAS_H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  if (n > 0) ATLAS_H5_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, out.data()));
  return out;
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  Attr a = open_attr(obj, name);
  return read_string_from(a.get(), /*is_attr=*/true);
}

// ---- small string datasets ----

void write_string_dataset(hid_t loc, const std::string& name, const std::string& text,
                          bool write_data) {
  init();
  Type t = fixed_string_type(text.size());
  Space space = simple_space({});
  Dataset d(ATLAS_H5_CHECK(
      H5Dcreate2(loc, name.c_str(), t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (!write_data) return;
  std::string buf = text;
  buf.resize(std::max<std::size_t>(text.size(), 1), '\0');
  ATLAS_H5_CHECK(H5Dwrite(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
}

std::string read_string_dataset(hid_t loc, const std::string& name) {
  init();
  Dataset d(ATLAS_H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  return read_string_from(d.get(), /*is_attr=*/false);
}

}  // namespace atlas::h5
