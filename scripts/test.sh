#!/usr/bin/env bash
# Runs every test of the project on a fresh machine of this kind, installing
# what the tests need first. This is README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Where the time goes: each phase's start, in seconds since the script began.
phase() { echo "test.sh: $1 from ${SECONDS}s"; }

# A fresh run writes ~17 GB here (the build ~10, the venv with torch and Ray ~7). When the
# disk is short, say so first: pip's "No space left on device" further down names nothing.
free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "${free_gb:-0}" -lt 18 ]; then
  echo "test.sh: warning: ${free_gb} GB free on $(df -P . | awk 'NR == 2 { print $6 }'); a fresh run needs ~17 GB (target/ and .venv/)" >&2
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi

# Python's msgpack: an independent decoder for tests/tests/interop.rs.
python3 -c "import msgpack" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check msgpack

# The Python node (python/node) in a venv of its own, with pytest: its pytest suite runs
# below, and tests/tests/python_node.rs starts nodes with this venv's python. MuJoCo and
# ale-py (Atari, ROMs included) from PyPI: the node's tests collect and replay their envs.
# The node's `onnx` extra (onnxruntime, onnx) runs the `onnx` policy; torch (from PyPI, used
# on the CPU only; pip's cache keeps its wheels) exports the models its tests run. Its
# `envpool` extra (EnvPool, from PyPI: adds packages, downgrades none) serves `envpool:<task>`
# ids, which the tests check against EnvPool's own loop. PettingZoo (with its butterfly envs)
# and MPE2 (simple_spread) are the multi-agent envs the node serves and the tests replay.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "./python/node[onnx,envpool]" pytest "gymnasium[mujoco]" ale-py torch "ray==2.60.0" \
  "pettingzoo[butterfly]==1.27.0" "mpe2==1.1.1"

# A real one-node SLURM cluster for tests/tests/slurm.rs (idempotent, fast when up).
./scripts/slurm-local.sh

# The test hosts of tests/tests/hosts.rs (scripts/hosts.sh: network namespaces on a bridge,
# faults with nftables and tc, a SLURM cluster across them): nftables and iproute2.
if ! command -v nft >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nftables iproute2 >/dev/null
fi

# A real Prometheus for tests/tests/metrics.rs (the binary only: the tests start their
# own, on loopback; the package's service is not used).
if ! command -v prometheus >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# The release binary the training test runs (debug training is ~25x slower);
# built here so that no test spends its deadline compiling. No test measures speed
# (the benchmarks do), so the release builds of this script take cargo's default
# codegen units and no debug info: faster to build than the benchmarks' profile
# (Cargo.toml), and the same for the CLI and the Python module, which share them.
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=false
phase "the release CLI"
cargo build --release -p rollout-cli --bin rollout

# Python learners (issue 18): the `rollout` extension module (python/collector,
# PyO3 + maturin) built in release into the same venv, with its `torch` extra (torch,
# tensordict, torchrl, onnx: torch actors and TensorDict batches) and onnxruntime, which
# the tests run the exported models with.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "maturin>=1.7,<2" numpy pytest onnxruntime
# The module is built for the stable ABI (`_native.abi3.so`); a version-specific build
# left by an older checkout would be imported first, so it goes.
rm -f python/collector/rollout/_native.cpython-*.so
phase "the Python module"
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --release --quiet --extras torch -m python/collector/Cargo.toml

phase "lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The build an embedder gets: the core and the actors without their `onnx` and `learn`
# features (the workspace run above turns both on), linted, and an `onnx` policy refused
# naming the feature.
cargo clippy -p rollout -p rollout-actors --lib -- -D warnings
cargo nextest run -p rollout-actors --lib --profile ci policy_file
# No import cycle, and docs/ARCHITECTURE.md's layers, uses and crate dependencies as the code has them.
python3 scripts/check-imports.py --self-test
python3 scripts/check-imports.py
phase "the Rust tests"
cargo nextest run --workspace --profile ci
phase "the doc tests"
cargo test --workspace --doc
# The Python module's tests (the process-launcher test starts the release binary) and
# the Python node's against a scripted trainer (and the onnx policy's against the
# release binary), side by side: they share no state (every port is the system's pick,
# every file a test's own temporary one), and both spend much of their time waiting on
# the nodes they start. Each writes its own log, printed when both are done.
# Job control on: a non-interactive shell's background jobs would otherwise start with
# SIGINT ignored, and the Ctrl-C tests need it at its default, as a terminal leaves it.
phase "the Python suites"
logs=$(mktemp -d)
set -m
ROLLOUT_BIN="$PWD/target/release/rollout" .venv/bin/python -m pytest -q python/collector/tests >"$logs/collector" 2>&1 &
collector=$!
ROLLOUT_BIN="$PWD/target/release/rollout" .venv/bin/python -m pytest -q python/node/tests >"$logs/node" 2>&1 &
node=$!
set +m
collector_passed=yes
node_passed=yes
wait "$collector" || collector_passed=no
wait "$node" || node_passed=no
echo "== python/collector/tests"; cat "$logs/collector"
echo "== python/node/tests"; cat "$logs/node"
rm -rf "$logs"
if [ "$collector_passed$node_passed" != yesyes ]; then
  echo "python tests failed (collector passed: $collector_passed, node passed: $node_passed)"
  exit 1
fi
echo "test.sh: all passed in ${SECONDS}s"
