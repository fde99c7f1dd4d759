// SPDX-License-Identifier: MIT
// Memory per GPU of a schedule table: weights, gradients and optimizer state of the stage, plus
// the activations of the micro-batches it holds at once (the table's in-flight depth per stage).
// The one memory model: the atlas search keeps its depth under the device's limit with it, `atlas
// schedule` prints it, `atlas simulate` and `atlas plan` check it, sim's planner model uses its
// per-block formula. No I/O.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {

struct ScheduleTable;

/// Bytes one rank of a TP group stores per block per in-flight micro-batch, with sequence
/// parallelism and selective recomputation (Korthikanti et al. 2022: 34 s b h / t, 16-bit).
double block_activation_bytes(const ModelCfg& m, int micro_batch_size, int tp, const DeviceProfile& p);

/// Fills the memory fields of `c` (state_bytes, act_bytes_per_micro, fixed_act_bytes per stage and
/// memory_limit_bytes = memory_limit_bytes(cfg, p)) for the deck's model on c's shape.
void apply_memory(CostModel& c, const Config& cfg, const DeviceProfile& p);

/// Per stage: the most micro-batches whose activations a replica of the stage holds at once (a
/// forward stores them, the backward of the same micro-batch frees them; with the split backward
/// its W does, B frees nothing), the max over the stage's DP replicas. 1F1B: min(pp - stage, m);
/// GPipe: m. With model chunks (interleaved 1F1B) it counts chunk passes (a micro-batch through
/// one chunk).
std::vector<int> in_flight_depth(const ScheduleTable& table);

/// The last stage's micro-batches in flight through the chunk that holds the LM head (chunk v - 1;
/// the whole stage with one chunk), the max over its DP replicas: each holds its fp32 logits (then
/// their gradient) from its forward to its backward (or W). GPipe: m; 1F1B: 1; interleaved 1F1B:
/// 1, or m when m == pp (every forward first).
int head_depth(const ScheduleTable& table);

/// Bytes one GPU of `stage` holds with `depth` micro-batches in flight (0 if c has no memory costs):
/// its state, depth x its activations per micro-batch and, on the last stage, the logits of each
/// micro-batch in flight through the LM head (`head`: head_depth; -1: `depth` with one chunk,
/// ceil(depth / chunks) with several). With `chunks` model chunks, `depth` counts chunk passes of
/// 1/chunks of those activations each.
double stage_memory_bytes(const CostModel& c, int stage, int depth, int chunks = 1, int head = -1);

/// The memory of a schedule on one GPU of each stage, and the device's limit.
struct ScheduleMemory {
  std::vector<int> depth;        ///< per stage, in_flight_depth
  int head_depth = 0;            ///< the last stage's micro-batches holding logits (head_depth)
  std::vector<double> bytes;     ///< per stage, stage_memory_bytes
  int peak_stage = 0;            ///< the fullest stage
  double peak_bytes = 0.0;       ///< its bytes: the schedule's memory per GPU
  double peak_state_bytes = 0.0; ///< of which weights, gradients and optimizer state
  double limit_bytes = 0.0;      ///< the device's usable memory (0 = unknown: no limit)
  [[nodiscard]] bool known() const { return peak_bytes > 0.0; }
  [[nodiscard]] bool fits() const { return limit_bytes <= 0.0 || peak_bytes <= limit_bytes; }
};

/// The memory of `table` under c's memory costs (CostModel::state_bytes etc.), with the table's
/// model chunks (ScheduleTable::virtual_stages: a gpipe table has none whatever c's).
ScheduleMemory memory_per_gpu(const CostModel& c, const ScheduleTable& table);
/// The same for the deck's job: memory_per_gpu(cost_model(cfg, layout), table).
ScheduleMemory memory_per_gpu(const Config& cfg, const topo::Layout& layout, const ScheduleTable& table);

/// What a rank may use for training: the profile's usable bytes (memory_gib x
/// usable_memory_fraction), divided by cluster.ranks_per_host on the host profile (the machine's
/// memory, shared by the ranks on it), less bubbletea.kv_cap_bytes with BubbleTea on (at least
/// one byte). CostModel::memory_limit_bytes, the planner's and the designs' memory checks.
double memory_limit_bytes(const Config& cfg, const DeviceProfile& p);

/// The device whose usable memory limits a rank, for messages: `device_name`, and for the host
/// profile shared by cluster.ranks_per_host ranks (its limit per rank is the host's / that) says so.
std::string memory_owner(const Config& cfg, const std::string& device_name);
/// What memory_owner adds after the device's name (", whose memory the ... ranks share", ", less
/// bubbletea.kv_cap_bytes = ..."); empty when the rank has its device's usable memory.
std::string memory_sharing(const Config& cfg);

/// "" when `mem` fits; else one message naming the schedule, the memory per GPU, the stage, the
/// in-flight depth, the limit and the fixes the deck `cfg` has not taken yet.
std::string memory_misfit(const ScheduleMemory& mem, const ScheduleTable& table, const Config& cfg,
                          const std::string& device_name);

}  // namespace atlas::sched
