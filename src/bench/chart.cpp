// SPDX-License-Identifier: MIT
// write_bar_chart_png: a grouped bar chart rasterised into an RGB buffer and written with libpng.
// Text uses a 5x7 bitmap font (upper-case letters, digits, common punctuation; lower case is drawn
// in capitals), scaled by whole pixels.
#include "atlas/bench/chart.hpp"

#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <new>
#include <string>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/file.hpp"

namespace atlas::bench {

namespace {

struct Rgb {
  std::uint8_t r, g, b;
};

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kGrid{225, 225, 225};
constexpr std::array<Rgb, 6> kSeries{{{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40},
                                      {148, 103, 189}, {140, 86, 75}}};

/// 5x7 glyphs, one string of 7 rows x 5 columns ('#' = ink).
const std::map<char, const char*>& font() {
  static const std::map<char, const char*> f = {
      {' ', "                                   "},
      {'0', " ### #   ##  ### # ###  ##   # ### "}, {'1', "  #   ##    #    #    #    #   ### "},
      {'2', " ### #   #    #   #   #   #   #####"}, {'3', "#####   #   #     #     ##   # ### "},
      {'4', "   #   ##  # # #  # #####   #    # "}, {'5', "######    ####     #    ##   # ### "},
      {'6', "  ##  #   #    #### #   ##   # ### "}, {'7', "#####    #   #   #   #    #    #   "},
      {'8', " ### #   ##   # ### #   ##   # ### "}, {'9', " ### #   ##   # ####    #   #  ##  "},
      {'A', " ### #   ##   #######   ##   ##   #"}, {'B', "#### #   ##   ##### #   ##   ##### "},
      {'C', " ### #   ##    #    #    #   # ### "}, {'D', "###  #  # #   ##   ##   ##  # ###  "},
      {'E', "######    #    #### #    #    #####"}, {'F', "######    #    #### #    #    #    "},
      {'G', " ### #   ##    # ####   ##   # ####"}, {'H', "#   ##   ##   #######   ##   ##   #"},
      {'I', " ###   #    #    #    #    #   ### "}, {'J', "  ###   #    #    #    ##  #  ##   "},
      {'K', "#   ##  # # #  ##   # #  #  # #   #"}, {'L', "#    #    #    #    #    #    #####"},
      {'M', "#   ### ### # ##   ##   ##   ##   #"}, {'N', "#   ##   ###  ## # ##  ###   ##   #"},
      {'O', " ### #   ##   ##   ##   ##   # ### "}, {'P', "#### #   ##   ##### #    #    #    "},
      {'Q', " ### #   ##   ##   ## # ##  #  ## #"}, {'R', "#### #   ##   ##### # #  #  # #   #"},
      {'S', " ####    #     ###     #    #####  "}, {'T', "#####  #    #    #    #    #    #  "},
      {'U', "#   ##   ##   ##   ##   ##   # ### "}, {'V', "#   ##   ##   ##   ##   # # #   #  "},
      {'W', "#   ##   ##   ## # ## # ## # # # # "}, {'X', "#   ##   # # #   #   # # #   ##   #"},
      {'Y', "#   ##   # # #   #    #    #    #  "}, {'Z', "#####    #   #   #   #   #    #####"},
      {'.', "                          ##   ##  "}, {',', "                     ##   ##  #    "},
      {':', "      ##   ##        ##   ##       "}, {'-', "               #####               "},
      {'+', "       #    #  #####  #    #       "}, {'/', "    #    #   #   #   #   #    #    "},
      {'(', "   #   #   #    #    #     #     # "}, {')', " #     #     #    #    #   #   #   "},
      {'[', " ###  #    #    #    #    #    ### "}, {']', " ###    #    #    #    #    #  ### "},
      {'%', "##   ##  #   #   #   #   #  ##   ##"}, {'=', "          #####     #####          "},
      {'_', "                              #####"}, {'x', "     #   # # #   #   # # #   #     "},
      {'>', " #     #     #     #   #   #   #   "}, {'<', "   #   #   #   #     #     #     # "},
      {'\'', "  #    #   #                       "}, {'!', "  #    #    #    #    #         #  "},
      {'?', " ### #   #    #   #   #         #  "}, {'*', "       #  # # #  ###  # # #  #     "},
      {'#', " # #  # # ##### # # ##### # #  # # "}, {'"', " # #  # #                          "},
  };
  return f;
}

class Canvas {
 public:
  Canvas(int w, int h) : m_w(w), m_h(h), m_px(static_cast<std::size_t>(w) * h * 3, 255) {}
  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= m_w || y >= m_h) return;
    std::uint8_t* p = &m_px[(static_cast<std::size_t>(y) * m_w + x) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {  // inclusive of x0,y0, exclusive of x1,y1
    for (int y = std::min(y0, y1); y < std::max(y0, y1); ++y)
      for (int x = std::min(x0, x1); x < std::max(x0, x1); ++x) set(x, y, c);
  }
  /// The 5 x 7 glyph of `ch` (lower case drawn as upper case, except 'x'; '?' when the font lacks it).
  static const char* glyph(char ch) {
    if (ch >= 'a' && ch <= 'z' && ch != 'x') ch = static_cast<char>(ch - 'a' + 'A');
    const auto it = font().find(ch);
    return it != font().end() ? it->second : font().at('?');
  }
  /// Width in pixels of `s` at `scale`.
  static int text_width(const std::string& s, int scale) { return static_cast<int>(s.size()) * 6 * scale; }
  void text(int x, int y, const std::string& s, int scale, Rgb c) {
    for (char ch : s) {
      const char* g = glyph(ch);
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col)
          if (g[row * 5 + col] == '#') rect(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale, c);
      x += 6 * scale;
    }
  }
  /// Text rotated 90 degrees counter-clockwise, reading bottom to top, its baseline at x.
  void text_up(int x, int y_bottom, const std::string& s, int scale, Rgb c) {
    int y = y_bottom;
    for (char ch : s) {
      const char* g = glyph(ch);
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col)
          if (g[row * 5 + col] == '#')
            rect(x + row * scale, y - (col + 1) * scale, x + (row + 1) * scale, y - col * scale, c);
      y -= 6 * scale;
    }
  }
  [[nodiscard]] const std::uint8_t* row(int y) const { return &m_px[static_cast<std::size_t>(y) * m_w * 3]; }

 private:
  int m_w, m_h;
  std::vector<std::uint8_t> m_px;
};

/// A round axis maximum >= v: 1, 2 or 5 times a power of ten.
double nice_max(double v) {
  if (!(v > 0)) return 1.0;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= v) return m * p;
  return 10.0 * p;
}

std::string short_number(double v) {
  char buf[32];
  if (v >= 100 || v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v >= 10) std::snprintf(buf, sizeof buf, "%.1f", v);
  else std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

/// The PNG file of `canvas` (w x h), encoded in memory.
std::string encode_png(const std::string& path, const Canvas& canvas, int w, int h) {
  std::string bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    ATLAS_THROW(Io, "libpng could not start encoding the chart '" << path << "'");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ATLAS_THROW(Io, "libpng failed encoding the chart '" << path << "'");
  }
  png_set_write_fn(
      png, &bytes,
      [](png_structp p, png_bytep data, png_size_t n) {
        try {
          static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<const char*>(data), n);
        } catch (const std::bad_alloc&) {
          png_error(p, "out of memory");  // longjmps to the setjmp above; no exception crosses libpng
        }
      },
      [](png_structp) {});
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < h; ++y) png_write_row(png, const_cast<png_bytep>(canvas.row(y)));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return bytes;
}

}  // namespace

void write_bar_chart_png(const std::string& path, const BarChart& chart) {
  const int w = chart.width, h = chart.height;
  if (w < kMinChartPixels || h < kMinChartPixels || w > kMaxChartPixels || h > kMaxChartPixels)
    throw ConfigError("bar chart '" + path + "': size " + std::to_string(w) + "x" + std::to_string(h) + " outside [" +
                      std::to_string(kMinChartPixels) + ", " + std::to_string(kMaxChartPixels) + "] pixels");
  const std::size_t ns = chart.series.size();
  for (const auto& g : chart.groups)
    if (g.values.size() != ns)
      throw ConfigError("bar chart '" + path + "': group '" + g.label + "' has " + std::to_string(g.values.size()) +
                        " values for " + std::to_string(ns) + " series");
  Canvas c(w, h);
  const int s = std::max(1, std::min(w, h) / 300);  // font scale
  const int left = 12 * s + Canvas::text_width("00000", s) + 8 * s, right = 10 * s;
  const int top = 14 * s + 10 * s, bottom = h - 24 * s;
  c.text(std::max(0, (w - Canvas::text_width(chart.title, s)) / 2), 4 * s, chart.title, s, kBlack);
  // Legend, top right under the title.
  int lx = w - right;
  for (std::size_t i = ns; i-- > 0;) {
    lx -= Canvas::text_width(chart.series[i], s) + 14 * s;
    c.rect(lx, top - 2 * s - 7 * s, lx + 7 * s, top - 2 * s, kSeries[i % kSeries.size()]);
    c.text(lx + 9 * s, top - 2 * s - 7 * s, chart.series[i], s, kBlack);
  }
  double vmax = 0.0;
  for (const auto& g : chart.groups)
    for (double v : g.values)
      if (std::isfinite(v)) vmax = std::max(vmax, v);
  const double ymax = nice_max(vmax * 1.08);
  const auto ypix = [&](double v) { return bottom - static_cast<int>(std::lround((bottom - top) * v / ymax)); };
  for (int t = 0; t <= 5; ++t) {
    const double v = ymax * t / 5;
    const int y = ypix(v);
    c.rect(left, y, w - right, y + 1, kGrid);
    const std::string lab = short_number(v);
    c.text(left - 4 * s - Canvas::text_width(lab, s), y - 3 * s, lab, s, kBlack);
  }
  c.text_up(2 * s, (top + bottom) / 2 + Canvas::text_width(chart.y_label, s) / 2, chart.y_label, s, kBlack);
  c.rect(left, top, left + std::max(1, s / 2), bottom, kBlack);
  c.rect(left, bottom, w - right, bottom + std::max(1, s / 2), kBlack);
  const std::size_t ng = std::max<std::size_t>(1, chart.groups.size());
  const double gw = static_cast<double>(w - right - left) / static_cast<double>(ng);
  const double bw = gw * 0.8 / static_cast<double>(std::max<std::size_t>(1, ns));
  for (std::size_t gi = 0; gi < chart.groups.size(); ++gi) {
    const auto& g = chart.groups[gi];
    const double gx = left + gw * static_cast<double>(gi) + gw * 0.1;
    for (std::size_t i = 0; i < ns; ++i) {
      const double v = g.values[i];
      if (!std::isfinite(v) || v < 0) continue;
      const int x0 = static_cast<int>(gx + bw * static_cast<double>(i)), x1 = static_cast<int>(gx + bw * (i + 1.0)) - s;
      c.rect(x0, ypix(v), x1, bottom, kSeries[i % kSeries.size()]);
      const std::string lab = short_number(v);
      if (Canvas::text_width(lab, s) <= x1 - x0 + 4 * s)
        c.text((x0 + x1 - Canvas::text_width(lab, s)) / 2, ypix(v) - 9 * s, lab, s, kBlack);
    }
    c.text(static_cast<int>(left + gw * (static_cast<double>(gi) + 0.5)) - Canvas::text_width(g.label, s) / 2,
           bottom + 6 * s, g.label, s, kBlack);
  }
  write_file_whole(path, encode_png(path, c, w, h));
}

}  // namespace atlas::bench
