// SPDX-License-Identifier: MIT
// A small strict JSON reader for the safetensors header and config.json (RFC 8259: objects,
// arrays, strings with escapes, numbers, true, false, null). Objects keep their members in file
// order, duplicates included, so callers can refuse them. Not a general-purpose library.
#pragma once

#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace atlas::io::json {

struct ParseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool b = false;
  std::string num;  ///< the number's text, as written
  std::string str;
  std::vector<Value> arr;
  std::vector<std::pair<std::string, Value>> obj;

  [[nodiscard]] bool is_object() const { return kind == Kind::Object; }
  [[nodiscard]] bool is_array() const { return kind == Kind::Array; }
  [[nodiscard]] bool is_string() const { return kind == Kind::String; }
  [[nodiscard]] bool is_number() const { return kind == Kind::Number; }
  [[nodiscard]] bool is_null() const { return kind == Kind::Null; }
  [[nodiscard]] bool is_bool() const { return kind == Kind::Bool; }
  /// The first member named `key`, or nullptr.
  [[nodiscard]] const Value* find(const std::string& key) const {
    for (const auto& [k, v] : obj)
      if (k == key) return &v;
    return nullptr;
  }
  /// A non-negative integer written without fraction or exponent, up to 2^64 - 1.
  [[nodiscard]] bool as_u64(std::uint64_t& out) const {
    if (kind != Kind::Number || num.empty() || num.find_first_not_of("0123456789") != std::string::npos)
      return false;
    if (num.size() > 20) return false;
    errno = 0;
    char* end = nullptr;
    out = std::strtoull(num.c_str(), &end, 10);
    return errno == 0 && *end == '\0';
  }
  [[nodiscard]] double as_double() const { return std::strtod(num.c_str(), nullptr); }
  /// How the value reads in a message: a number as written, a string quoted, else its kind.
  [[nodiscard]] std::string describe() const {
    switch (kind) {
      case Kind::Number: return num;
      case Kind::String: return "the string \"" + str + "\"";
      case Kind::Bool: return b ? "true" : "false";
      case Kind::Null: return "null";
      case Kind::Array: return "an array";
      case Kind::Object: return "an object";
    }
    return "?";
  }
};

class Parser {
 public:
  /// At most one value per 4 bytes of text (a safetensors header has about one per 10): each
  /// parsed value costs about 120 bytes, so a flood of tiny values ("[0,0,0,...]") would cost
  /// 60 times its text in memory before any check could refuse it.
  explicit Parser(const std::string& text) : m_s(text), m_max_values(64 + text.size() / 4) {}
  Value document() {
    Value v = value(0);
    ws();
    if (m_i != m_s.size()) fail("unexpected text after the end of the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError(what + " at byte " + std::to_string(m_i));
  }
  void ws() {
    while (m_i < m_s.size() && (m_s[m_i] == ' ' || m_s[m_i] == '\t' || m_s[m_i] == '\n' || m_s[m_i] == '\r')) ++m_i;
  }
  bool eat(char c) {
    ws();
    if (m_i < m_s.size() && m_s[m_i] == c) {
      ++m_i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const std::string s(w);
    if (m_s.compare(m_i, s.size(), s) == 0) {
      m_i += s.size();
      return true;
    }
    return false;
  }
  static void utf8(std::string& o, std::uint32_t cp) {
    if (cp < 0x80) {
      o += static_cast<char>(cp);
    } else if (cp < 0x800) {
      o += static_cast<char>(0xC0 | (cp >> 6));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += static_cast<char>(0xE0 | (cp >> 12));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (cp >> 18));
      o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::uint32_t hex4() {
    if (m_i + 4 > m_s.size()) fail("short \\u escape");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = m_s[m_i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string o;
    while (true) {
      if (m_i >= m_s.size()) fail("unterminated string");
      const char c = m_s[m_i++];
      if (c == '"') return o;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        o += c;
        continue;
      }
      if (m_i >= m_s.size()) fail("unterminated escape");
      const char e = m_s[m_i++];
      switch (e) {
        case '"': o += '"'; break;
        case '\\': o += '\\'; break;
        case '/': o += '/'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && m_s.compare(m_i, 2, "\\u") == 0) {
            m_i += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(o, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  Value value(int depth) {
    if (depth > 64) fail("nesting too deep");
    if (++m_values > m_max_values)
      fail("more values than a header of " + std::to_string(m_s.size()) + " bytes holds (at most one per 4 bytes)");
    ws();
    if (m_i >= m_s.size()) fail("unexpected end");
    Value v;
    const char c = m_s[m_i];
    if (c == '{') {
      ++m_i;
      v.kind = Value::Kind::Object;
      if (eat('}')) return v;
      do {
        ws();
        std::string k = string();
        expect(':');
        Value x = value(depth + 1);
        v.obj.emplace_back(std::move(k), std::move(x));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++m_i;
      v.kind = Value::Kind::Array;
      if (eat(']')) return v;
      do v.arr.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.str = string();
    } else if (word("true")) {
      v.kind = Value::Kind::Bool;
      v.b = true;
    } else if (word("false")) {
      v.kind = Value::Kind::Bool;
    } else if (word("null")) {
      v.kind = Value::Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const std::size_t start = m_i;
      if (m_s[m_i] == '-') ++m_i;
      auto digits = [&] {
        const std::size_t s = m_i;
        while (m_i < m_s.size() && m_s[m_i] >= '0' && m_s[m_i] <= '9') ++m_i;
        if (m_i == s) fail("bad number");
      };
      digits();
      if (m_i < m_s.size() && m_s[m_i] == '.') {
        ++m_i;
        digits();
      }
      if (m_i < m_s.size() && (m_s[m_i] == 'e' || m_s[m_i] == 'E')) {
        ++m_i;
        if (m_i < m_s.size() && (m_s[m_i] == '+' || m_s[m_i] == '-')) ++m_i;
        digits();
      }
      v.kind = Value::Kind::Number;
      v.num = m_s.substr(start, m_i - start);
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  const std::string& m_s;
  std::size_t m_i = 0;
  std::size_t m_values = 0;
  std::size_t m_max_values;
};

inline Value parse(const std::string& text) { return Parser(text).document(); }

}  // namespace atlas::io::json
