#!/bin/bash
# The trainer's CPU per byte of batches (BENCHMARKS.md, "Any env"): one release
# `rollout collect --launcher external` timed alone (its node is a process of its own),
# ALE/Pong-v5 from one Python node of 4 envs, then CartPole-v1 from one Rust node in
# 10,000-frame batches. Prints user and system seconds and minor page faults of the
# trainer, and its --json summary; divide by the run's bytes (frames x bytes per frame).
#
#   benches/python_node/per_byte.sh            PONG=24000 PFPB=400 CP=60000000 to change sizes
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${ROLLOUT_BIN:-$ROOT/target/release/rollout}
PY=${PYTHON:-$ROOT/.venv/bin/python}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
head -c 32 /dev/urandom | base64 > tok
chmod 600 tok
run() { # name env node-command total-frames frames-per-batch envs-per-node
  /usr/bin/time -f "%U %S %R" -o time.txt "$B" collect --launcher external --listen 127.0.0.1:0 \
    --token-file tok --env "$2" --nodes 1 --envs-per-node "$6" --policy random \
    --frames-per-batch "$5" --total-frames "$4" --json -q > out.json 2> coll.log &
  local trainer=$!
  for _ in $(seq 200); do grep -q "listening on" coll.log && break; sleep 0.1; done
  local addr
  addr=$(grep -o "listening on [0-9.:]*" coll.log | awk '{print $3}')
  $3 --join "$addr" --token-file tok > node.log 2>&1 &
  wait $trainer
  wait
  read -r u s pf < time.txt
  echo "$1 cpu_user=$u cpu_sys=$s minor_faults=$pf $(tail -1 out.json)"
}
run pong ALE/Pong-v5 "$PY -m rollout_node" "${PONG:-24000}" "${PFPB:-400}" 4
run cartpole CartPole-v1 "$B node" "${CP:-60000000}" 10000 1
