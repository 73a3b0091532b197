#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for the tests of the `slurm`
# launcher (tests/tests/slurm.rs): installs `slurm-wlm` and `munge` from Debian
# when missing, writes a one-node slurm.conf, starts munged, slurmctld and slurmd,
# and waits until `sinfo` shows the node idle.
#
# Idempotent: when the cluster is already up, it checks that and exits at once.
# Needs root (apt-get, daemons). Every wait is bounded (WAIT seconds, default 60).
set -euo pipefail

WAIT="${SLURM_LOCAL_WAIT:-60}"
HOST="$(hostname)"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"

die() {
  echo "slurm-local: error: $*" >&2
  exit 1
}
say() { echo "slurm-local: $*" >&2; }

# Waits (bounded) until "$@" succeeds; dies naming WHAT otherwise.
wait_for() {
  local what="$1"
  shift
  local end=$((SECONDS + WAIT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      die "$what did not happen within ${WAIT} s"
    fi
    sleep 0.5
  done
}

# Whether this cluster's daemon D runs, by its pid file (/run/D.pid): the cluster of
# scripts/hosts.sh runs daemons of the same names beside it, with pid files of its own.
running() { [[ -s "/run/$1.pid" ]] && kill -0 "$(cat "/run/$1.pid")" 2>/dev/null; }

node_state() { sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n1; }
node_idle() { [[ "$(node_state)" =~ ^(idle|mixed|allocated) ]]; }

[[ "$(id -u)" == 0 ]] || die "run me as root (apt-get and the SLURM daemons need it)"

# Fast path: already up.
if command -v sinfo >/dev/null 2>&1 && running slurmctld && running slurmd && node_idle; then
  say "already up: node $HOST is $(node_state)"
  exit 0
fi

# 1. Packages.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
  || ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  say "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# 2. munge: a key, its directories, the daemon (as the `munge` user).
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile=/etc/munge/munge.key
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
  say "starting munged"
  rm -f /run/munge/munge.socket.2 /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged
fi
wait_for "munged answering (munge -n | unmunge)" bash -c 'munge -n | unmunge'

# 3. slurm.conf: one node (this host, at 127.0.0.1), one partition `debug`.
CPUS="$(nproc)"
MEM_MB="$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)"
REAL_MEM=4000
if ((MEM_MB - 256 < REAL_MEM)); then REAL_MEM=$((MEM_MB - 256)); fi
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat >"$CONF.new" <<EOF
# Written by scripts/slurm-local.sh: a one-node cluster for tests.
ClusterName=local
SlurmctldHost=${HOST}(127.0.0.1)
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
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
MinJobAge=300
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${REAL_MEM} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
if ! cmp -s "$CONF.new" "$CONF"; then
  mv "$CONF.new" "$CONF"
  # A changed config needs fresh daemons.
  for d in slurmd slurmctld; do
    if running "$d"; then
      say "restarting $d for the new slurm.conf"
      kill "$(cat "/run/$d.pid")" || true
      wait_for "$d exiting" bash -c "! { [[ -s /run/$d.pid ]] && kill -0 \$(cat /run/$d.pid); }"
    fi
  done
else
  rm -f "$CONF.new"
fi
# Some builds look for the config here too.
mkdir -p /etc/slurm-llnl
ln -sf "$CONF" /etc/slurm-llnl/slurm.conf

# 4. The daemons (they daemonize themselves).
if ! running slurmctld; then
  say "starting slurmctld"
  /usr/sbin/slurmctld
fi
wait_for "slurmctld answering (scontrol ping)" bash -c 'scontrol ping | grep -q UP'
if ! running slurmd; then
  say "starting slurmd"
  /usr/sbin/slurmd
fi

# 5. The node idle. A node left down/drained by an earlier run is resumed.
end=$((SECONDS + WAIT))
until node_idle; do
  state="$(node_state)"
  if [[ "$state" =~ ^(down|drain) ]]; then
    scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
  fi
  if ((SECONDS >= end)); then
    tail -n 20 /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log >&2 || true
    die "node $HOST is '${state:-unknown}', not idle, after ${WAIT} s (logs in /var/log/slurm)"
  fi
  sleep 0.5
done
say "up: node $HOST is $(node_state) (partition debug, $CPUS CPUs)"
