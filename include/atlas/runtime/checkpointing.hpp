// SPDX-License-Identifier: MIT
// Checkpoints of a Trainer: every parameter shard with its AdamW moments as full logical tensors
// (the io room writes the hyperslabs), plus the optimizer step count and the data-loader
// position, so a resumed run continues bit for bit — or on another layout, by reading each new
// shard out of the full tensors.
#pragma once

#include <string>

#include "atlas/deck/config.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/topo/communicators.hpp"

namespace atlas::runtime {

/// Collective over comms.world: writes ckpt_dir()/step-NNNNNN.h5 after `steps_done` steps
/// (atomically: temporary name, then rename), keeping ckpt.keep_last files.
io::WriteResult save_checkpoint(Trainer& trainer, const Config& cfg, const topo::Communicators& comms,
                                int steps_done);

struct Restored {
  std::string path;  ///< "" = fresh start
  int step = 0;      ///< steps already done (the first step to run)
};

/// Collective over comms.world: resolves run.resume ("" | latest | path) and loads it into the
/// trainer. Throws ConfigError (identically on every rank) for a truncated, foreign-version or
/// incompatible checkpoint, naming the file and the mismatch; io::ChecksumMismatch (exit code 5)
/// when the named file's data fails its checksum. With `latest`, damaged files are skipped with
/// a warning (io::resume_checkpoint).
Restored restore_checkpoint(Trainer& trainer, const Config& cfg, const topo::Communicators& comms);

}  // namespace atlas::runtime
