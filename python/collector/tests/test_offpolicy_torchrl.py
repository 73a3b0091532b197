"""torchrl's DQN, TD3 and DDPG, written as torchrl's examples write them, collecting through
rollout with only the collector line changed (examples/offpolicy_torchrl.py): DQN learns
CartPole (the mean length of the last 20 episodes after 20,000 frames, seeds 0-4: 235
to 336, against about 22 for the initial epsilon = 1 policy), TD3's and DDPG's loops run on
Pendulum with their noise annealed on the nodes (DDPG's Ornstein-Uhlenbeck noise kept per
env by Python nodes)."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

_MISSING = [m for m in ("torch", "tensordict", "torchrl", "onnx") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)}: the torch extra")

DQN_THRESHOLD = 150.0


def test_torchrls_dqn_learns_cartpole_through_rollout():
    import torch

    import offpolicy_torchrl

    warnings.filterwarnings("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lengths = offpolicy_torchrl.dqn(frames=20_000, seed=0)
    finally:
        torch.set_num_threads(threads)
    first, last = lengths[:20], lengths[-20:]
    assert sum(first) / 20 < 60, f"the first episodes are epsilon = 1's: {first}"
    assert sum(last) / 20 >= DQN_THRESHOLD, f"mean length of the last 20 episodes: {sum(last) / 20:.1f}"


def test_torchrls_td3_collects_pendulum_through_rollout():
    import math

    import torch

    import offpolicy_torchrl

    warnings.filterwarnings("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        returns = offpolicy_torchrl.td3(frames=3_000, seed=0, updates_per_batch=5)
    finally:
        torch.set_num_threads(threads)
    # Pendulum's episodes are 200 steps: 3,000 frames end 15 of them, each return finite
    # and within Pendulum's range (at worst about -16.3 a step).
    assert len(returns) == 15 and all(math.isfinite(r) and -3_300 <= r <= 0 for r in returns), returns


def test_torchrls_ddpg_collects_pendulum_through_rollout_on_python_nodes():
    import math

    import torch

    import offpolicy_torchrl
    from conftest import PYTHON_NODE, require_python_node

    require_python_node()
    warnings.filterwarnings("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        returns = offpolicy_torchrl.ddpg(frames=3_000, seed=0, updates_per_batch=5, launcher="process", node_command=PYTHON_NODE)
    finally:
        torch.set_num_threads(threads)
    # As TD3's: 15 episodes of 200 steps, each return finite and within Pendulum's range.
    assert len(returns) == 15 and all(math.isfinite(r) and -3_300 <= r <= 0 for r in returns), returns
