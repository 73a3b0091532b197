#!/usr/bin/env bash
# Makes .venv-sf: a venv with Sample Factory 2.1.1 for the workload bench's `sample-factory`
# peer (python/collector/bench/workloads/sf_peer.py). Sample Factory pins gymnasium < 1.0 and
# numpy < 2.0, so it cannot share .venv (gymnasium 1.x, numpy 2.x). Pinned to what the figures in
# BENCHMARKS.md ran (torch and mujoco as .venv has them). PyPI only; torch comes
# from pip's cache when .venv's is there. Not needed by any test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-sf
.venv-sf/bin/pip install --quiet --upgrade pip
.venv-sf/bin/pip install --quiet "sample-factory==2.1.1" "gymnasium[mujoco]==0.29.1" "numpy==1.26.4" "torch==2.15.0" "mujoco==4.0.1" \
    "opencv-python-headless==4.11.0.86" "ale-py==0.12.1" "psutil==7.2.2"
.venv-sf/bin/python -c "from importlib.metadata import version as v; print('.venv-sf:', *(f'{p} {v(p)}' for p in ('sample-factory', 'gymnasium', 'numpy', 'torch')))"
