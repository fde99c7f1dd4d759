// SPDX-License-Identifier: MIT
// A grouped bar chart written as a PNG (libpng) with a small built-in 5x7 bitmap font: what the
// benchmarks draw (atlas bench ablation: measured beside predicted per row). No plotting library,
// no fonts on disk; pure pixels, so the output is the same on every machine.
#pragma once

#include <string>
#include <vector>

namespace atlas::bench {

/// One group of bars (e.g. one ablation row): a label under it and one value per series.
struct BarGroup {
  std::string label;
  std::vector<double> values;  ///< one per BarChart::series; negative or NaN = no bar
};

/// A chart's sides, in pixels, are within these.
inline constexpr int kMinChartPixels = 200;
inline constexpr int kMaxChartPixels = 8000;

struct BarChart {
  std::string title;
  std::string y_label;               ///< e.g. "step [ms]"
  std::vector<std::string> series;   ///< legend, e.g. {"measured", "predicted"}
  std::vector<BarGroup> groups;
  int width = 800;                   ///< pixels
  int height = 480;
};

/// Writes `chart` to `path` as an 8-bit RGB PNG of chart.width x chart.height pixels: a y axis from
/// 0 to a round maximum with ticks and values, one group of bars per BarGroup (its label below, its
/// values above each bar), the title and a legend. Encoded in memory, then written by
/// write_file_whole (renamed over `path` once complete, so a failed write leaves the old chart;
/// /dev/stdout or a pipe written in place). Throws Error (I/O) when the file
/// cannot be written; ConfigError when a side is outside [kMinChartPixels, kMaxChartPixels] or a
/// group has the wrong value count.
void write_bar_chart_png(const std::string& path, const BarChart& chart);

}  // namespace atlas::bench
