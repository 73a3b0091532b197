#!/usr/bin/env bash
# Test hosts on this machine: network namespaces on one bridge, for the tests that run a
# trainer and its nodes on different hosts (tests/tests/hosts.rs), and faults between them.
#
#   scripts/hosts.sh up [N]          N hosts (default 3): namespaces rollout-h0 .. rollout-h<N-1>,
#                                    10.77.0.1 .. 10.77.0.N, each with one veth (eth0) to a bridge
#                                    living in a namespace of its own (rollout-hbr)
#   scripts/hosts.sh down            removes every namespace made by `up` (and the SLURM
#                                    cluster of `slurm-up`), whatever is left of them
#   scripts/hosts.sh status          the hosts, their addresses and faults
#   scripts/hosts.sh addr HOST       the address of HOST (0, 1, .. or rollout-h1)
#   scripts/hosts.sh cut HOST [PORT] HOST is cut off: nftables in its namespace drops every
#                                    packet in and out of eth0 (its processes keep running);
#                                    with PORT, only TCP to and from that remote port
#   scripts/hosts.sh restore HOST    undoes `cut`
#   scripts/hosts.sh slow HOST RATE [BURST]  tc tbf limits HOST's link to RATE (e.g. 2mbit) both ways,
#                                    BURST bytes at once (default 32kbit; gbit rates need ~1 ms of RATE)
#   scripts/hosts.sh loss HOST P     nftables drops P % of HOST's packets at random, both ways
#   scripts/hosts.sh clear HOST      removes every fault of HOST (cut, slow, loss)
#   scripts/hosts.sh dropped HOST    the packets HOST's cut and loss rules dropped so far
#   scripts/hosts.sh slurm-up        a SLURM cluster across the hosts: slurmctld on rollout-h0,
#                                    one slurmd per other host (see below)
#   scripts/hosts.sh slurm-down      stops that cluster's daemons and removes its files
#
# A command runs on host 1 with `ip netns exec rollout-h1 CMD`, or `nsenter
# --net=/run/netns/rollout-h1 CMD`, which keeps the machine's /sys (cgroups included); the
# file system is the machine's, shared by every host.
#
# Addresses exist only inside these namespaces: nothing is added to the machine's own network.
# Every command is idempotent (`up` twice leaves one set of hosts, `down` when nothing is up
# succeeds) and every wait is bounded (HOSTS_WAIT seconds, default 30). Needs root, `ip`
# (iproute2), `nft` (nftables) and `tc`; `slurm-up` needs slurm-wlm and munge
# (scripts/slurm-local.sh installs them).
#
# SLURM across hosts: Debian's slurmd is built without --enable-multiple-slurmd, so a slurmd
# takes its node name from the host name. Each slurmd runs in its host's network namespace AND
# a UTS namespace of its own (`unshare --uts`, host name = the namespace's name), so it is
# node rollout-hN, reached at 10.77.0.N+1; the jobs it starts run inside that host. The
# controller runs in rollout-h0 under the machine's host name at 10.77.0.1. The cluster's
# files are under /run/rollout-hosts/ (slurm.conf: use it with SLURM_CONF), apart from the
# one-node cluster of scripts/slurm-local.sh (/etc/slurm), which keeps running beside it.
# munged is shared: its socket is a file path, reachable from every network namespace.
set -euo pipefail

WAIT="${HOSTS_WAIT:-30}"
PREFIX=rollout-h
BRIDGE_NS=rollout-hbr
NET=10.77.0
RUN=/run/rollout-hosts
CONF="$RUN/slurm.conf"
NODE_CPUS=2

die() {
  echo "hosts: error: $*" >&2
  exit 1
}
say() { echo "hosts: $*" >&2; }

need_root() { [[ "$(id -u)" == 0 ]] || die "run me as root (network namespaces need it)"; }
need() {
  local tool="$1" pkg="$2"
  command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is missing: apt-get install $pkg (scripts/test.sh does)"
}

# Waits (bounded) until "$@" succeeds; dies naming WHAT otherwise.
wait_for() {
  local what="$1"
  shift
  local end=$((SECONDS + WAIT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      die "$what did not happen within ${WAIT} s"
    fi
    sleep 0.2
  done
}

# The namespace of HOST: `1` or `rollout-h1`.
ns_of() {
  local h="$1"
  [[ "$h" =~ ^[0-9]+$ ]] && h="$PREFIX$h"
  [[ "$h" =~ ^${PREFIX}[0-9]+$ ]] || die "no such host '$1' (a number, or ${PREFIX}N)"
  ip netns list | awk '{print $1}' | grep -x "$h" >/dev/null || die "host $h is not up (scripts/hosts.sh up)"
  echo "$h"
}
num_of() { echo "${1#"$PREFIX"}"; }
addr_of() { echo "$NET.$(($(num_of "$1") + 1))"; }

our_namespaces() { ip netns list | awk '{print $1}' | grep -E "^(${PREFIX}[0-9]+|$BRIDGE_NS)\$" || true; }
our_hosts() { ip netns list | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" | sort -V || true; }

link_up() { ip -n "$1" -o link show "$2" | grep -q 'state UP'; }

cmd_up() {
  local n="${1:-3}"
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "up: N must be 1..200, not '$n'"
  need_root
  need ip iproute2
  need nft nftables
  need tc iproute2
  if ! ip netns list | awk '{print $1}' | grep -x "$BRIDGE_NS" >/dev/null; then
    ip netns add "$BRIDGE_NS"
  fi
  ip -n "$BRIDGE_NS" link set lo up
  if ! ip -n "$BRIDGE_NS" link show br0 >/dev/null 2>&1; then
    ip -n "$BRIDGE_NS" link add br0 type bridge
  fi
  ip -n "$BRIDGE_NS" link set br0 up
  local i ns
  for ((i = 0; i < n; i++)); do
    ns="$PREFIX$i"
    if ! ip netns list | awk '{print $1}' | grep -x "$ns" >/dev/null; then
      ip netns add "$ns"
    fi
    ip -n "$ns" link set lo up
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      # Both ends are made inside the namespaces: nothing appears in the machine's own.
      ip -n "$BRIDGE_NS" link del "v$i" >/dev/null 2>&1 || true
      ip -n "$ns" link add eth0 type veth peer name "v$i" netns "$BRIDGE_NS"
    fi
    ip -n "$BRIDGE_NS" link set "v$i" master br0
    ip -n "$BRIDGE_NS" link set "v$i" up
    ip -n "$ns" addr replace "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # Every link up at both ends (carrier on the pair, the bridge forwarding).
  for ((i = 0; i < n; i++)); do
    wait_for "$PREFIX$i's link up" link_up "$PREFIX$i" eth0
    wait_for "the bridge's end of $PREFIX$i's link up" link_up "$BRIDGE_NS" "v$i"
  done
  wait_for "the bridge up" link_up "$BRIDGE_NS" br0
  say "up: $n hosts (${PREFIX}0..${PREFIX}$((n - 1)), $NET.1..$NET.$n) on bridge br0 in $BRIDGE_NS"
}

cmd_down() {
  need_root
  cmd_slurm_down
  local ns pid
  for ns in $(our_namespaces); do
    # Processes left inside a host (a test killed mid-run) go with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$ns" 2>/dev/null || true
  done
  wait_for "the test hosts gone" test -z "$(our_namespaces)"
  say "down"
}

cmd_status() {
  local ns
  local hosts
  hosts="$(our_hosts)"
  [[ -n "$hosts" ]] || {
    echo "no test hosts"
    return 0
  }
  for ns in $hosts; do
    local faults=""
    ip netns exec "$ns" nft list table inet rollout_cut >/dev/null 2>&1 && faults+=" cut"
    ip netns exec "$ns" nft list table inet rollout_loss >/dev/null 2>&1 && faults+=" loss"
    tc -n "$ns" qdisc show dev eth0 2>/dev/null | grep -q tbf && faults+=" slow"
    echo "$ns $(addr_of "$ns")${faults:- ok}"
  done
}

cmd_cut() {
  local ns port="${2:-}" what=""
  ns="$(ns_of "$1")"
  # With PORT only that TCP port: the host keeps every other path (SLURM's, say), as in a
  # partial partition.
  local in_match="" out_match=""
  if [[ -n "$port" ]]; then
    [[ "$port" =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) || die "cut: PORT must be 1..65535, not '$port'"
    what=" from tcp port $port"
    in_match="tcp sport $port "
    out_match="tcp dport $port "
  fi
  ip netns exec "$ns" nft -f - <<EOF
table inet rollout_cut
delete table inet rollout_cut
table inet rollout_cut {
  chain input { type filter hook input priority -10; policy accept; iifname "eth0" ${in_match}counter drop; }
  chain output { type filter hook output priority -10; policy accept; oifname "eth0" ${out_match}counter drop; }
}
EOF
  say "$ns cut off$what"
}

cmd_restore() {
  local ns
  ns="$(ns_of "$1")"
  ip netns exec "$ns" nft delete table inet rollout_cut 2>/dev/null || true
  say "$ns restored"
}

cmd_slow() {
  local ns rate="${2:-}" burst="${3:-32kbit}"
  ns="$(ns_of "$1")"
  [[ "$rate" =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] || die "slow: RATE like 2mbit, not '$rate'"
  [[ "$burst" =~ ^[0-9]+(b|kb|mb|kbit|mbit)$ ]] || die "slow: BURST like 32kbit or 2mb, not '$burst'"
  local i
  i="$(num_of "$ns")"
  # The host's egress on its eth0, its ingress on the bridge's end of the pair.
  tc -n "$ns" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 500ms
  tc -n "$BRIDGE_NS" qdisc replace dev "v$i" root tbf rate "$rate" burst "$burst" latency 500ms
  say "$ns slowed to $rate"
}

cmd_loss() {
  local ns p="${2:-}"
  ns="$(ns_of "$1")"
  [[ "$p" =~ ^[0-9]+$ ]] && ((p <= 100)) || die "loss: P must be 0..100, not '$p'"
  ip netns exec "$ns" nft -f - <<EOF
table inet rollout_loss
delete table inet rollout_loss
table inet rollout_loss {
  chain input { type filter hook input priority -5; policy accept; iifname "eth0" numgen random mod 100 < $p counter drop; }
  chain output { type filter hook output priority -5; policy accept; oifname "eth0" numgen random mod 100 < $p counter drop; }
}
EOF
  say "$ns drops $p % of its packets"
}

# The packets HOST's faults dropped so far (nftables counters of `cut` and `loss`).
cmd_dropped() {
  local ns
  ns="$(ns_of "$1")"
  { ip netns exec "$ns" nft list table inet rollout_cut 2>/dev/null || true
    ip netns exec "$ns" nft list table inet rollout_loss 2>/dev/null || true
  } | awk '{ for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }'
}

cmd_clear() {
  local ns i
  ns="$(ns_of "$1")"
  i="$(num_of "$ns")"
  ip netns exec "$ns" nft delete table inet rollout_cut 2>/dev/null || true
  ip netns exec "$ns" nft delete table inet rollout_loss 2>/dev/null || true
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$BRIDGE_NS" qdisc del dev "v$i" root 2>/dev/null || true
  say "$ns has no faults"
}

# --- SLURM across the hosts -------------------------------------------------------------

slurm_node_names() { our_hosts | grep -vx "${PREFIX}0" || true; }

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_slurm_up() {
  need_root
  need slurmctld "slurm-wlm (scripts/slurm-local.sh installs it)"
  need slurmd "slurm-wlm (scripts/slurm-local.sh installs it)"
  need munge munge
  local nodes
  nodes="$(slurm_node_names)"
  [[ -n "$nodes" ]] || die "slurm-up: no node hosts (scripts/hosts.sh up 3 first)"
  bash -c 'munge -n | unmunge' >/dev/null 2>&1 || die "munged is not answering (scripts/slurm-local.sh starts it)"
  local host
  host="$(hostname)"
  mkdir -p "$RUN/slurmctld" "$RUN/log"
  local real_mem=1000
  {
    echo "# Written by scripts/hosts.sh: SLURM across the test hosts (use with SLURM_CONF=$CONF)."
    echo "ClusterName=rollouthosts"
    echo "SlurmctldHost=${host}($NET.1)"
    cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core,CR_LLN
SchedulerType=sched/backfill
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=10
MessageTimeout=3
InactiveLimit=0
KillWait=2
MinJobAge=300
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$RUN/slurmctld
SlurmdSpoolDir=$RUN/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$RUN/log/slurmctld.log
SlurmdLogFile=$RUN/log/slurmd-%n.log
EOF
    for ns in $nodes; do
      echo "NodeName=$ns NodeAddr=$(addr_of "$ns") CPUs=$NODE_CPUS RealMemory=$real_mem State=UNKNOWN"
    done
    echo "PartitionName=hosts Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
  } >"$CONF.new"
  if ! cmp -s "$CONF.new" "$CONF"; then
    # A changed config needs fresh daemons.
    mv "$CONF.new" "$CONF"
    stop_slurm_daemons
  else
    rm -f "$CONF.new"
  fi
  export SLURM_CONF="$CONF"
  if ! pid_alive "$RUN/slurmctld.pid"; then
    say "starting slurmctld in ${PREFIX}0"
    ip netns exec "${PREFIX}0" env SLURM_CONF="$CONF" /usr/sbin/slurmctld
  fi
  wait_for "slurmctld answering in ${PREFIX}0 (scontrol ping)" \
    bash -c "ip netns exec ${PREFIX}0 env SLURM_CONF=$CONF scontrol ping | grep -q UP"
  for ns in $nodes; do
    mkdir -p "$RUN/slurmd-$ns"
    if ! pid_alive "$RUN/slurmd-$ns.pid"; then
      say "starting slurmd in $ns"
      # Its own host name (UTS namespace): slurmd is the node its host name says. nsenter,
      # not `ip netns exec`: that one mounts a fresh /sys, without the cgroup file systems
      # slurmd needs.
      nsenter --net="/run/netns/$ns" unshare --uts \
        sh -c "hostname $ns && exec env SLURM_CONF=$CONF /usr/sbin/slurmd"
    fi
  done
  local end=$((SECONDS + WAIT)) ns state ok
  while :; do
    ok=1
    for ns in $nodes; do
      state="$(slurm_in "${PREFIX}0" sinfo -h -n "$ns" -o '%T' 2>/dev/null | head -n1)"
      if [[ "$state" =~ ^(down|drain) ]]; then
        slurm_in "${PREFIX}0" scontrol update NodeName="$ns" State=RESUME >/dev/null 2>&1 || true
      fi
      [[ "$state" =~ ^(idle|mixed|allocated) ]] || ok=0
    done
    ((ok)) && break
    if ((SECONDS >= end)); then
      tail -n 20 "$RUN"/log/*.log >&2 || true
      die "the SLURM nodes are not idle after ${WAIT} s: $(slurm_in "${PREFIX}0" sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    fi
    sleep 0.2
  done
  say "slurm up: controller at $NET.1 in ${PREFIX}0, nodes $(echo "$nodes" | tr '\n' ' ')(SLURM_CONF=$CONF)"
}

# Runs a SLURM command of this cluster inside host NS.
slurm_in() {
  local ns="$1"
  shift
  ip netns exec "$ns" env SLURM_CONF="$CONF" "$@"
}

# Stops this cluster's daemons by their pid files (never those of scripts/slurm-local.sh).
stop_slurm_daemons() {
  local f pids=()
  for f in "$RUN"/slurmctld.pid "$RUN"/slurmd-*.pid; do
    [[ -s "$f" ]] || continue
    local pid
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local end=$((SECONDS + WAIT)) pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS >= end)); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.2
    done
  done
  rm -f "$RUN"/slurmctld.pid "$RUN"/slurmd-*.pid
}

cmd_slurm_down() {
  need_root
  [[ -d "$RUN" ]] || return 0
  stop_slurm_daemons
  rm -rf "$RUN"
}

main() {
  local cmd="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  addr) addr_of "$(ns_of "${1:?addr HOST}")" ;;
  cut) cmd_cut "${1:?cut HOST [PORT]}" "${2:-}" ;;
  restore) cmd_restore "${1:?restore HOST}" ;;
  slow) cmd_slow "${1:?slow HOST RATE [BURST]}" "${2:-}" "${3:-}" ;;
  loss) cmd_loss "${1:?loss HOST P}" "${2:-}" ;;
  clear) cmd_clear "${1:?clear HOST}" ;;
  dropped) cmd_dropped "${1:?dropped HOST}" ;;
  slurm-up) cmd_slurm_up ;;
  slurm-down) cmd_slurm_down ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
  esac
}

main "$@"
