# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Sourced by every scripts/slurm/*.sbatch after its #SBATCH block and site settings. Creates the
# run directory runs/<run.name>_<jobid>/, records what is needed to reproduce the run (deck,
# overrides, git commit, scontrol show job, SLURM_/OMPI_/NCCL_/ATLAS_ variables), places each DC's
# ranks on that DC's nodes, and launches `atlas $ATLAS_CMD DECK key=value ...` with srun (or
# mpirun) through the restart loop (scripts/launch/atlas-run-restart.sh). Not a scheduler: one
# launch per call of atlas_run.
#
# Entry points: atlas_run [DECK] [key=value ...]   (one launch; exit status of the last attempt)
#               atlas_deck_value KEY               (a deck key after overrides, for sweeps)
# Needs bash, Slurm's client commands inside a job, and git (optional: the commit is recorded).

# shellcheck source=../launch/wait_child.sh
source "$(dirname "${BASH_SOURCE[0]}")/../launch/wait_child.sh"  # atlas_wait_child

# ---- site settings: every one may be set by the sbatch script or the environment ----
# NOTE: change for your cluster (or set in the sbatch script / `sbatch --export=ALL,VAR=...`).
: "${ATLAS_ROOT:=${SLURM_SUBMIT_DIR:-$PWD}}"     # repository checkout; decks are relative to it
: "${ATLAS_BIN:=$ATLAS_ROOT/build/bin/atlas}"   # NOTE: the build to run (e.g. build-cuda/bin/atlas)
: "${ATLAS_CMD:=train}"                         # subcommand the job runs
: "${ATLAS_CMD_ARGS:=}"                         # extra options after the overrides (split on spaces)
: "${ATLAS_DECK:=inputs/three_dc_cpu.deck}"     # deck when the job is given none
: "${ATLAS_RUNS_DIR:=$ATLAS_ROOT/runs}"         # parent of run directories (run.out_dir)
: "${ATLAS_LAUNCHER:=srun}"                     # srun | mpirun (both read the allocation)
: "${ATLAS_SRUN_MPI:=pmix}"                     # NOTE: srun --mpi plugin your Open MPI was built with
: "${ATLAS_MODULES:=}"                          # NOTE: modules to load, e.g. "openmpi/4.1 hdf5/1.10"
# Per-DC placement, one word per deck DC (cluster.dcs order). Empty = block placement over the
# whole allocation (on one host every DC is that host).
: "${ATLAS_DC_NODES:=}"       # NOTE: Slurm hostlists, e.g. "dcA-n[01-02] dcB-n[01-02] dcC-n01"
: "${ATLAS_DC_BIND_HOSTS:=}"  # NOTE: WAN listen address per DC (cluster.bind_hosts), e.g. "10.1.0.1 10.2.0.1 10.3.0.1"
# Network interfaces inside a DC (intra-DC MPI / NCCL traffic and Open MPI's out-of-band wire-up).
: "${ATLAS_NET_IFNAME:=lo}"   # NOTE: e.g. ib0 / eth0 / ens1f0 (lo works only when the job is on one host)

export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$ATLAS_NET_IFNAME}
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-$ATLAS_NET_IFNAME}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-$ATLAS_NET_IFNAME}
# Debug switches (uncomment when wire-up or NCCL misbehaves):
# export NCCL_DEBUG=INFO
# export NCCL_DEBUG_SUBSYS=INIT,NET
# export OMPI_MCA_btl_base_verbose=100
# export OMPI_MCA_pml_base_verbose=100
# export PMIX_MCA_pmix_client_get_verbose=1

# ---- helpers ----
atlas_die() { # code message...
  local code=$1
  shift
  echo "ERROR: $*" >&2
  exit "$code"
}

atlas_note() { echo "# $*"; }
# A note of the batch shell that also goes to the run directory's job.log (Slurm truncates the
# job's output file when it requeues the job; job.log keeps every run's lines).
atlas_job_note() {
  atlas_note "$@"
  if [[ -n ${ATLAS_RUN_DIR:-} && -d $ATLAS_RUN_DIR ]]; then echo "# $*" >>"$ATLAS_RUN_DIR/job.log"; fi
}

# The value of deck key $1: the deck's last line for it, then the last key=value override in
# ATLAS_OVERRIDES; quotes stripped; empty when absent. Read as atlas reads a deck (src/deck/deck.cpp):
# a '#' outside quotes starts a comment, and the keys after a [section] line are section.key.
atlas_deck_value() {
  local key=$1 value o
  value=$(awk -v key="$key" '
    {
      line = $0; q = 0
      for (i = 1; i <= length(line); ++i) {
        c = substr(line, i, 1)
        if (c == "\"") q = !q
        if (c == "#" && !q) { line = substr(line, 1, i - 1); break }
      }
      gsub(/^[ \t]+|[ \t]+$/, "", line)
    }
    line ~ /^\[.*\]$/ { section = substr(line, 2, length(line) - 2); gsub(/^[ \t]+|[ \t]+$/, "", section); next }
    index(line, "=") {
      k = substr(line, 1, index(line, "=") - 1); v = substr(line, index(line, "=") + 1)
      gsub(/^[ \t]+|[ \t]+$/, "", k); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (section != "") k = section "." k
      if (k == key) val = v
    }
    END { print val }' "$ATLAS_DECK_PATH")
  for o in "${ATLAS_OVERRIDES[@]}"; do
    if [[ ${o%%=*} == "$key" ]]; then value=${o#*=}; fi
  done
  value=${value#\"}
  value=${value%\"}
  echo "$value"
}

# Ranks of each DC (parallel.stages_per_dc * dp_size * tp_size; with parallel.dp_across_dcs each DC
# holds dp_size / DCs of the replicas), space-separated.
atlas_ranks_per_dc() {
  local dp tp s across dcs out=() stages
  dp=$(atlas_deck_value parallel.dp_size)
  tp=$(atlas_deck_value parallel.tp_size)
  across=$(atlas_deck_value parallel.dp_across_dcs)
  dp=${dp:-1}
  tp=${tp:-1}
  read -r -a stages <<<"$(atlas_deck_value parallel.stages_per_dc)"
  [[ ${#stages[@]} -gt 0 ]] || atlas_die 2 "$ATLAS_DECK_PATH: parallel.stages_per_dc is missing"
  case "$across" in
    true | 1)
      dcs=${#stages[@]}
      [[ $dp =~ ^[0-9]+$ ]] && ((dp % dcs == 0)) ||
        atlas_die 2 "$ATLAS_DECK_PATH: parallel.dp_across_dcs needs parallel.dp_size ($dp) to be a multiple" \
          "of the DCs ($dcs)"
      dp=$((dp / dcs)) ;;
    "" | false | 0) ;;
    *) atlas_die 2 "$ATLAS_DECK_PATH: parallel.dp_across_dcs = '$across': expected true or false" ;;
  esac
  for s in "${stages[@]}"; do
    [[ $s =~ ^[0-9]+$ && $dp =~ ^[0-9]+$ && $tp =~ ^[0-9]+$ ]] ||
      atlas_die 2 "$ATLAS_DECK_PATH: cannot read the layout (stages_per_dc '$s', dp '$dp', tp '$tp')"
    out+=($((s * dp * tp)))
  done
  echo "${out[*]}"
}

# Writes $1 (one host per world rank, rank order) from ATLAS_DC_NODES and ATLAS_RANKS_PER_DC: DC
# i's ranks go to the nodes of its hostlist, in blocks of a multiple of parallel.tp_size ranks (a
# rank's TP lanes are consecutive ranks: a TP group never spans two nodes; DP peers share a node
# when they fit).
atlas_write_hostfile() {
  local file=$1 dc=0 n nodes count per r k tp
  local -a dc_nodes ranks alloc
  tp=$(atlas_deck_value parallel.tp_size)
  tp=${tp:-1}
  [[ $tp =~ ^[1-9][0-9]*$ ]] || atlas_die 2 "$ATLAS_DECK_PATH: parallel.tp_size = '$tp': expected a positive integer"
  read -r -a dc_nodes <<<"$ATLAS_DC_NODES"
  read -r -a ranks <<<"$ATLAS_RANKS_PER_DC"
  ((${#dc_nodes[@]} == ${#ranks[@]})) ||
    atlas_die 2 "ATLAS_DC_NODES has ${#dc_nodes[@]} entries but the deck has ${#ranks[@]} DCs" \
      "(cluster.dcs: $(atlas_deck_value cluster.dcs)); give one Slurm hostlist per DC"
  mapfile -t alloc < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  : >"$file"
  for n in "${ranks[@]}"; do
    mapfile -t nodes < <(scontrol show hostnames "${dc_nodes[dc]}")
    count=${#nodes[@]}
    ((count > 0)) || atlas_die 2 "ATLAS_DC_NODES entry $dc ('${dc_nodes[dc]}') names no node"
    for k in "${nodes[@]}"; do
      printf '%s\n' "${alloc[@]}" | grep -qx "$k" ||
        atlas_die 2 "node $k of DC $dc is not in this job's allocation ($SLURM_JOB_NODELIST);" \
          "request it (#SBATCH --nodelist) or fix ATLAS_DC_NODES"
    done
    per=$(((n + count - 1) / count))
    per=$(((per + tp - 1) / tp * tp))
    for ((r = 0; r < n; ++r)); do echo "${nodes[r / per]}" >>"$file"; done
    dc=$((dc + 1))
  done
  atlas_check_node_load "$file"
}

# The CPUs and GPUs this job holds on each of its nodes, one "node cpus gpus" line each ("-" for
# a count scontrol does not give: no CPU_IDs, or no GPU held as GRES there), from `scontrol show
# job -d`'s per-node lines ("Nodes=n[1-2] CPU_IDs=0-7,16-23 Mem=0 GRES=gpu:a100:4(IDX:0-3)").
# Prints nothing where scontrol gives no such lines.
atlas_job_node_caps() {
  local nodes cpus gpus k
  [[ -n ${SLURM_JOB_ID:-} ]] || return 0
  scontrol show job -d "$SLURM_JOB_ID" 2>/dev/null | awk '
    $1 ~ /^Nodes=/ {
      nodes = substr($1, 7); cpus = "-"; gpus = "-"
      for (i = 2; i <= NF; ++i) {
        if ($i ~ /^CPU_IDs=./) {
          cpus = 0; n = split(substr($i, 9), part, ",")
          for (j = 1; j <= n; ++j) {
            if (split(part[j], r, "-") == 2) cpus += r[2] - r[1] + 1; else cpus += 1
          }
        }
        if ($i ~ /^GRES=/) {
          # Entries "gpu:4(IDX:0-3)" or "gpu:a100:4(IDX:0-3)", comma-separated (an IDX list has
          # commas too: its pieces match no entry). Other resources (vgpu, shard) and forms
          # without a count are not GPUs counted here; none leaves "-": a cluster may not
          # schedule its GPUs as GRES at all.
          n = split(substr($i, 6), ent, ",")
          for (j = 1; j <= n; ++j) {
            if (ent[j] !~ /^gpu(:[^:(]+)?:[0-9]+\(/) continue
            e = substr(ent[j], 1, index(ent[j], "(") - 1); m = split(e, f, ":")
            gpus = (gpus == "-" ? 0 : gpus) + f[m]
          }
        }
      }
      print nodes, cpus, gpus
    }' | while read -r nodes cpus gpus; do
    for k in $(scontrol show hostnames "$nodes"); do echo "$k $cpus $gpus"; done
  done
}

# Checks the hostfile $1 against what this job holds on each node before the launch. More ranks
# x SLURM_CPUS_PER_TASK than the job's CPUs on a node stop the job (unless sbatch --overcommit):
# srun would refuse that step with "Requested node configuration is not available", and mpirun
# would start the ranks on too few cores. For a CUDA deck, more ranks than the job's GPUs on a
# node stop the job where it asked for one GPU per task (--gpus-per-task: srun refuses the step);
# otherwise they are a warning: atlas runs such ranks (device local_rank % GPUs), and an intra-DC
# group whose ranks share a GPU sums through host memory over MPI instead of NCCL (docs/cuda.md).
atlas_check_node_load() {
  local file=$1 cpt backend count node caps cpus gpus
  caps=$(atlas_job_node_caps)
  [[ -n $caps ]] || return 0
  cpt=${SLURM_CPUS_PER_TASK:-1}
  backend=$(atlas_deck_value device.backend)
  while read -r count node; do
    read -r _ cpus gpus < <(awk -v n="$node" '$1 == n { print; exit }' <<<"$caps")
    if [[ -z ${SLURM_OVERCOMMIT:-} && $cpus =~ ^[0-9]+$ ]] && ((count * cpt > cpus)); then
      atlas_die 2 "the per-DC hostfile puts $count ranks on node $node, which need $((count * cpt)) CPUs" \
        "($count x $cpt CPUs per task), but this job holds $cpus CPUs there (ATLAS_DC_NODES=\"$ATLAS_DC_NODES\")" \
        $'\n  hint: request more CPUs on that node (#SBATCH --ntasks-per-node, --nodelist, --exclusive),' \
        "give that DC more nodes in ATLAS_DC_NODES, or lower --cpus-per-task; --overcommit skips this" \
        "check but allocates the CPUs of one task per node"
    fi
    if [[ $backend == cuda && $gpus =~ ^[0-9]+$ ]] && ((count > gpus)); then
      local what="the per-DC hostfile puts $count ranks on node $node, but this job holds $gpus GPUs there"
      if [[ -n ${SLURM_GPUS_PER_TASK:-} ]]; then
        atlas_die 2 "$what, and it asked for $SLURM_GPUS_PER_TASK per task (--gpus-per-task)" \
          "(ATLAS_DC_NODES=\"$ATLAS_DC_NODES\")" \
          $'\n  hint: give that DC more nodes in ATLAS_DC_NODES or request more GPUs on the node'
      fi
      atlas_job_note "WARNING: $what: ranks share GPUs (rank i of a node uses GPU i mod $gpus), and an" \
        "intra-DC group whose ranks share one sums through host memory over MPI instead of NCCL;" \
        "give that DC more nodes in ATLAS_DC_NODES for one GPU per rank"
    fi
  done < <(sort "$file" | uniq -c)
}

# Records what reproduces the run into $ATLAS_PROV_DIR: the run directory for the job's first
# run, RUN_DIR/requeue-K for its K-th requeue (SLURM_RESTART_COUNT), so that a requeue never
# overwrites what the earlier runs ran with (a binary rebuilt in between, another deck).
atlas_record_provenance() {
  local d=$ATLAS_RUN_DIR first_sha="" sha
  if ((${SLURM_RESTART_COUNT:-0} > 0)); then
    d=$ATLAS_RUN_DIR/requeue-$SLURM_RESTART_COUNT
    mkdir -p "$d" || atlas_die 5 "cannot create $d"
    first_sha=$(sed -n 's/^atlas_bin_sha256: //p' "$ATLAS_RUN_DIR/build_info.txt" 2>/dev/null)
  fi
  ATLAS_PROV_DIR=$d
  sha=$(sha256sum "$ATLAS_BIN" | cut -d' ' -f1)
  if [[ -n $first_sha && $first_sha != "$sha" ]]; then
    atlas_job_note "WARNING: $ATLAS_BIN changed since the job's first run (sha256 $first_sha, now $sha): the" \
      "resumed run trains with another binary; $d/build_info.txt records it"
  fi
  cp "$ATLAS_DECK_PATH" "$d/" || atlas_die 5 "cannot copy the deck into $d"
  printf '%s\n' "${ATLAS_OVERRIDES[@]}" >"$d/overrides.txt"
  {
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "atlas_bin: $ATLAS_BIN"
    echo "atlas_bin_sha256: $sha"
    echo "atlas_bin_mtime: $(date -u -r "$ATLAS_BIN" +%Y-%m-%dT%H:%M:%SZ)"
    if git -C "$ATLAS_ROOT" rev-parse HEAD >/dev/null 2>&1; then
      echo "git_commit: $(git -C "$ATLAS_ROOT" rev-parse HEAD)"
      echo "git_dirty_files: $(git -C "$ATLAS_ROOT" status --porcelain --untracked-files=no | wc -l)"
    else
      echo "git_commit: unknown ($ATLAS_ROOT is not a git checkout)"
    fi
    echo "mpirun: $(mpirun --version 2>/dev/null | head -n1)"
    echo "slurm: $(sinfo --version 2>/dev/null)"
  } >"$d/build_info.txt"
  scontrol show job "$SLURM_JOB_ID" >"$d/scontrol_job.txt" 2>&1 || true
  env | grep -E '^(SLURM|OMPI|NCCL|ATLAS|PMIX|UCX|CUDA_VISIBLE)[A-Za-z0-9_]*=' | sort >"$d/env.txt"
}

# ---- the launch ----
# atlas_run [DECK] [key=value ...]: one launch through the restart loop. Sets ATLAS_RUN_DIR.
# ATLAS_RUN_SUFFIX (optional) is appended to the run directory's name (sweeps).
atlas_run() {
  # A SIGUSR1 before the launch (a preemption or a short time limit's --signal during the set-up)
  # would end this shell (the signal's default action) with nothing noted: remember it, and launch
  # nothing (below).
  ATLAS_STOP_EARLY=0
  trap 'ATLAS_STOP_EARLY=1' USR1
  [[ -n ${SLURM_JOB_ID:-} ]] ||
    atlas_die 1 "not inside a Slurm job: submit with sbatch (or run inside salloc)"
  [[ -f $ATLAS_ROOT/scripts/launch/atlas-run-restart.sh ]] ||
    atlas_die 1 "ATLAS_ROOT=$ATLAS_ROOT is not an atlas checkout; submit from the repository" \
      "root or set ATLAS_ROOT (sbatch --export=ALL,ATLAS_ROOT=/path/to/atlas)"
  cd "$ATLAS_ROOT" || atlas_die 5 "cannot cd to $ATLAS_ROOT"
  # The loopback interface reaches no other node: intra-DC MPI, NCCL and mpirun's wire-up would
  # fail or hang across nodes, and the restart loop would retry the same set-up.
  if ((${SLURM_JOB_NUM_NODES:-1} > 1)); then
    local v
    for v in NCCL_SOCKET_IFNAME OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include; do
      [[ ${!v} == lo ]] &&
        atlas_die 1 "$v=lo (ATLAS_NET_IFNAME) but the job spans $SLURM_JOB_NUM_NODES nodes: loopback reaches no other" \
          "node; set ATLAS_NET_IFNAME to the intra-DC network interface (ib0, eth0: see ip -br addr on a node)"
    done
  fi

  if [[ $# -gt 0 && $1 != *=* ]]; then
    ATLAS_DECK=$1
    shift
  fi
  ATLAS_OVERRIDES=("$@")
  local o
  for o in "${ATLAS_OVERRIDES[@]}"; do
    [[ $o == ?*=* ]] || atlas_die 1 "argument '$o' is not a key=value deck override"
  done
  ATLAS_DECK_PATH=$ATLAS_DECK
  [[ -f $ATLAS_DECK_PATH ]] || atlas_die 2 "deck $ATLAS_DECK_PATH not found (relative to $ATLAS_ROOT)"
  [[ -x $ATLAS_BIN ]] ||
    atlas_die 1 "$ATLAS_BIN is not an executable: build first (cmake --preset cpu-release &&" \
      "cmake --build --preset cpu-release) or set ATLAS_BIN"

  if [[ -n $ATLAS_MODULES ]]; then
    command -v module >/dev/null || atlas_die 1 "ATLAS_MODULES is set but 'module' is unavailable"
    # shellcheck disable=SC2086
    module load $ATLAS_MODULES || atlas_die 1 "module load $ATLAS_MODULES failed"
  fi

  # ---- job shape: the deck's world size must fit the allocation ----
  local name world=0 n
  name=$(atlas_deck_value run.name)
  name=${name:-atlas}
  ATLAS_RANKS_PER_DC=$(atlas_ranks_per_dc) || exit $?
  for n in $ATLAS_RANKS_PER_DC; do world=$((world + n)); done
  local tasks=${SLURM_NTASKS:-${SLURM_NPROCS:-0}}
  ((world <= tasks)) ||
    atlas_die 2 "the deck needs $world ranks but the job has $tasks tasks;" \
      "submit with --ntasks=$world (or change parallel.* with key=value overrides)"

  # ---- run directory and provenance ----
  local run_name="${name}_${SLURM_JOB_ID}${ATLAS_RUN_SUFFIX:-}"
  ATLAS_RUN_DIR="$ATLAS_RUNS_DIR/$run_name"
  mkdir -p "$ATLAS_RUN_DIR" || atlas_die 5 "cannot create $ATLAS_RUN_DIR"
  atlas_record_provenance

  # ---- placement and the command ----
  local -a launch extra
  read -r -a extra <<<"$ATLAS_CMD_ARGS"
  case "$ATLAS_LAUNCHER" in
    srun)
      launch=(srun "--mpi=$ATLAS_SRUN_MPI" --ntasks="$world" --kill-on-bad-exit=1)
      # srun no longer reads SLURM_CPUS_PER_TASK (Slurm 22.05): without this every rank gets one
      # CPU, whatever #SBATCH --cpus-per-task gave the job for device.threads.
      if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then launch+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
      if [[ -n $ATLAS_DC_NODES ]]; then
        atlas_write_hostfile "$ATLAS_PROV_DIR/hostfile"
        export SLURM_HOSTFILE=$ATLAS_PROV_DIR/hostfile
        launch+=(--distribution=arbitrary)
      fi
      ;;
    mpirun)
      launch=(mpirun -np "$world")
      if [[ -n $ATLAS_DC_NODES ]]; then
        atlas_write_hostfile "$ATLAS_PROV_DIR/hostfile"
        # The sequential mapper puts rank i on line i. Open MPI 4.1.4's mpirun segfaults at exit
        # (hwloc topology free) when it is combined with oversubscription, which it never needs.
        launch=(env -u OMPI_MCA_rmaps_base_oversubscribe "${launch[@]}"
          --hostfile "$ATLAS_PROV_DIR/hostfile" --mca rmaps seq)
      fi
      ;;
    *) atlas_die 1 "ATLAS_LAUNCHER='$ATLAS_LAUNCHER': expected srun or mpirun" ;;
  esac
  local -a placement_overrides=("run.out_dir=$ATLAS_RUNS_DIR" "run.name=$run_name")
  if [[ -n $ATLAS_DC_BIND_HOSTS ]]; then placement_overrides+=("cluster.bind_hosts=$ATLAS_DC_BIND_HOSTS"); fi
  # A requeued job (SLURM_RESTART_COUNT > 0: it stopped on request, or Slurm requeued it after a
  # node failure) runs this script again with the same job id, so in the same run directory: it
  # resumes from the newest checkpoint there.
  if [[ $ATLAS_CMD == train && ${SLURM_RESTART_COUNT:-0} -gt 0 ]]; then
    placement_overrides+=("run.resume=latest")
    # A checkpoint the submission named (a fine-tune's start) stays the start while the run has
    # none of its own (atlas-run-restart.sh does the same).
    # A submission's run.resume= (start fresh, over a deck's run.resume = PATH) stays so.
    local o
    for o in "${ATLAS_OVERRIDES[@]}"; do
      case "$o" in
        run.resume=latest) ;;
        run.resume=) placement_overrides+=("run.resume_fallback=") ;;
        run.resume=*) placement_overrides+=("run.resume_fallback=${o#run.resume=}") ;;
      esac
    done
    atlas_job_note "requeued job (SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT): resuming with run.resume=latest"
  fi
  # ---- the job's WAN key: 32 random bytes only this user can read, on the shared file system
  # (the run dir); every rank mixes it into its WAN pair secrets, so no key travels over the
  # network and a stranger on the MPI path cannot stand in the middle. Kept across restarts.
  if [[ -z $(atlas_deck_value wan.key_file) ]]; then
    local key_file="$ATLAS_RUN_DIR/wan.key"
    if [[ ! -s $key_file ]]; then
      (umask 077 && head -c 32 /dev/urandom >"$key_file") ||
        atlas_die 5 "cannot create the WAN key file $key_file"
    fi
    placement_overrides+=("wan.key_file=$key_file")
  fi
  launch+=("$ATLAS_BIN" "$ATLAS_CMD" "$ATLAS_DECK_PATH" "${ATLAS_OVERRIDES[@]}"
    "${placement_overrides[@]}" "${extra[@]}")
  printf '%q ' "${launch[@]}" >"$ATLAS_PROV_DIR/command.txt"
  echo >>"$ATLAS_PROV_DIR/command.txt"

  atlas_note "atlas job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $world ranks, DCs $(atlas_deck_value cluster.dcs)," \
    "ranks per DC $ATLAS_RANKS_PER_DC"
  atlas_note "run dir $ATLAS_RUN_DIR"
  atlas_note "command ${launch[*]}"

  # The restart loop runs in the background, so that this shell can pass on a SIGUSR1 (a shell
  # runs its traps only between commands): `#SBATCH --signal=B:USR1@300` then reaches the ranks
  # (the loop -> srun/mpirun -> atlas), which write a checkpoint and stop with status 8.
  local status out tee_pid loop_pid
  if ((ATLAS_STOP_EARLY)); then
    trap - USR1
    atlas_job_note "batch shell: SIGUSR1 before the launch: $ATLAS_CMD not started (stopped on request;" \
      "run.resume=latest resumes from the newest checkpoint)"
    status=8
  else
    exec {out}> >(tee -a "$ATLAS_RUN_DIR/job.log")
    tee_pid=$!
    # The loop creates this file once its traps are set; a SIGUSR1 is passed on only then (before,
    # it would end the loop: the signal's default action).
    local ready="$ATLAS_RUN_DIR/.restart-loop-ready.$$"
    rm -f "$ready"
    ATLAS_RESTART_READY_FILE=$ready "$ATLAS_ROOT/scripts/launch/atlas-run-restart.sh" \
      --log "$ATLAS_RUN_DIR/restarts.log" -- "${launch[@]}" >&"$out" 2>&1 &
    loop_pid=$!
    exec {out}>&-
    atlas_pass_usr1() {
      atlas_job_note "batch shell: SIGUSR1: asking the job to write a checkpoint and stop"
      local i
      for ((i = 0; i < 100; ++i)); do
        [[ -e $ready ]] && break
        sleep 0.1
      done
      kill -USR1 "$loop_pid" 2>/dev/null
    }
    trap atlas_pass_usr1 USR1
    # One that came while the loop was being started.
    if ((ATLAS_STOP_EARLY)); then atlas_pass_usr1; fi
    atlas_wait_child "$loop_pid"  # the USR1 trap may cut a wait short
    status=$?
    trap - USR1
    rm -f "$ready"
    wait "$tee_pid"
  fi
  atlas_job_note "atlas job $SLURM_JOB_ID: $ATLAS_CMD finished with status $status; run dir $ATLAS_RUN_DIR"
  # Stopped on request (a time limit's --signal, or scancel --signal=USR1 --batch): the job goes
  # back to the queue when asked, and the next run of this script resumes (SLURM_RESTART_COUNT).
  # A run without a checkpoint (device.backend = emulated) would start over on every requeue.
  if ((status == 8)) && [[ ${ATLAS_REQUEUE_ON_STOP:-0} == 1 ]]; then
    if grep -q '"checkpoint":null' "$ATLAS_RUN_DIR/run.json" 2>/dev/null; then
      atlas_job_note "not requeued: the run stopped without a checkpoint (device.backend = emulated), so a requeue would start it over"
    else
      # The note first: a requeue ends this batch shell (SIGTERM).
      atlas_job_note "requeued job $SLURM_JOB_ID (ATLAS_REQUEUE_ON_STOP=1): it resumes from the newest checkpoint"
      scontrol requeue "$SLURM_JOB_ID" ||
        atlas_job_note "ERROR: scontrol requeue $SLURM_JOB_ID failed: resume by hand with run.resume=latest" >&2
    fi
  fi
  return "$status"
}
