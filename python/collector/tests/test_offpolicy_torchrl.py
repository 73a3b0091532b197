"""torchrl's DQN, TD3, DDPG and SAC, written as torchrl's examples write them, collecting
through rollout with only the collector line changed (examples/offpolicy_torchrl.py): DQN
learns CartPole (the mean length of the last 20 episodes after 20,000 frames, seeds 0-4: 235
to 336, against about 22 for the initial epsilon = 1 policy), TD3's and DDPG's loops run on
Pendulum with their noise annealed on the nodes (DDPG's Ornstein-Uhlenbeck noise kept per
env by Python nodes). SAC's batches carry what ``SACLoss`` reads, its loss runs backward,
the pushed actor is the one the nodes sample; SAC learning Pendulum is opt-in
(``ROLLOUT_LONG_TESTS=1``), as the other long runs are."""

from __future__ import annotations

import importlib.util
import os
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


SAC_BATCH = 200


def test_torchrls_sac_batches_feed_its_loss_and_its_pushed_actor_is_the_one_the_nodes_sample():
    import copy

    import torch
    from torchrl.data import Bounded
    from torchrl.envs import InitTracker

    import offpolicy_torchrl

    warnings.filterwarnings("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = Bounded(-2.0, 2.0, (1,))
    actor = offpolicy_torchrl.make_sac_actor(spec, num_cells=(64, 64))
    loss, target = offpolicy_torchrl.make_sac_loss(actor, num_cells=(64, 64))
    optim = torch.optim.Adam(loss.parameters(), lr=1e-2)
    # The example's collector line: the first batch is init_random_frames' random policy.
    collector = offpolicy_torchrl.make_collector("Pendulum-v1", actor, SAC_BATCH, 20 * SAC_BATCH, SAC_BATCH, 0, InitTracker())
    try:
        batches = iter(collector)
        for data in (next(batches), next(batches)):
            assert data.batch_size == (SAC_BATCH,)
            # Every key torchrl's SACLoss reads, as a (single-env) torchrl collector
            # lays it out.
            shapes = {
                "observation": ((SAC_BATCH, 3), torch.float32),
                ("next", "observation"): ((SAC_BATCH, 3), torch.float32),
                "action": ((SAC_BATCH, 1), torch.float32),
                ("next", "reward"): ((SAC_BATCH, 1), torch.float32),
                ("next", "done"): ((SAC_BATCH, 1), torch.bool),
                ("next", "terminated"): ((SAC_BATCH, 1), torch.bool),
            }
            assert set(loss.in_keys) == set(shapes), loss.in_keys
            for key, (shape, dtype) in shapes.items():
                assert data[key].shape == shape and data[key].dtype == dtype, (key, data[key].shape, data[key].dtype)
            assert ((data["action"] >= -2.0) & (data["action"] <= 2.0)).all(), "within Pendulum's bounds"
            assert data["action"].std() > 0.3, "sampled, not a constant"
        out = loss(data.reshape(-1))
        total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
        assert torch.isfinite(total), {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        optim.zero_grad()
        total.backward()
        grads = {
            "actor": loss.actor_network_params,
            "qvalue": loss.qvalue_network_params,
        }
        for name, params in grads.items():
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params.flatten_keys().values()), f"no gradient to the {name}"
        assert loss.log_alpha.grad is not None and loss.log_alpha.grad != 0, "no gradient to alpha"
        before = copy.deepcopy(actor)
        for _ in range(20):
            optim.zero_grad()
            out = loss(data.reshape(-1))
            (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
            optim.step()
            target.step()
        version = collector.update_policy_weights_()
        assert version >= 1
        for data in batches:
            if (data["collector", "weights_version"] == version).all():
                break
        else:
            raise AssertionError(f"no batch of version {version} in the run")
        # The nodes record the loc and scale they sampled from: the updated actor's on the
        # batch's observations (ONNX against torch: float32 rounding), not the old one's.
        with torch.no_grad():
            new = actor(data.select("observation").clone())
            old = before(data.select("observation").clone())
        for key in ("loc", "scale"):
            assert torch.allclose(data[key], new[key], atol=1e-5), (key, (data[key] - new[key]).abs().max())
        assert (new["loc"] - old["loc"]).abs().max() > 1e-2, "the update changed the actor"
    finally:
        collector.shutdown()
        torch.set_num_threads(threads)


# The example's SAC (256-256 nets, one update per frame after 1,000 random frames), seed 0,
# 20,000 frames on a busy 2-core machine (723 s): the random policy's first 5 episodes
# average -1,170; the mean of each 10 episodes from 4,000 frames on is -120 to -212. Run
# here, 10,000 frames: 311 s, the last 10 episodes' mean -177 (the same returns, episode
# for episode, as the first 10,000 frames of the longer run).
SAC_FRAMES = 10_000
SAC_THRESHOLD = -400.0


@pytest.mark.skipif(not os.environ.get("ROLLOUT_LONG_TESTS"), reason="5 minutes of SAC updates: opt-in with ROLLOUT_LONG_TESTS=1")
def test_torchrls_sac_learns_pendulum_through_rollout():
    import torch

    import offpolicy_torchrl

    warnings.filterwarnings("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        returns = offpolicy_torchrl.sac(frames=SAC_FRAMES, seed=0)
    finally:
        torch.set_num_threads(threads)
    first, last = returns[:5], returns[-10:]
    assert sum(first) / 5 < -900, f"the first episodes are the random policy's: {first}"
    assert sum(last) / 10 > SAC_THRESHOLD, f"mean return of the last 10 episodes: {sum(last) / 10:.1f} ({returns})"
