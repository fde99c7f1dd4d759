// SPDX-License-Identifier: MIT
// The one place atlas reads its process environment (docs/architecture.md, "Environment").
//
// Behaviour is set by deck keys (schema, --help-deck, resolved.deck), never by a variable read
// deep inside a room. What atlas does read from the environment are facts of the process it runs
// in: what the launcher says about this rank (local rank and size), where helper programs live,
// which emulated datacenter namespace the process was started in, and the fault injections of the
// test suite. Each variable is listed in kVariables with what it means; env::get refuses (an
// internal error) a name that is not listed, so the list is complete by construction.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace atlas::env {

struct Variable {
  const char* name;
  const char* meaning;
};

/// Every variable atlas reads, with its meaning (printed by docs/architecture.md's table).
inline constexpr Variable kVariables[] = {
    // Launcher facts.
    {"OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI: this rank's index on its node (GPU selection)"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI: ranks on this node (host backend threads)"},
    {"SLURM_LOCALID", "Slurm: this task's index on its node (GPU selection)"},
    {"MPI_LOCALRANKID", "MPICH: this rank's index on its node"},
    {"MPI_LOCALNRANKS", "MPICH: ranks on this node"},
    {"PMI_LOCAL_RANK", "PMI: this rank's index on its node"},
    {"OMPI_COMM_WORLD_SIZE", "Open MPI: set by mpirun (then every command starts MPI: app::needs_mpi)"},
    {"PMIX_RANK", "PMIx launchers (srun --mpi=pmix): started by a launcher"},
    {"PMI_RANK", "PMI launchers (MPICH's mpiexec, srun --mpi=pmi2): started by a launcher"},
    {"PMI_SIZE", "PMI launchers: started by a launcher"},
    {"SLURM_STEP_ID", "Slurm: a job step (srun), started by a launcher"},
    {"OMPI_MCA_btl_tcp_flags", "Open MPI: its TCP transport's protocols; atlas sets it (put left out) where unset, "
                               "before MPI_Init (mpi::Environment::default_tcp_send_protocol)"},
    {"CUDA_VISIBLE_DEVICES", "CUDA: the devices this process may use (quoted in errors only)"},
    {"PATH", "where helper programs (iperf3, ip) are looked up"},
    // Where this process runs (set by scripts/wan and the launch scripts, not by users).
    {"ATLAS_HOST_RANKS", "ranks that share this host's cores when DCs are emulated as namespaces "
                         "(Open MPI counts each namespace as a node)"},
    {"ATLAS_WAN_DC", "the emulated DC (network namespace) this process was started in"},
    {"ATLAS_WAN_BIND_HOST", "the address of this process's namespace that WAN sockets bind to"},
    {"ATLAS_WAN_EMULATED", "1 when the WAN between the namespaces is emulated (bench wan labels)"},
    // Helper programs.
    {"ATLAS_ROOT", "the atlas tree whose scripts/report holds the report scripts"},
    {"ATLAS_PYTHON", "the python3 that runs the report scripts (needs h5py, matplotlib)"},
    {"ATLAS_DECODE_WORKER", "the BubbleTea decode worker program"},
    // Fault injection of the test suite (RANK:STEP), never set in production.
    {"ATLAS_FAULT_KILL", "test: kill this rank at a step"},
    {"ATLAS_FAULT_KILL_IN_CKPT", "test: kill this rank inside a checkpoint write"},
    {"ATLAS_FAULT_HANG", "test: hang this rank at a step"},
    {"ATLAS_FAULT_HANG_EVAL", "test: hang this rank before the evaluation after a step"},
    {"ATLAS_FAULT_NAN", "test: poison a gradient with NaN at a step"},
    {"ATLAS_FAULT_NAN_LOSS", "test: report a NaN loss at a step"},
    {"ATLAS_FAULT_CONFIG_ERROR", "test: raise a config error on one rank at a step"},
    {"ATLAS_FAULT_BT_FINISH", "test: this rank (RANK:0) does not send BubbleTea's Finish to its decode worker"},
};

/// The value of `name` (which must be listed in kVariables), or nullopt when unset or empty.
[[nodiscard]] std::optional<std::string> get(std::string_view name);

/// Sets `name` (listed in kVariables) to `value` when it is not in the environment at all (an
/// empty value counts as set: the user's). Returns whether it set it. For variables that a
/// library atlas starts reads (before that library starts: not thread-safe).
bool set_default(std::string_view name, const std::string& value);

/// True when `name` is listed in kVariables.
[[nodiscard]] bool listed(std::string_view name);

/// This machine's host name (gethostname; "unknown-host" when it fails): rank maps, profiles,
/// lock holders, log prefixes and NCCL's error messages all name the host through this.
[[nodiscard]] std::string host_name();

}  // namespace atlas::env
