#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Kernel WAN emulation between DCs on one machine (this kernel has no netem; see MACHINE.md):
#   - one network namespace per DC (NAME-dcD, address 10.77.0.(D+1)/24 on its eth0), all joined
#     by veth to a Linux bridge in a namespace of its own (NAME-br);
#   - rate: an HTB class per ordered DC pair, with a deep FIFO, on the bridge's port towards the
#     destination DC (u32 filter on the source): the link's router, where whole TCP windows queue
#     in arrival order (ATLAS_WAN_SHAPE=sender: on each DC's own eth0 instead, the old emulation);
#   - one-way delay: on the receiving DC's INPUT hook, iptables -j NFQUEUE (one queue per source
#     DC, no --queue-bypass) read by atlas-wan-delay, which releases packets FIFO after the delay;
#   - per-flow limit (optional, stated): TCP window cap through the namespaces'
#     net.ipv4.tcp_rmem / tcp_wmem (wan.flow_window_bytes). Nothing is limited inside atlas.
# Only addresses inside the namespaces created here are used. Deleting a namespace removes its
# veth, qdiscs and iptables rules; `down` also stops the delayers it started (by pid).
#
# usage: netns.sh check
#        netns.sh up NAME --dcs N --latency-ms "L00 L01 .." --bandwidth-gbps "B00 B01 .."
#                         [--flow-window BYTES]
#        netns.sh down NAME
#        netns.sh rtt NAME FROM_DC TO_DC          (prints the median TCP-connect RTT in ms)
#        netns.sh exec NAME DC COMMAND [ARGS..]   (inside DC's namespace, with its own hostname)
#        netns.sh addr DC
#        netns.sh cost NAME                       (the delayers' CPU time and the bytes they delayed)
# Exit status 77 = this machine cannot emulate (the reason is printed).
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BIN="${ATLAS_BIN:-$REPO/build/bin}"
# ATLAS_BIN is the tools' directory here; the Slurm scripts take the atlas executable itself in it:
# that names its directory.
[[ -f $BIN ]] && BIN=$(dirname "$BIN")
STATE_ROOT="${ATLAS_WAN_STATE:-${TMPDIR:-/tmp}/atlas-wan}"
SUBNET_PREFIX=10.77.0

die() { echo "netns.sh: $*" >&2; exit 1; }
refuse() { echo "netns.sh: WAN emulation not possible here: $*" >&2; exit 77; }
addr() { echo "$SUBNET_PREFIX.$(($1 + 1))"; }

# ---- check: can this machine do it? ----
cmd_check() {
  [[ $(id -u) -eq 0 ]] || refuse "needs root (network namespaces, tc, iptables)"
  for t in ip tc iptables unshare; do
    command -v "$t" >/dev/null || refuse "'$t' is not installed (Debian: iproute2, iptables, util-linux)"
  done
  [[ -x "$BIN/atlas-wan-delay" && -x "$BIN/atlas-wan-probe" ]] ||
    refuse "atlas-wan-delay/atlas-wan-probe not found in $BIN (build first, or set ATLAS_BIN)"
  reap_orphans
  local probe="awchk$$"
  # An interrupt (a timeout's TERM, Ctrl-C) must not leave the probe namespace behind.
  trap 'ip netns del "$probe" 2>/dev/null; exit 130' INT
  trap 'ip netns del "$probe" 2>/dev/null; exit 143' TERM
  ip netns add "$probe" 2>/dev/null || refuse "cannot create a network namespace ('ip netns add' failed: no CAP_SYS_ADMIN, or a container without netns)"
  local ok=1 why=""
  if ! ip -n "$probe" link add eth0 type veth peer name eth1 2>/dev/null; then ok=0; why="veth devices are not available"; fi
  if [[ $ok -eq 1 ]] && ! tc -n "$probe" qdisc add dev eth0 root handle 1: htb default 1 2>/dev/null; then
    ok=0; why="tc htb is not available"; fi
  if [[ $ok -eq 1 ]] && ! ip netns exec "$probe" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num 0 2>/dev/null; then
    ok=0; why="iptables NFQUEUE target is not available"; fi
  if [[ $ok -eq 1 ]]; then
    set +e
    local out
    # Up to 3 s for its "ready" (as `up` waits): a loaded machine is slow to start it, and a fixed
    # 0.3 s made the emulated tests skip (exit 77) as if the machine could not emulate.
    out=$(ip netns exec "$probe" timeout 4 "$BIN/atlas-wan-delay" --queue 0 --delay-ms 1 2>&1 </dev/null &
          p=$!; for _ in $(seq 30); do sleep 0.1; kill -0 "$p" 2>/dev/null || break; done; kill "$p" 2>/dev/null
          wait "$p")
    set -e
    [[ $out == *ready* ]] || { ok=0; why="atlas-wan-delay cannot read a netfilter queue: $out"; }
  fi
  ip netns del "$probe" 2>/dev/null || true
  trap - INT TERM
  [[ $ok -eq 1 ]] || refuse "$why"
  echo "ok"
}

# ---- the state directory ----
# It holds what root runs later (run_emulated.sh's mpirun agent) and names the namespaces and
# processes `down` removes: it must be this user's own directory (made 0700 here), never one that
# another user created first in a shared /tmp, nor a symbolic link.
secure_state_root() {
  if [[ ! -e $STATE_ROOT && ! -L $STATE_ROOT ]]; then
    (umask 077 && mkdir -p "$STATE_ROOT") || die "cannot create the state directory $STATE_ROOT"
  fi
  [[ ! -L $STATE_ROOT ]] || die "the state directory $STATE_ROOT is a symbolic link: refusing it (set ATLAS_WAN_STATE to a directory of your own)"
  [[ -d $STATE_ROOT && -O $STATE_ROOT ]] ||
    die "the state directory $STATE_ROOT is not a directory owned by $(id -un): refusing it (another user may have made it; set ATLAS_WAN_STATE to a directory of your own)"
  local mode
  mode=$(stat -c %a "$STATE_ROOT") || die "cannot read the mode of $STATE_ROOT"
  (((8#$mode & 8#022) == 0)) ||
    die "the state directory $STATE_ROOT (mode $mode) is writable by other users: refusing it (chmod go-w $STATE_ROOT, or set ATLAS_WAN_STATE)"
}

# ---- emulations whose owner died (a test killed by ctest's timeout: SIGKILL, no trap ran) ----
# `up` records its owner's pid (ATLAS_WAN_OWNER_PID, run_emulated.sh's, else the caller's); an
# emulation whose owner is gone is removed, naming it. One without an owner file is left alone.
reap_orphans() {
  local dir owner
  for dir in "$STATE_ROOT"/*/; do
    [[ -f $dir/owner ]] || continue
    [[ $(basename "$dir") =~ ^[a-z][a-z0-9]{0,9}$ ]] || continue  # not one of ours (check_name)
    owner=$(<"$dir/owner")
    [[ $owner =~ ^[0-9]+$ ]] || continue
    kill -0 "$owner" 2>/dev/null && continue
    echo "netns.sh: removing emulation '$(basename "$dir")' left by a job that died (pid $owner)" >&2
    cmd_down "$(basename "$dir")" || true
  done
}

# ---- up ----
# An emulation's NAME: also a path under the state root, so "" or "../x" must never reach rm -rf.
check_name() {
  [[ ${#1} -le 10 && $1 =~ ^[a-z][a-z0-9]*$ ]] || die "NAME must be 1-10 lowercase letters/digits, not '$1'"
}

cmd_up() {
  local name="$1"; shift
  secure_state_root
  local dcs="" lat="" bw="" window=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --dcs) dcs="$2"; shift 2 ;;
      --latency-ms) lat="$2"; shift 2 ;;
      --bandwidth-gbps) bw="$2"; shift 2 ;;
      --flow-window) window="$2"; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  check_name "$name"
  [[ $dcs =~ ^[0-9]+$ && $dcs -ge 2 && $dcs -le 200 ]] || die "--dcs needs 2..200"
  read -r -a L <<<"$lat"
  read -r -a B <<<"$bw"
  [[ ${#L[@]} -eq $((dcs * dcs)) && ${#B[@]} -eq $((dcs * dcs)) ]] ||
    die "--latency-ms and --bandwidth-gbps need $((dcs * dcs)) entries (row-major) each"
  local shape="${ATLAS_WAN_SHAPE:-router}"
  [[ $shape == router || $shape == sender ]] || die "ATLAS_WAN_SHAPE must be router or sender, not '$shape'"
  # The link d -> e: its rate in kbit/s, and its HTB burst (100 us at the rate, at least one 64 KiB
  # GSO packet: a burst lets that many bytes through at the veth's own speed; with 2 ms, 250 KB at
  # 1 Gbit/s, a 128 KiB tensor crossed in 0.1 ms instead of the 1.05 ms the rate allows).
  link_kbit() {
    local g="${B[$(($1 * dcs + $2))]}" k
    k=$(awk -v g="$g" 'BEGIN { printf "%d", g * 1000000 }')
    [[ $k -gt 0 ]] || die "bandwidth from DC $1 to DC $2 is $g Gbit/s: must be > 0"
    echo "$k"
  }
  link_burst() {
    awk -v k="$(link_kbit "$1" "$2")" 'BEGIN { b = k * 1000 / 8 * 0.0001; if (b < 65536) b = 65536; printf "%d", b }'
  }
  for ((d = 0; d < dcs; d++)); do
    for ((e = 0; e < dcs; e++)); do [[ $e -eq $d ]] || link_kbit "$d" "$e" >/dev/null; done
  done
  # On device DEV of namespace NS: an HTB root whose default class (ARP, anything unmatched) is not
  # shaped (htb_root NS DEV), and the class CLASSID for the link d -> e (htb_link NS DEV CLASSID D E).
  htb_root() {
    tc -n "$1" qdisc add dev "$2" root handle 1: htb default 999
    tc -n "$1" class add dev "$2" parent 1: classid 1:999 htb rate 10gbit quantum 65536
  }
  htb_link() {
    local k b
    k=$(link_kbit "$4" "$5")
    b=$(link_burst "$4" "$5")
    tc -n "$1" class add dev "$2" parent 1: classid "$3" htb rate "${k}kbit" ceil "${k}kbit" burst "$b" cburst "$b" \
      quantum 65536
  }
  local state="$STATE_ROOT/$name"
  reap_orphans
  [[ ! -e $state ]] || die "emulation '$name' already exists ($state); run: $0 down $name"
  mkdir -p "$state"
  echo "$dcs" >"$state/dcs"
  echo "${ATLAS_WAN_OWNER_PID:-$PPID}" >"$state/owner"
  # Any failure or interrupt below tears down what exists so far.
  trap 'echo "netns.sh: setup of $name failed; removing it" >&2; cmd_down "$name"' ERR
  trap 'echo "netns.sh: setup of $name interrupted; removing it" >&2; cmd_down "$name"; exit 130' INT
  trap 'echo "netns.sh: setup of $name interrupted; removing it" >&2; cmd_down "$name"; exit 143' TERM

  local br="$name-br"
  echo "$br" >>"$state/namespaces"  # recorded first: an interrupt between the two leaks nothing
  ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((d = 0; d < dcs; d++)); do
    local ns="$name-dc$d"
    echo "$ns" >>"$state/namespaces"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "p$d" netns "$br"
    ip -n "$ns" addr add "$(addr "$d")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$br" link set "p$d" master br0
    ip -n "$br" link set "p$d" up
    # WAN-tuned hosts keep a connection's congestion window across idle gaps (Linux's default
    # restarts slow start after an idle RTO, which turns every pipeline transfer that follows a
    # compute slot into several round trips). Pipeline traffic is bursty by nature.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
    if [[ $window -gt 0 ]]; then
      # The stated per-flow limit: every TCP flow holds at most W = wan.flow_window_bytes in
      # flight, bounded by its send buffer (tcp_wmem max = W: sent but unacknowledged bytes stay
      # in it). The receive buffer must not be the bound: the kernel (6.x) advertises only
      # rcvbuf x scaling_ratio (payload / truesize of the received packets, 0.76 measured here)
      # as window, so a buffer of W let 195 KiB of a 256 KiB tensor fly and the rest waited one
      # more round trip. 4 W covers any ratio down to 1/4 (docs/wan.md section 4).
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 $((4 * window)) $((4 * window))"
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_wmem="4096 $window $window"
      # A warm window from the first byte, as the cost model assumes (rate window / RTT): the
      # route's initial congestion and receive windows are 2 W, so the congestion window never
      # binds before the send buffer does. Without them a flow grew its window by slow start, and
      # cubic's HyStart left it where queueing delay first rose: rails that warmed up side by side
      # (16 ranks at once) kept windows of 113-163 segments (164-236 KB < 256 KiB), and a tensor
      # on such a rail took an extra round trip. A loss (cubic: x 0.7) still leaves 1.4 W.
      # The route's window metric W as well: with the shaping at the router (below) a flow's
      # packets leave its host at once, and the send buffer alone let up to 2 W fly (ss: 357
      # segments unacknowledged, ablation_2dc_16 row (b) at 0.88 of its prediction); with the
      # metric 0.96, in flight per rail p90 1.04 W, p99 1.40 W, max 1.61 W (docs/wan.md section 4).
      local segs=$(((2 * window + 1447) / 1448))
      ip -n "$ns" route change "$SUBNET_PREFIX.0/24" dev eth0 proto kernel scope link src "$(addr "$d")" \
        initcwnd "$segs" initrwnd "$segs" window "$window"
    fi
  done
  # Rate, one HTB class per ordered DC pair (d -> e), everything else (ARP) unshaped.
  if [[ $shape == router ]]; then
    # At the router (default): on the bridge's port towards DC e, a class per source DC d with a
    # deep FIFO. A packet leaves its sender's namespace at once (crossing into the bridge's
    # namespace orphans it, so TCP small queues stop counting it against the socket), and a
    # flow's window enters the link's queue whole, as on a WAN where the hosts' NICs are far
    # faster than the link and the bottleneck router queues what arrives, in arrival order. A
    # queue of 2^17 packets holds every window the example decks put on one link at once.
    for ((e = 0; e < dcs; e++)); do
      local port="p$e"
      htb_root "$br" "$port"
      for ((d = 0; d < dcs; d++)); do
        [[ $e -ne $d ]] || continue
        local cls=$((d + 10))
        htb_link "$br" "$port" "1:$cls" "$d" "$e"
        tc -n "$br" qdisc add dev "$port" parent "1:$cls" handle "$cls:" pfifo limit 131072
        tc -n "$br" filter add dev "$port" parent 1: protocol ip prio 1 u32 \
          match ip src "$(addr "$d")/32" flowid "1:$cls"
      done
    done
  else
    # At the sender (ATLAS_WAN_SHAPE=sender, the emulation before 2026-12-05): on each DC's eth0,
    # a class per destination DC. TCP small queues then keep only about a millisecond of each
    # flow in the class's queue, so flows posted close together interleave on the link.
    for ((d = 0; d < dcs; d++)); do
      local ns="$name-dc$d"
      htb_root "$ns" eth0
      for ((e = 0; e < dcs; e++)); do
        [[ $e -ne $d ]] || continue
        htb_link "$ns" eth0 "1:$((e + 10))" "$d" "$e"
        tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 \
          match ip dst "$(addr "$e")/32" flowid "1:$((e + 10))"
      done
    done
  fi
  # Delay: packets arriving in DC d from DC e wait latency(e, d) ms in atlas-wan-delay.
  for ((d = 0; d < dcs; d++)); do
    local ns="$name-dc$d"
    for ((e = 0; e < dcs; e++)); do
      [[ $e -ne $d ]] || continue
      local ms="${L[$((e * dcs + d))]}"
      awk -v m="$ms" 'BEGIN { exit !(m > 0) }' || continue
      local log="$state/delay_${e}_to_${d}.log"
      # Real-time priority (else a high nice level): the delayer plays the wire, and a starved
      # delayer would add its scheduling latency to the emulated RTT on a busy machine.
      local prio=(nice -n -15)
      chrt -f 20 true 2>/dev/null && prio=(chrt -f 20)
      ip netns exec "$ns" "${prio[@]}" "$BIN/atlas-wan-delay" --queue "$e" --delay-ms "$ms" >"$log" 2>&1 &
      echo $! >>"$state/pids"
      local tries=0
      until grep -q ready "$log" 2>/dev/null; do
        sleep 0.05
        tries=$((tries + 1))
        if [[ $tries -gt 60 ]] || ! kill -0 "$!" 2>/dev/null; then
          echo "netns.sh: atlas-wan-delay for DC $e -> $d did not start:" >&2
          cat "$log" >&2
          false
        fi
      done
      ip netns exec "$ns" iptables -A INPUT -i eth0 -s "$(addr "$e")" -j NFQUEUE --queue-num "$e"
    done
  done
  trap - ERR INT TERM
  echo "netns.sh: emulation '$name' up: $dcs DCs on $SUBNET_PREFIX.0/24 (state in $state)" >&2
}

# ---- down (idempotent; also after a partial up) ----
cmd_down() {
  local name="${1:-}"
  check_name "$name"
  secure_state_root
  local state="$STATE_ROOT/$name"
  # The delayers run inside the namespaces: stopped with everything else there, below (never by
  # a recorded pid, which may belong to another process by now).
  local nss=()
  if [[ -f $state/namespaces ]]; then mapfile -t nss <"$state/namespaces"; fi
  for ns in "${nss[@]}"; do
    # Processes still inside our namespaces were started by this emulation's users (ranks,
    # probes): stop them by pid before the namespace goes.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
  done
  sleep 0.1
  local left=()
  for ns in "${nss[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    if [[ -e /run/netns/$ns ]]; then left+=("$ns"); fi
  done
  # A setting run_emulated.sh changed for the run (kernel.sched_autogroup_enabled), put back.
  if [[ -f $state/autogroup_restore ]]; then
    cat "$state/autogroup_restore" >/proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || true
  fi
  if ((${#left[@]} > 0)); then
    printf '%s\n' "${left[@]}" >"$state/namespaces"
    echo "netns.sh: could not delete namespace(s) ${left[*]} of emulation '$name'; run: ip netns del NAME" \
      "for each, then $0 down $name" >&2
    return 1
  fi
  rm -rf "$state"
}

# ---- rtt ----
cmd_rtt() {
  local name="$1" from="$2" to="$3"
  secure_state_root
  local state="$STATE_ROOT/$name"
  [[ -d $state ]] || die "no emulation named '$name'"
  local log="$state/probe_$$.log"
  ip netns exec "$name-dc$to" "$BIN/atlas-wan-probe" --listen "$(addr "$to"):0" --count 1000 >"$log" 2>&1 &
  local lpid=$!
  local tries=0
  until grep -q listening "$log" 2>/dev/null; do
    sleep 0.02
    tries=$((tries + 1))
    [[ $tries -lt 100 ]] || { kill "$lpid" 2>/dev/null; die "probe listener did not start: $(cat "$log")"; }
  done
  local hp
  hp=$(awk '/listening/ { print $2 }' "$log")
  local out rc=0
  out=$(ip netns exec "$name-dc$from" "$BIN/atlas-wan-probe" --connect "$hp" --count 5 2>&1) || rc=$?
  kill "$lpid" 2>/dev/null || true
  wait "$lpid" 2>/dev/null || true
  rm -f "$log"
  [[ $rc -eq 0 ]] || die "RTT probe DC $from -> DC $to failed: $out"
  echo "$out" | sed -n 's/.*median=\([0-9.]*\).*/\1/p'
}

# ---- cost: what the emulation's delayers spent so far ----
# Each atlas-wan-delay's CPU time (utime + stime of /proc/PID/stat) and the bytes of the packets
# its NFQUEUE rule passed (iptables counters), summed: prints "cpu_s BYTES" and a readable line on
# stderr. tc's HTB shaping and the veths run in the kernel's softirqs and are not counted.
cmd_cost() {
  local name="$1"
  secure_state_root
  local state="$STATE_ROOT/$name"
  [[ -d $state ]] || die "no emulation named '$name'"
  local tick cpu_ticks=0 bytes=0 pid stat
  tick=$(getconf CLK_TCK)
  if [[ -f $state/pids ]]; then
    while read -r pid; do
      stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
      stat=${stat##*) }  # the fields after "(comm) "; utime and stime are fields 14 and 15
      read -r -a f <<<"$stat"
      cpu_ticks=$((cpu_ticks + f[11] + f[12]))
    done <"$state/pids"
  fi
  local dcs d
  dcs=$(cat "$state/dcs")
  for ((d = 0; d < dcs; d++)); do
    local b
    b=$(ip netns exec "$name-dc$d" iptables -L INPUT -v -x -n 2>/dev/null | awk '$3 == "NFQUEUE" { s += $2 } END { print s + 0 }')
    bytes=$((bytes + b))
  done
  local cpu_s
  cpu_s=$(awk -v t="$cpu_ticks" -v h="$tick" 'BEGIN { printf "%.2f", t / h }')
  awk -v c="$cpu_s" -v b="$bytes" 'BEGIN {
    gbit = b * 8 / 1e9
    printf "netns.sh: emulation cost: atlas-wan-delay used %.2f CPU-s for %.3f Gbit delayed", c, gbit
    if (gbit >= 0.01) printf " (%.3f CPU-s per Gbit, i.e. %.1f%% of a core per Gbit/s)", c / gbit, 100 * c / gbit
    printf "\n" }' >&2
  echo "$cpu_s $bytes"
}

# ---- exec ----
cmd_exec() {
  local name="$1" d="$2"; shift 2
  exec ip netns exec "$name-dc$d" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$name-dc$d" \
    env ATLAS_WAN_DC="$d" ATLAS_WAN_BIND_HOST="$(addr "$d")" ATLAS_WAN_EMULATED=1 "$@"
}

case "${1:-}" in
  check) cmd_check ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  rtt) shift; cmd_rtt "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  addr) shift; addr "$1" ;;
  cost) shift; cmd_cost "$@" ;;
  *) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 1 ;;
esac
