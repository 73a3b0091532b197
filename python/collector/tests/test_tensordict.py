"""TensorDict batches: torchrl's layout (checked against torchrl's own collector),
tensors sharing the Rust buffers, and NumPy batches without torch."""

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402

import rollout  # noqa: E402
from rollout._tensordict import to_tensordict  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

# The keys a policy with a distribution records (issue "any policy"): torchrl's too.
LOG_PROB_KEYS = {"action_log_prob", "logits"}


def torchrl_batch(distribution, frames=32):
    """One batch of torchrl's own single-process collector, CartPole-v1, a categorical actor."""
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv
    from torchrl.modules import ProbabilisticActor

    env = GymEnv("CartPole-v1")
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=distribution,
        return_log_prob=True,
        spec=env.action_spec,
    )
    c = Collector(env, actor, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(c))
    finally:
        c.shutdown()


def layout(td):
    """Leaf key -> (dtype, feature shape), the batch dims left out."""
    n = len(td.batch_size)
    return {k: (v.dtype, tuple(v.shape[n:])) for k, v in td.items(include_nested=True, leaves_only=True)}


def rollout_batch(**kw):
    with rollout.DistributedCollector("CartPole-v1", {"kind": "mlp", "hidden": [16]}, seed=3, tensordict=True, **kw) as c:
        return c.next()


def test_the_layout_is_torchrls_keys_dtypes_and_feature_shapes():
    from torch.distributions import Categorical

    theirs = layout(torchrl_batch(Categorical))
    td = rollout_batch(frames_per_batch=32, total_frames=32)
    assert isinstance(td, TensorDict)
    ours = layout(td)
    # rollout also records the step count at the root (torchrl's StepCounter key), and
    # which weights and node made each frame (issue 44).
    assert ours.pop("step_count") == (torch.int64, (1,))
    assert ours.pop(("collector", "weights_version")) == (torch.int64, ())
    assert ours.pop(("collector", "node")) == (torch.int64, ())
    missing = set(theirs) - set(ours)
    assert missing <= LOG_PROB_KEYS, f"keys torchrl has and rollout lacks: {missing}"
    assert set(ours) - set(theirs) == set(), "no key of rollout's own beyond those"
    for k in ours:
        assert ours[k] == theirs[k], f"{k}: rollout {ours[k]} vs torchrl {theirs[k]}"
    for k in ("done", "terminated", "truncated", ("next", "done"), ("collector", "traj_ids")):
        assert k in ours
    if missing:
        pytest.skip(f"the layout matches torchrl's except {sorted(missing)}: batches do not record log-probs yet (issue 29 item 4)")


def test_a_one_hot_action_is_torchrls_one_hot():
    from torchrl.modules import OneHotCategorical

    theirs = layout(torchrl_batch(OneHotCategorical))
    with rollout.DistributedCollector("CartPole-v1", {"kind": "mlp", "hidden": [16]}, frames_per_batch=32, total_frames=32, seed=3) as c:
        batch = c.next()
    td = to_tensordict(batch, one_hot=2)
    assert layout(td)["action"] == theirs["action"] == (torch.int64, (2,))
    np.testing.assert_array_equal(td["action"].argmax(-1).numpy(), batch["action"][0])
    assert (td["action"].sum(-1) == 1).all()


@pytest.mark.parametrize(
    "kw,shape",
    [
        (dict(envs_per_node=1), (24,)),
        (dict(envs_per_node=3), (3, 8)),
        (dict(nodes=2, envs_per_node=1, sync=True), (2, 12)),
        (dict(nodes=2, envs_per_node=3, sync=True), (2, 3, 4)),
    ],
    ids=["one env", "three envs", "sync one env", "sync three envs"],
)
def test_batch_size_is_torchrls_per_node_and_stacked_per_node_when_sync(kw, shape):
    td = rollout_batch(frames_per_batch=24, total_frames=24, **kw)
    assert tuple(td.batch_size) == shape
    assert td["next", "reward"].shape == (*shape, 1)
    assert td["done"].shape == (*shape, 1) and not td["done"].any()


@pytest.mark.parametrize("envs", [1, 2])
def test_tensors_share_the_rust_buffers(envs):
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=20, total_frames=20, envs_per_node=envs, seed=1) as c:
        batch = c.next()
    td = to_tensordict(batch)
    for key in batch.keys(include_nested=True, leaves_only=True):
        dotted = key if isinstance(key, str) else ".".join(key)
        assert td.get(key).data_ptr() == batch._addresses[dotted], f"{key}: the very buffer Rust collected into"
    # One memory: a write through NumPy is seen by torch.
    batch["next", "reward"][...] = 7.0
    assert (td["next", "reward"] == 7.0).all()


def test_a_tensordict_holds_its_storage_until_freed():
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=20, total_frames=-1, seed=1, tensordict=True) as c:
        td = c.next()
        reward = td["next", "reward"]
        del td
        gc.collect()
        # A tensor from the batch still shares its storage: nothing goes back yet.
        assert c.stats()["batches_recycled"] == 0
        assert reward.shape == (20, 1)
        del reward
        gc.collect()
        assert c.stats()["batches_recycled"] == 1


def test_a_numpy_policy_gives_numpy_batches_unless_asked():
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8) as c:
        assert isinstance(c.next(), rollout.Batch)


def test_numpy_batches_need_no_torch():
    """With torch unimportable, NumPy batches work and TensorDicts are refused clearly."""
    code = textwrap.dedent(
        """
        import sys
        for m in ("torch", "tensordict", "torchrl"):
            sys.modules[m] = None  # import fails as if not installed
        import rollout
        with rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8) as c:
            b = c.next()
        assert isinstance(b, rollout.Batch) and b["observation"].shape == (1, 8, 4)
        try:
            rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8, tensordict=True)
        except ImportError as e:
            assert "rollout[torch]" in str(e), e
            print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
