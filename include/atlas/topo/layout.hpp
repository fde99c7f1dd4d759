// SPDX-License-Identifier: MIT
// Pure arithmetic over the parallel layout: world rank <-> (dc, stage, dp, tp), group members and
// split colors. No MPI here, so it can be tested exhaustively. World ranks are ordered by
// (dc, stage, dp, tp) with tp fastest; a DC holds a contiguous range of pipeline stages, or with
// dp_across_dcs whole pipelines (every stage) for a contiguous range of dp replicas.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::topo {

/// Position of one rank in the layout. `stage` is the global pipeline stage index.
struct Coord {
  int dc = 0;
  int stage = 0;
  int dp = 0;
  int tp = 0;
  friend bool operator==(const Coord&, const Coord&) = default;
};

/// The communicator groups of DESIGN.md §3.
enum class Group {
  Tensor,    ///< same dc, stage, dp: the TP shards of one stage replica
  Data,      ///< same stage, tp: the DP replicas of a stage (inside one DC; across DCs with dp_across_dcs)
  Pipeline,  ///< same dp, tp: one pipeline, crosses DCs
  Dc,        ///< every rank of one DC
};

class Layout {
 public:
  /// A layout of `stages_per_dc` (one entry per DC, 0 allowed), `dp_size` and `tp_size`.
  /// Throws ConfigError if the shape is empty or a size is not positive.
  /// With `dp_across_dcs` every DC holds stages_per_dc[d] stages (all equal: pp) of dp_size / DCs
  /// replicas each (dp_size a multiple of the DC count); the pipeline never crosses a DC.
  Layout(std::vector<int> stages_per_dc, int dp_size, int tp_size, bool dp_across_dcs = false);
  /// The deck's layout (parallel.*), without a job size.
  explicit Layout(const ParallelCfg& parallel);
  /// The deck's layout; throws ConfigError (with the deck's hint) if it does not fill
  /// `world_size` ranks exactly.
  Layout(int world_size, const ParallelCfg& parallel);

  [[nodiscard]] int world_size() const noexcept { return m_pp * m_dp * m_tp; }
  [[nodiscard]] int pp_size() const noexcept { return m_pp; }
  [[nodiscard]] int dp_size() const noexcept { return m_dp; }
  [[nodiscard]] int tp_size() const noexcept { return m_tp; }
  [[nodiscard]] int dc_count() const noexcept { return static_cast<int>(m_stages_per_dc.size()); }
  [[nodiscard]] const std::vector<int>& stages_per_dc() const noexcept { return m_stages_per_dc; }
  /// True when DP replicas are spread over the DCs (parallel.dp_across_dcs).
  [[nodiscard]] bool dp_across_dcs() const noexcept { return m_dp_across; }
  /// DP replicas held by one DC: dp_size, or dp_size / DCs with dp_across_dcs.
  [[nodiscard]] int dp_per_dc() const noexcept { return m_dp_across ? m_dp / dc_count() : m_dp; }

  [[nodiscard]] Coord coord(int world_rank) const;
  [[nodiscard]] int world_rank(const Coord& c) const;
  /// World rank of (stage, dp, tp); the DC follows from the stage.
  [[nodiscard]] int world_rank(int stage, int dp, int tp) const;

  /// The DC of `stage`; with dp_across_dcs every DC holds every stage and this is the DC of
  /// replica 0 (DC 0): use coord(rank).dc for a rank's own DC.
  [[nodiscard]] int dc_of_stage(int stage) const;
  /// The DC of the rank at (stage, dp): the stage's, or with dp_across_dcs the replica's.
  [[nodiscard]] int dc_of(int stage, int dp) const;
  [[nodiscard]] int first_stage_of_dc(int dc) const;
  /// True when the boundary between `stage` and `stage + 1` crosses a DC (a WAN link).
  [[nodiscard]] bool crosses_dc(int stage) const;
  /// World ranks in other DCs that `c` exchanges tensors with over the WAN transport: its pipeline
  /// neighbours across a DC boundary and, when pp > 1, its tied-embedding partner (the first
  /// stage <-> the last stage of the same lane) if that sits in another DC. Ascending, no
  /// duplicates; symmetric: a's list holds b iff b's holds a.
  [[nodiscard]] std::vector<int> wan_peers(const Coord& c) const;
  /// The tied-embedding partner of `c` (first <-> last stage, same dp and tp), or -1 when `c` is
  /// on neither end or pp == 1.
  [[nodiscard]] int embedding_partner(const Coord& c) const;
  /// Ranks held by a DC (stages * dp * tp).
  [[nodiscard]] int ranks_in_dc(int dc) const;

  /// Members of `g` that contain `c`, in ascending world-rank order (= rank order in the comm).
  [[nodiscard]] std::vector<int> members(Group g, const Coord& c) const;
  /// MPI_Comm_split color of `c` in `g` (equal colors = same group).
  [[nodiscard]] int color(Group g, const Coord& c) const;

  /// "dc 1 (west) stage 2 dp 0 tp 1".
  [[nodiscard]] std::string describe(int world_rank, const std::vector<std::string>& dc_names = {}) const;

 private:
  std::vector<int> m_stages_per_dc;
  std::vector<int> m_stage_dc;  // stage -> dc
  int m_pp = 0;
  int m_dp = 1;
  int m_tp = 1;
  bool m_dp_across = false;
};

}  // namespace atlas::topo
