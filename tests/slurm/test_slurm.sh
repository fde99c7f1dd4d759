#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# End-to-end test of scripts/slurm/: starts a private single-node Slurm (munged, slurmctld,
# slurmd from Debian's packages) on 127.0.0.1 with its own ports, sockets, pid files and state in
# a temp dir, submits two_dc.sbatch and scaling_sweep.sbatch, checks their output and run
# directories, then stops exactly the daemons it started. Never touches a Slurm or munge the
# machine already runs. Exits 77 (ctest SKIP_RETURN_CODE) with the reason when it cannot run.
# usage: test_slurm.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
ROOT=${1:?usage: test_slurm.sh SOURCE_DIR ATLAS_BIN}
ATLAS_BIN=${2:?usage: test_slurm.sh SOURCE_DIR ATLAS_BIN}
ROOT=$(cd "$ROOT" && pwd)
# The job: a short real training run of the 3-DC example deck; EXPECT_RE matches its OK footer.
ATLAS_CMD=${ATLAS_TEST_CMD:-train}
ATLAS_CMD_ARGS=${ATLAS_TEST_CMD_ARGS:-}
EXPECT_RE=${ATLAS_TEST_EXPECT_RE:-'^# OK: [0-9]+ steps, loss'}
DECK=inputs/three_dc_cpu.deck
NTASKS=6
JOB_TIMEOUT_S=120
SKIP=77

skip() {
  echo "SKIP: $*"
  exit "$SKIP"
}
die() {
  echo "FAIL: $*" >&2
  FAILED_CHECKS+=("$*")
  exit 1
}

# ---- prerequisites (each missing one is a skip with the exact reason) ----
for tool in munged slurmctld slurmd sbatch scontrol scancel; do
  command -v "$tool" >/dev/null ||
    skip "'$tool' not found on PATH ($PATH); install Debian's slurmctld slurmd slurm-client munge (scripts/install-deps.sh)"
done
[[ $(id -u) -eq 0 ]] || skip "slurmd must run as root to launch jobs, and this test runs as $(id -un)"
id munge >/dev/null 2>&1 || skip "user 'munge' does not exist (the munge package creates it)"
[[ -x $ATLAS_BIN ]] || die "atlas binary $ATLAS_BIN is not executable"
PY=/usr/bin/python3
[[ -x $PY ]] || skip "$PY not found (used to pick free TCP ports)"

# ---- private Slurm in a temp dir ----
T=$(mktemp -d /tmp/atlas-slurm-test.XXXXXX)
chmod 755 "$T" # munged runs as user munge and must reach its own subdirectory
JOBS=()
FAILED_CHECKS=()
cleanup() {
  local rc=$? j f pid
  for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null; done
  # slurmd first (it answers slurmctld while stopping), then slurmctld, then munged.
  for f in slurmd slurmctld munge/munged; do
    [[ -f $T/$f.pid ]] || continue
    pid=$(cat "$T/$f.pid")
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null && echo "# $f (pid $pid) did not stop on SIGTERM: killed"
  done
  if ((rc != 0 && rc != SKIP)); then
    # munged logs one "Unauthorized credential" line per credential it decodes: noise here.
    for f in "$T"/log/*.log "$T"/munge/munged.log; do
      [[ -f $f ]] && { echo "---- tail of $f"; grep -v 'Unauthorized credential' "$f" | tail -n 15; }
    done
    # Last, so that a log cut in the middle still shows it: what failed.
    if ((${#FAILED_CHECKS[@]})); then
      echo "---- failed checks (${#FAILED_CHECKS[@]}):"
      printf '  FAIL: %s\n' "${FAILED_CHECKS[@]}"
    fi
  fi
  if [[ ${ATLAS_TEST_KEEP:-0} == 1 ]]; then echo "# kept $T"; else rm -rf "$T"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Free TCP ports for slurmctld and slurmd (never Slurm's default 6817/6818, which a system Slurm
# may hold).
read -r CTLD_PORT SLURMD_PORT < <($PY -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
HOST=$(hostname -s)

mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/runs" "$T/tmp"
# Job ids name files outside the temp dir (pmix's /tmp/spmix_appdir_<uid>_<jobid>.<step>): start
# at a random id so two runs of this test never share one.
FIRST_JOB_ID=$((100000 + RANDOM * 16 + RANDOM % 16))
chown munge:munge "$T/munge"
chmod 755 "$T/munge" # clients need to reach the socket; munged checks it
# A fresh key for this test only (the machine's /etc/munge/munge.key is never read).
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$T/munge/munge.key"
chmod 400 "$T/munge/munge.key"
MUNGE_SOCKET=$T/munge/munge.socket
runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" >"$T/munge/start.txt" 2>&1 ||
  skip "munged cannot start here: $(tr '\n' ' ' <"$T/munge/start.txt")"
for _ in $(seq 50); do [[ -S $MUNGE_SOCKET ]] && break; sleep 0.1; done
[[ -S $MUNGE_SOCKET ]] || skip "munged started but its socket $MUNGE_SOCKET never appeared"

export SLURM_CONF=$T/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=atlastest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=600
FirstJobId=$FIRST_JOB_ID
TmpFS=$T/tmp
KillWait=5
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=atlastest Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF

slurmctld -f "$SLURM_CONF" >"$T/log/slurmctld.start" 2>&1 ||
  skip "slurmctld cannot start here: $(tr '\n' ' ' <"$T/log/slurmctld.start")"
slurmd -f "$SLURM_CONF" >"$T/log/slurmd.start" 2>&1 ||
  skip "slurmd cannot start here: $(tr '\n' ' ' <"$T/log/slurmd.start")"
up=0
for _ in $(seq 100); do
  if sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then up=1; break; fi
  sleep 0.1
done
((up)) || skip "the node never became idle: $(sinfo -N 2>&1 | tr '\n' ' ') $(tail -n 3 "$T/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"
echo "# private Slurm up: controller 127.0.0.1:$CTLD_PORT, slurmd :$SLURMD_PORT, node $HOST, conf $SLURM_CONF"

# ---- submit and wait (poll scontrol: sbatch --wait polls only every ~10 s) ----
export ATLAS_BIN ATLAS_CMD ATLAS_CMD_ARGS ATLAS_RUNS_DIR=$T/runs ATLAS_RESTART_BACKOFF_S=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$ROOT" || die "cannot cd to $ROOT"

# submit SCRIPT ARGS...: prints the job id
submit() {
  local script=$1
  shift
  sbatch --parsable --overcommit --ntasks=$NTASKS --output="$T/%x-%j.out" "$script" "$@" ||
    die "sbatch $script failed"
}
# wait_job ID: waits for the job to leave the queue; prints its final state
wait_job() {
  local id=$1 state=""
  for _ in $(seq $((JOB_TIMEOUT_S * 5))); do
    state=$(scontrol show job "$id" 2>/dev/null | grep -oP 'JobState=\K\S+')
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        return 0
        ;;
    esac
    sleep 0.2
  done
  echo "STILL_${state:-UNKNOWN}_AFTER_${JOB_TIMEOUT_S}s"
}

t0=$(date +%s.%N)
job=$(submit scripts/slurm/two_dc.sbatch "$DECK" train.micro_batches=4)
JOBS+=("$job")
state=$(wait_job "$job")
t1=$(date +%s.%N)
out=$T/atlas-multi-dc-$job.out
echo "# two_dc.sbatch: job $job ended $state after $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s"
echo "---- job output ($out) ----"
grep -vE '^#   ' "$out" 2>/dev/null # less the resolved deck's lines
echo "---- end of job output ----"
[[ $state == COMPLETED ]] || die "job $job ended $state (output above)"

# ---- checks ----
failures=0
section_failures=0 # failures before the section now checked
check() { # description command...
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAIL: $what" >&2
    failures=$((failures + 1))
    FAILED_CHECKS+=("$what")
  fi
}
# show_job ID FILE...: after a failed check, what Slurm and the job said (the job's own lines
# are in the files: its output, its run dir's job.log)
show_job() {
  local id=$1 f
  shift
  echo "---- scontrol show job $id"
  scontrol show job "$id" 2>&1 | grep -E 'JobState|Reason|Restarts|ExitCode|RunTime|BeginTime' | sed 's/^ */  /'
  echo "---- slurmctld on job $id"
  grep -F "JobId=$id" "$T/log/slurmctld.log" | tail -n 15
  for f in "$@"; do
    [[ -f $f ]] && { echo "---- tail of $f"; grep -vE '^#   ' "$f" | tail -n 25; }
  done
}
run_dir=$T/runs/three_dc_cpu_$job
check "the stand-in job's output matches /$EXPECT_RE/" grep -qE "$EXPECT_RE" "$out"
# One copy: 6 ranks ran, only world rank 0 printed, so srun --mpi=pmix wired up one MPI world.
check "exactly one rank printed the table (one MPI world of $NTASKS)" \
  test "$(grep -cE "$EXPECT_RE" "$out")" -eq 1
check "the override reached the job (4 micro-batches)" grep -q "4 micro-batches" "$out"
check "run dir $run_dir exists" test -d "$run_dir"
check "deck copied" cmp -s "$DECK" "$run_dir/three_dc_cpu.deck"
check "overrides recorded" grep -qx "train.micro_batches=4" "$run_dir/overrides.txt"
check "git commit recorded" grep -qE "^git_commit: ([0-9a-f]{40}|unknown)" "$run_dir/build_info.txt"
check "scontrol show job recorded" grep -q "JobId=$job " "$run_dir/scontrol_job.txt"
check "environment recorded (SLURM_JOB_ID, NCCL_SOCKET_IFNAME, OMPI_MCA_btl_tcp_if_include)" \
  bash -c "grep -qx 'SLURM_JOB_ID=$job' '$run_dir/env.txt' && grep -q '^NCCL_SOCKET_IFNAME=' '$run_dir/env.txt' && grep -qx 'OMPI_MCA_btl_tcp_if_include=lo' '$run_dir/env.txt'"
check "launch command recorded with srun --mpi=pmix and $NTASKS tasks" \
  grep -qE "^srun --mpi=pmix --ntasks=$NTASKS .* $ATLAS_CMD $DECK train.micro_batches=4 run.out_dir=" "$run_dir/command.txt"
check "WAN key file made owner-only (mode 600, 32 bytes) in the run dir" \
  bash -c "[[ \$(stat -c %a '$run_dir/wan.key') == 600 && \$(stat -c %s '$run_dir/wan.key') == 32 ]]"
check "the launch names the key file" grep -q "wan.key_file=$run_dir/wan.key" "$run_dir/command.txt"
check "restart log: one attempt, status 0" grep -q "attempt 1 exited with status 0 (ok)" "$run_dir/restarts.log"
check "job.log holds the job's output (and atlas's own log.txt)" grep -qE "$EXPECT_RE" "$run_dir/job.log" "$run_dir/log.txt"

# ---- what the job holds per node, as common.sh reads it from this Slurm's `scontrol show job
# -d` (the per-DC hostfile's check): an overcommitted job holds one CPU of the node, no GPU ----
printf '#!/usr/bin/env bash\nscontrol show job -d "$SLURM_JOB_ID" >"%s/caps-raw.txt"\nsource "%s/scripts/slurm/common.sh" && atlas_job_node_caps\n' "$T" "$ROOT" >"$T/caps.sbatch"
cjob=$(sbatch --parsable --overcommit --ntasks=$NTASKS --output="$T/%x-%j.out" --job-name=atlas-caps \
  "$T/caps.sbatch") || die "sbatch $T/caps.sbatch failed"
JOBS+=("$cjob")
state=$(wait_job "$cjob")
echo "# atlas_job_node_caps in job $cjob ($state): $(cat "$T/atlas-caps-$cjob.out")"
check "the job's nodes read from scontrol show job -d: $HOST, 1 CPU, no GPU" \
  grep -qx "$HOST 1 -" "$T/atlas-caps-$cjob.out"
grep -qx "$HOST 1 -" "$T/atlas-caps-$cjob.out" || cat "$T/caps-raw.txt"

# ---- the sweep: two points as a loop in one allocation, launched by mpirun with per-DC
# placement from a hostfile (every DC on this host) ----
export ATLAS_SWEEP="parallel.dp_size=1;parallel.dp_size=2"
sjob=$(ATLAS_LAUNCHER=mpirun ATLAS_DC_NODES="$HOST $HOST $HOST" \
  submit scripts/slurm/scaling_sweep.sbatch "$DECK")
JOBS+=("$sjob")
state=$(wait_job "$sjob")
sout=$T/atlas-sweep-$sjob.out
echo "# scaling_sweep.sbatch: job $sjob ended $state"
if [[ $state == COMPLETED ]]; then grep -E '^# (sweep|----)|ranks, DCs' "$sout"; else cat "$sout"; fi
check "sweep job completed" test "$state" = COMPLETED
check "sweep point 0 ran 3 ranks (dp 1)" grep -q "3 ranks, DCs east west south" "$sout"
check "sweep point 1 ran 6 ranks (dp 2)" grep -q "6 ranks, DCs east west south" "$sout"
check "sweep: both points succeeded" grep -q "^# sweep: 2 point(s), 0 failed" "$sout"
check "sweep run dirs p0 and p1" test -d "$T/runs/three_dc_cpu_${sjob}_p0" -a -d "$T/runs/three_dc_cpu_${sjob}_p1"
check "sweep point 1: hostfile places 6 ranks on $HOST" \
  test "$(grep -cx "$HOST" "$T/runs/three_dc_cpu_${sjob}_p1/hostfile")" -eq 6
check "sweep point 1: mpirun with the sequential mapper" \
  grep -qE "^env -u OMPI_MCA_rmaps_base_oversubscribe mpirun -np 6 --hostfile .*/hostfile --mca rmaps seq " "$T/runs/three_dc_cpu_${sjob}_p1/command.txt"
check "sweep point 1: one MPI world printed the table once" \
  test "$(grep -cE "$EXPECT_RE" "$T/runs/three_dc_cpu_${sjob}_p1/job.log")" -eq 1
((failures > section_failures)) && show_job "$sjob" "$sout"
section_failures=$failures

# ---- a killed rank is restarted with run.resume=latest ----
# A wrapper that SIGKILLs world rank 0 on the first attempt (the restart appends run.resume=latest;
# then it runs atlas), so the restart path is checked through a real srun.
cat >"$T/flaky_atlas.sh" <<EOF
#!/usr/bin/env bash
for a in "\$@"; do [[ \$a == run.resume=latest ]] && exec "$ATLAS_BIN" "\$@"; done
if [[ \${SLURM_PROCID:-0} == 0 ]]; then kill -KILL \$\$; fi
exec "$ATLAS_BIN" "\$@"
EOF
chmod +x "$T/flaky_atlas.sh"
kjob=$(ATLAS_BIN=$T/flaky_atlas.sh submit scripts/slurm/two_dc.sbatch "$DECK")
JOBS+=("$kjob")
state=$(wait_job "$kjob")
kout=$T/atlas-multi-dc-$kjob.out
echo "# two_dc.sbatch with rank 0 killed on the first attempt: job $kjob ended $state"
grep -E 'atlas-run-restart|srun: error' "$kout"
check "the job with a killed rank completed after a restart" test "$state" = COMPLETED
check "attempt 1 failed with a signal or abort status" \
  grep -qE 'attempt 1 exited with status [1-9][0-9]* [(](killed by signal|launcher or MPI abort)' "$kout"
check "attempt 2 ran with run.resume=latest and succeeded" \
  bash -c "grep -q 'attempt 2/4: .* run.resume=latest' '$kout' && grep -q 'attempt 2 exited with status 0 (ok)' '$kout'"
check "the restarted job printed the table once" test "$(grep -cE "$EXPECT_RE" "$kout")" -eq 1
((failures > section_failures)) && show_job "$kjob" "$kout"
section_failures=$failures

# ---- a deck error fails the job once: exit 2 is not retried ----
ejob=$(submit scripts/slurm/two_dc.sbatch "$DECK" model.heads=5)
JOBS+=("$ejob")
state=$(wait_job "$ejob")
eout=$T/atlas-multi-dc-$ejob.out
echo "# two_dc.sbatch with model.heads=5: job $ejob ended $state"
grep -E 'ERROR|atlas-run-restart' "$eout"
check "a bad override fails the job" test "$state" = FAILED
check "the job output names the bad key" grep -q 'ERROR: .*heads' "$eout"
check "attempt 1 exited with the config error's status 2" \
  grep -q 'attempt 1 exited with status 2 (config error)' "$eout"
check "a config error is not restarted" bash -c "! grep -q 'attempt 2/' '$eout'"
((failures > section_failures)) && show_job "$ejob" "$eout"
section_failures=$failures

# ---- a SIGUSR1 during the set-up, before the launch: noted, nothing launched, status 8 ----
# (it used to end the batch shell: SIGUSR1's default action). The set-up's `module load` (an
# exported function here) sends it, so it comes at a known point.
if [[ $ATLAS_CMD == train ]]; then
  module() { kill -USR1 $$; }
  export -f module
  ujob=$(ATLAS_MODULES=fake submit scripts/slurm/two_dc.sbatch "$DECK")
  unset -f module
  JOBS+=("$ujob")
  state=$(wait_job "$ujob")
  urun=$T/runs/three_dc_cpu_$ujob
  echo "# two_dc.sbatch with a SIGUSR1 during its set-up: job $ujob ended $state"
  check "a SIGUSR1 before the launch is noted and nothing is launched" \
    bash -c "grep -q 'batch shell: SIGUSR1 before the launch: train not started (stopped on request' '$urun/job.log' && ! grep -q 'attempt 1/' '$urun/job.log' '$T/atlas-multi-dc-$ujob.out'"
  check "the job ends with the stop's status 8" grep -q "train finished with status 8" "$urun/job.log"
  ((failures > section_failures)) && show_job "$ujob" "$T/atlas-multi-dc-$ujob.out"
  section_failures=$failures
fi

# ---- a stop on request (what --signal=B:USR1@N does before the time limit), then a requeue ----
# The batch shell gets SIGUSR1 (scancel --signal=USR1 --batch), passes it to the restart loop,
# srun passes it to the ranks: they write a checkpoint and stop (exit 8); ATLAS_REQUEUE_ON_STOP=1
# requeues the job, whose second run resumes (SLURM_RESTART_COUNT) and finishes. Per-DC placement
# (ATLAS_DC_NODES: srun's arbitrary distribution from a hostfile), so the requeued run writes its
# own hostfile (requeue-1/) and leaves the first run's.
if [[ $ATLAS_CMD == train ]]; then
  qjob=$(ATLAS_REQUEUE_ON_STOP=1 ATLAS_DC_NODES="$HOST $HOST $HOST" submit scripts/slurm/two_dc.sbatch "$DECK" \
    run.steps=16 run.log_every_steps=1 ckpt.every_steps=0 train.eval_every_steps=0)
  JOBS+=("$qjob")
  qrun=$T/runs/three_dc_cpu_$qjob
  for _ in $(seq $((JOB_TIMEOUT_S * 10))); do
    [[ -f $qrun/metrics.csv ]] && (($(wc -l <"$qrun/metrics.csv") >= 3)) && break
    sleep 0.1
  done
  scancel --signal=USR1 --batch "$qjob" || echo "FAIL: scancel --signal=USR1 --batch $qjob"
  # Slurm holds a requeued job back for about two minutes (BeginTime); release it as soon as the
  # first run's step has gone (its pmix socket removed: the requeued job's step has the same id).
  for _ in $(seq $((JOB_TIMEOUT_S * 10))); do
    grep -q "requeued job $qjob" "$qrun/job.log" 2>/dev/null &&
      scontrol show job "$qjob" 2>/dev/null | grep -q 'JobState=PENDING' &&
      ! compgen -G "$T/spool/stepd.slurm.pmix.$qjob.*" >/dev/null && break
    sleep 0.1
  done
  # slurmd revokes the first run's job credential at the requeue, with a time in whole seconds,
  # and refuses a credential issued in the same second ("Killing non-startable batch JobId=...:
  # Job credential revoked", the job FAILED): start the second run at least 2 s after it.
  sleep 2
  # The first run's record says another binary ran it: the requeued run must say it changed.
  sed -i 's/^atlas_bin_sha256: .*/atlas_bin_sha256: 0000/' "$qrun/build_info.txt"
  scontrol update JobId="$qjob" StartTime=now || echo "FAIL: scontrol update JobId=$qjob StartTime=now"
  state=$(wait_job "$qjob")
  echo "# two_dc.sbatch stopped by SIGUSR1 and requeued: job $qjob ended $state"
  grep -E 'atlas-run-restart|SIGUSR1|stop requested|STOPPED|requeue|resum|^# OK' "$qrun/job.log"
  check "the stopped job was requeued and completed" test "$state" = COMPLETED
  check "the batch shell passed SIGUSR1 on" grep -q "batch shell: SIGUSR1" "$qrun/job.log"
  check "the ranks stopped with a checkpoint (exit 8, not restarted in the allocation)" \
    bash -c "grep -q '^# stop requested (SIGUSR1, seen by [1-6] of 6 ranks)' '$qrun/job.log' && grep -q 'attempt 1 exited with status 8 (stopped on request' '$qrun/job.log' && ! grep -q 'attempt 2/' '$qrun/job.log'"
  check "the job requeued itself" grep -q "requeued job $qjob (ATLAS_REQUEUE_ON_STOP=1)" "$qrun/job.log"
  check "its second run resumed from the stop's checkpoint and finished" \
    bash -c "grep -q 'SLURM_RESTART_COUNT=1' '$qrun/job.log' && grep -q '^# resumed from .*step-0000[0-9][0-9].h5' '$qrun/job.log' && grep -q '^# OK: ' '$qrun/job.log'"
  check "run.json says OK after the resumed run" grep -q '"status":"OK"' "$qrun/run.json"
  check "the requeued run recorded its provenance in requeue-1/, the first run's kept" \
    bash -c "grep -q 'run.resume=latest' '$qrun/requeue-1/command.txt' && ! grep -q 'run.resume=latest' '$qrun/command.txt' && grep -q '^atlas_bin_sha256: 0000$' '$qrun/build_info.txt' && grep -q 'SLURM_RESTART_COUNT=1' '$qrun/requeue-1/env.txt' && test -s '$qrun/requeue-1/overrides.txt'"
  check "each run placed its 6 ranks from a hostfile of its own (the first run's kept)" \
    bash -c "test \$(grep -cx '$HOST' '$qrun/hostfile') -eq 6 && test \$(grep -cx '$HOST' '$qrun/requeue-1/hostfile') -eq 6 && grep -q -- '--distribution=arbitrary' '$qrun/requeue-1/command.txt'"
  check "and said the binary changed since the first run" \
    grep -q "WARNING: .* changed since the job's first run (sha256 0000, now $(sha256sum "$ATLAS_BIN" | cut -d' ' -f1))" "$qrun/job.log"
  ((failures > section_failures)) && show_job "$qjob" "$qrun/job.log" "$qrun/restarts.log"
  section_failures=$failures

  # The sweep passes a SIGUSR1 to its running point (which stops with a checkpoint) and skips the
  # points after it; its status counts both as not done.
  wjob=$(ATLAS_SWEEP="parallel.dp_size=1 run.steps=200 run.log_every_steps=1 ckpt.every_steps=0;parallel.dp_size=1" \
    ATLAS_LAUNCHER=mpirun ATLAS_DC_NODES="$HOST $HOST $HOST" submit scripts/slurm/scaling_sweep.sbatch "$DECK")
  JOBS+=("$wjob")
  wrun=$T/runs/three_dc_cpu_${wjob}_p0
  for _ in $(seq $((JOB_TIMEOUT_S * 10))); do
    [[ -f $wrun/metrics.csv ]] && (($(wc -l <"$wrun/metrics.csv") >= 3)) && break
    sleep 0.1
  done
  scancel --signal=USR1 --batch "$wjob" || echo "FAIL: scancel --signal=USR1 --batch $wjob"
  state=$(wait_job "$wjob")
  wout=$T/atlas-sweep-$wjob.out
  echo "# scaling_sweep.sbatch stopped by SIGUSR1: job $wjob ended $state"
  grep -E '^# (sweep|----)|SIGUSR1|stop requested|STOPPED' "$wout"
  check "the sweep's batch shell passed SIGUSR1 to its running point" grep -q "^# sweep: SIGUSR1: stopping the running point" "$wout"
  check "point 0 stopped with a checkpoint (status 8)" \
    bash -c "grep -q '^# stop requested (SIGUSR1' '$wrun/job.log' && grep -q '^# sweep point 0 (.*): status 8$' '$wout'"
  check "point 1 was skipped" grep -q "^# sweep point 1: skipped (stop requested)" "$wout"
  check "the sweep's status counts both points (FAILED, 2 not done)" \
    bash -c "[[ '$state' == FAILED ]] && grep -q '^# sweep: 2 point(s), 2 failed' '$wout'"
  ((failures > section_failures)) && show_job "$wjob" "$wout"
  section_failures=$failures
fi

if ((failures)); then die "$failures check(s) failed"; fi
echo "all Slurm checks passed"
