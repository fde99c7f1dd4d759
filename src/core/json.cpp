// SPDX-License-Identifier: MIT
#include "atlas/core/json.hpp"

#include <cmath>

#include <fmt/format.h>

namespace atlas::json {

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      out += ch;
    }
  }
  return out;
}

std::string number(double v, int decimals) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : std::string("null");
}

}  // namespace atlas::json
