// SPDX-License-Identifier: MIT
// The safetensors format (huggingface/safetensors): u64 little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the
// data area, offsets relative to its start. A small JSON reader of its own (no library), strict
// checks on every number of the header before any byte of data is used.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/io/hf.hpp"
#include "hf_json.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace atlas::io {

namespace {

/// The safetensors reference implementation refuses headers above 100 MB; atlas reads GPT-2
/// models only, whose header is about 1 KB per layer (4 MB at model.layers' limit of 4096), and
/// keeps the memory a hostile header can cost (the JSON values it parses) small.
constexpr std::uint64_t kMaxHeaderBytes = 16ull << 20;

const char* const kFix =
    "hint: the file is damaged or was not written as safetensors; write it again (atlas export "
    "--format hf, or transformers' save_pretrained(..., safe_serialization=True))";

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw ConfigError(fmt::format("safetensors file '{}': {}\n  {}", path, what, kFix));
}

/// Bytes per element of every safetensors dtype; 0 for the ones atlas does not read.
int read_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

/// Bytes per element of a known safetensors dtype.
int storage_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;  // BOOL, U8, I8, F8_E5M2, F8_E4M3
}

bool known_dtype(const std::string& d) {
  static const std::set<std::string> k{"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16",
                                       "U16",  "F16", "BF16", "I32",    "U32",     "F32",
                                       "F64",  "I64", "U64"};
  return k.count(d) > 0;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h >> 15) & 1U;
  const std::uint32_t exp = (h >> 10) & 0x1FU;
  const std::uint32_t man = h & 0x3FFU;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man == 0 ? INFINITY : NAN;
  else v = std::ldexp(static_cast<float>(man | 0x400U), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (c < 0x20) o += fmt::format("\\u{:04x}", c);
    else o += ch;
  }
  return o + "\"";
}

}  // namespace

std::string safetensors_bytes(const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    h += fmt::format("{}{}:{}", first ? "" : ",", json_str(k), json_str(v));
    first = false;
  }
  h += "}";
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    ATLAS_ASSERT(n == static_cast<std::int64_t>(t.data.size()), "tensor " << t.name << " holds "
                 << t.data.size() << " floats, its shape says " << n);
    const std::uint64_t end = off + 4 * static_cast<std::uint64_t>(n);
    h += fmt::format(",{}:{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                     json_str(t.name), fmt::join(t.shape, ","), off, end);
    off = end;
  }
  h += "}";
  while (h.size() % 8 != 0) h += ' ';
  std::string bytes(8, '\0');
  const std::uint64_t hlen = h.size();
  std::memcpy(bytes.data(), &hlen, 8);
  bytes.reserve(8 + h.size() + off);
  bytes += h;
  for (const auto& t : tensors)
    bytes.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
  return bytes;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_whole(path, safetensors_bytes(tensors, metadata), true);
}

SafeTensorsFile read_safetensors(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw ConfigError(fmt::format(
        "safetensors file '{}' does not exist\n  hint: the directory must hold model.safetensors "
        "(atlas export --format hf, or transformers' save_pretrained with safe_serialization=True; "
        "a pytorch_model.bin must be converted first)", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot be opened");
  const auto size = static_cast<std::uint64_t>(fs::file_size(path, ec));
  if (ec) bad(path, "cannot read its size: " + ec.message());
  if (size < 8) bad(path, fmt::format("the file has {} bytes, less than the 8-byte header length", size));
  std::uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  if (hlen > kMaxHeaderBytes)
    bad(path, fmt::format("header length {} is above atlas's limit of {} bytes (a GPT-2 header is about 1 KB per layer)",
                          hlen, kMaxHeaderBytes));
  if (hlen > size - 8)
    bad(path, fmt::format("header length {} runs past the end of the file ({} bytes)", hlen, size));
  std::string header(hlen, '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  if (!in) bad(path, "cannot read the header");
  if (header.empty() || header[0] != '{') bad(path, "the header does not start with '{' (not a JSON object)");

  json::Value root;
  try {
    root = json::parse(header);
  } catch (const json::ParseError& e) {
    bad(path, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (!root.is_object()) bad(path, "the header is not a JSON object");

  SafeTensorsFile out;
  struct Range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  std::set<std::string> seen;
  for (const auto& [name, v] : root.obj) {
    if (!seen.insert(name).second) bad(path, fmt::format("tensor '{}' appears twice in the header", name));
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not a JSON object");
      for (const auto& [k, s] : v.obj) {
        if (!s.is_string()) bad(path, fmt::format("__metadata__ value of '{}' is not a string", k));
        out.metadata[k] = s.str;
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!v.is_object()) bad(path, where + " is not a JSON object");
    const json::Value* dt = v.find("dtype");
    const json::Value* sh = v.find("shape");
    const json::Value* of = v.find("data_offsets");
    if (!dt || !dt->is_string()) bad(path, where + ": no string \"dtype\"");
    if (!sh || !sh->is_array()) bad(path, where + ": no array \"shape\"");
    if (!of || !of->is_array() || of->arr.size() != 2) bad(path, where + ": \"data_offsets\" is not [begin, end]");
    SafeTensor t;
    t.name = name;
    t.dtype = dt->str;
    if (!known_dtype(t.dtype))
      bad(path, fmt::format("{}: unknown dtype '{}' (safetensors dtypes: BOOL U8 I8 F8_E5M2 F8_E4M3 "
                            "I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64)", where, t.dtype));
    // Another dtype's bytes are checked below but not read: a reader refuses the tensor if it
    // needs it (SafeTensor::loaded).
    const int esize = storage_size(t.dtype);
    t.loaded = read_size(t.dtype) != 0;
    std::uint64_t numel = 1;
    for (const auto& d : sh->arr) {
      std::uint64_t x = 0;
      if (!d.as_u64(x)) bad(path, where + ": a shape entry is not a non-negative integer");
      if (x != 0 && numel > (std::uint64_t{1} << 50) / x) bad(path, where + ": the shape is too large");
      numel *= x;
      t.shape.push_back(static_cast<std::int64_t>(x));
    }
    std::uint64_t b = 0, e = 0;
    if (!of->arr[0].as_u64(b) || !of->arr[1].as_u64(e))
      bad(path, where + ": data_offsets are not non-negative integers");
    if (e < b) bad(path, fmt::format("{}: data_offsets [{}, {}] end before they begin", where, b, e));
    if (e - b != numel * static_cast<std::uint64_t>(esize))
      bad(path, fmt::format("{}: data_offsets [{}, {}] hold {} bytes, but {} {} of shape [{}] take {}",
                            where, b, e, e - b, numel, t.dtype, fmt::join(t.shape, ", "),
                            numel * static_cast<std::uint64_t>(esize)));
    ranges.push_back({b, e, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }

  // The ranges must tile the data area: sorted by begin, each starts where the previous ended.
  const std::uint64_t data_bytes = size - 8 - hlen;
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& r : ranges) {
    const std::string& name = out.tensors[r.index].name;
    if (r.begin < at)
      bad(path, fmt::format("tensor '{}' (bytes [{}, {})) overlaps the tensor before it (which ends at {})",
                            name, r.begin, r.end, at));
    if (r.begin > at)
      bad(path, fmt::format("bytes [{}, {}) of the data area belong to no tensor (a hole before '{}')",
                            at, r.begin, name));
    at = r.end;
  }
  if (at > data_bytes)
    bad(path, fmt::format("the file is truncated: the tensors need {} bytes of data, the file holds {}",
                          at, data_bytes));
  if (at < data_bytes)
    bad(path, fmt::format("{} bytes after the last tensor belong to no tensor", data_bytes - at));

  // Data, in file order.
  std::vector<SafeTensor> ordered;
  ordered.reserve(out.tensors.size());
  std::vector<char> raw;
  for (const auto& r : ranges) {
    SafeTensor t = std::move(out.tensors[r.index]);
    if (!t.loaded) {
      ordered.push_back(std::move(t));
      continue;
    }
    raw.resize(r.end - r.begin);
    in.seekg(static_cast<std::streamoff>(8 + hlen + r.begin));
    in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    if (!in) bad(path, fmt::format("cannot read the data of tensor '{}'", t.name));
    const std::size_t n = raw.size() / static_cast<std::size_t>(read_size(t.dtype));
    t.data.resize(n);
    if (t.dtype == "F32") {
      std::memcpy(t.data.data(), raw.data(), raw.size());
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t w = 0;
        std::memcpy(&w, raw.data() + 2 * i, 2);
        t.data[i] = t.dtype == "BF16" ? std::bit_cast<float>(static_cast<std::uint32_t>(w) << 16)
                                      : half_to_float(w);
      }
    }
    ordered.push_back(std::move(t));
  }
  out.tensors = std::move(ordered);
  return out;
}

}  // namespace atlas::io
