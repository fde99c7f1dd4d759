// SPDX-License-Identifier: MIT
// Fault injection for the failure tests (documented in docs/testing.md): environment variables
// make one rank die with SIGKILL at a chosen point of a *fresh* run (never in a resumed one, so a
// restarted job runs through). Off unless the variables are set.
//   ATLAS_FAULT_KILL=RANK:STEP        world rank RANK dies at the start of step STEP
//   ATLAS_FAULT_KILL_IN_CKPT=RANK:STEP  world rank RANK dies while writing the checkpoint of
//                                     step STEP: after the .tmp file is complete, before rename
//   ATLAS_FAULT_HANG=RANK:STEP        world rank RANK stops at the start of step STEP and sleeps
//                                     until it is killed (a stuck or cut-off peer: the others
//                                     must give up within wan.recv_timeout_s, naming it)
//   ATLAS_FAULT_CONFIG_ERROR=RANK:STEP  world rank RANK alone raises a collective (config) error
//                                     at the start of step STEP, as a check only some ranks can
//                                     make would (the job must still end, not hang)
//   ATLAS_FAULT_NAN=RANK:STEP         world rank RANK sets one of its parameters to NaN at the
//                                     start of step STEP (a diverging model: the run must stop
//                                     with ExitCode::Diverged before any checkpoint of that step)
//   ATLAS_FAULT_NAN_LOSS=RANK:STEP    world rank RANK (0: the rank that prints losses) sees a NaN
//                                     loss at step STEP while gradients stay finite (a one-off:
//                                     the run must still stop at the next logged step)
#pragma once

#include <string>

namespace atlas::runtime {

/// Dies (SIGKILL, after a line on stderr) if `var` names this rank and `step` and the run is
/// fresh (`resumed` false). A malformed value is a ConfigError naming the variable.
void maybe_inject_kill(const char* var, int world_rank, int step, bool resumed);
/// Sleeps until killed (after a line on stderr) if `var` names this rank and `step` and the run
/// is fresh. A malformed value is a ConfigError naming the variable.
void maybe_inject_hang(const char* var, int world_rank, int step, bool resumed);
/// Throws ConfigError (after a line on stderr) if `var` names this rank and `step` and the run
/// is fresh. A malformed value is a ConfigError naming the variable.
void maybe_inject_config_error(const char* var, int world_rank, int step, bool resumed);
/// True (after a line on stderr) if `var` names this rank and `step` and the run is fresh: the
/// caller injects the fault. A malformed value is a ConfigError naming the variable.
[[nodiscard]] bool fault_requested(const char* var, int world_rank, int step, bool resumed);

}  // namespace atlas::runtime
