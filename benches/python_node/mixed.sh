#!/usr/bin/env bash
# The Python node end to end through a trainer (BENCHMARKS.md, "Python node"): one
# `rollout collect --launcher external` on 127.0.0.1 and the nodes NODES names (python,
# rust, or both: "python rust"), each started as docs/python-node.md says; prints the
# trainer's --json summary and the frames each node index delivered.
#
#     benches/python_node/mixed.sh [ROLLOUT_BINARY] [NODES...]
#
# ROLLOUT_BINARY defaults to target/release/rollout; the Python node is .venv/bin/python's.
# TOTAL_FRAMES (default 400000) shortens a trial run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/rollout}
shift || true
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(python rust)
dir=$(mktemp -d)
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/token"
chmod 600 "$dir/token"
port=$((20000 + RANDOM % 20000))
pids=()
"$bin" collect --launcher external --listen "127.0.0.1:$port" --token-file "$dir/token" \
    --nodes "${#nodes[@]}" --envs-per-node 8 --env CartPole-v1 --frames-per-batch 8000 \
    --total-frames "${TOTAL_FRAMES:-400000}" --policy linear --exploration-type deterministic --seed 1 \
    --join-timeout 60 --json >"$dir/summary" &
trainer=$!
pids+=("$trainer")
i=0
for n in "${nodes[@]}"; do  # node index i is the i-th of NODES
    case $n in
        python) .venv/bin/python -m rollout_node --join "127.0.0.1:$port" --token-file "$dir/token" \
            --index "$i" --connect-timeout 60 >/dev/null 2>&1 & ;;
        rust) "$bin" node --join "127.0.0.1:$port" --token-file "$dir/token" --index "$i" >/dev/null 2>&1 & ;;
        *) echo "error: unknown node kind \`$n\` (python or rust)" >&2; exit 2 ;;
    esac
    pids+=("$!")
    i=$((i + 1))
done
wait "$trainer"
tail -n 1 "$dir/summary"
python3 - "$dir/summary" "${nodes[@]}" <<'PY'
import json, sys
by_node = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "node" in r:
        by_node[r["node"]] = by_node.get(r["node"], 0) + r["frames"]
kinds = sys.argv[2:]
print("frames by node:", ", ".join(f"{i} ({kinds[i]}): {f}" for i, f in sorted(by_node.items())))
PY
