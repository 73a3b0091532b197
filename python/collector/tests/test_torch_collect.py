"""Collecting with a torch actor end to end: the actor in (exported as the onnx
policy), TensorDicts out with torchrl's keys and the behaviour policy's
log-probs, weights pushed from the module, bad weights refused with the run
untouched."""

import inspect
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("onnx")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.modules import OneHotCategorical, ProbabilisticActor, TanhNormal  # noqa: E402

import rollout  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)

needs_onnx = pytest.mark.skipif(
    "policy_file" not in inspect.signature(rollout.DistributedCollector.__init__).parameters,
    reason="needs the onnx policy in the native module (PolicyConfig::Onnx with the policy_file/onnx_head settings, issue 29 item 1)",
)


def cartpole_actor():
    torch.manual_seed(0)
    return ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )


def pendulum_actor():
    torch.manual_seed(0)
    return ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2), NormalParamExtractor()), in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -2.0, "high": 2.0},
        return_log_prob=True,
    )


@needs_onnx
def test_a_probabilistic_actor_collects_torchrl_batches_with_its_log_probs():
    actor = cartpole_actor()
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=64, total_frames=64, seed=5) as c:
        td = c.next()
    assert isinstance(td, TensorDict) and tuple(td.batch_size) == (64,)
    keys = set(td.keys(include_nested=True, leaves_only=True))
    assert {"action", "action_log_prob", "logits", "done", "terminated", "truncated", ("next", "observation"), ("collector", "traj_ids")} <= keys
    assert td["action"].dtype == torch.int64 and td["action"].shape == (64, 2)
    with torch.no_grad():
        logits = actor.module[0](TensorDict(observation=td["observation"], batch_size=[64]))["logits"]
    np.testing.assert_allclose(td["logits"].numpy(), logits.numpy(), atol=1e-5)
    want = torch.distributions.OneHotCategorical(logits=logits).log_prob(td["action"].float())
    np.testing.assert_allclose(td["action_log_prob"].numpy(), want.numpy(), atol=1e-5)


@needs_onnx
def test_a_tanh_normal_actor_acts_within_the_envs_bounds():
    actor = pendulum_actor()
    with rollout.DistributedCollector("Pendulum-v1", actor, frames_per_batch=64, total_frames=64, seed=5) as c:
        td = c.next()
    assert td["action"].shape == (64, 1)
    assert (td["action"].abs() <= 2.0).all()
    with torch.no_grad():
        params = actor.module[0](TensorDict(observation=td["observation"], batch_size=[64]))
    np.testing.assert_allclose(td["loc"].numpy(), params["loc"].numpy(), atol=1e-5)
    np.testing.assert_allclose(td["scale"].numpy(), params["scale"].numpy(), atol=1e-5)


@needs_onnx
@pytest.mark.parametrize("source", ["module", "state_dict", "from_module", "none"])
def test_a_push_from_the_module_changes_the_actions_from_its_version(source):
    actor = cartpole_actor()
    with rollout.DistributedCollector(
        "CartPole-v1", actor, frames_per_batch=32, total_frames=-1, seed=5, exploration_type="deterministic", tensordict=False
    ) as c:
        c.next()
        with torch.no_grad():  # every observation now prefers action 1
            last = actor.module[0].module[2]
            last.weight.zero_()
            last.bias.copy_(torch.tensor([0.0, 5.0]))
        arg = {"module": actor, "state_dict": actor.state_dict(), "from_module": TensorDict.from_module(actor), "none": None}[source]
        version = c.update_policy_weights_(arg)
        assert version == 1
        for _ in range(20):  # a deadline in batches: the push reaches the node between two of them
            b = c.next()
            if b.weights_version >= version:
                assert (b["action"] == 1).all()
                break
        else:
            pytest.fail("no batch with the pushed version in 20 batches")


@needs_onnx
def test_bad_weights_leave_the_stored_version_unchanged():
    actor = cartpole_actor()
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=32, total_frames=-1, seed=5) as c:
        c.next()
        assert c.update_policy_weights_() == 1
        sd = actor.state_dict()
        bad = dict(sd, **{"module.0.module.0.bias": torch.zeros(17)})
        with pytest.raises(rollout.ConfigError) as e:
            c.update_policy_weights_(bad)
        assert e.value.field == "weights" and "module.0.module.0.bias" in str(e.value)
        missing = {k: v for k, v in sd.items() if k != "module.0.module.2.weight"}
        with pytest.raises(rollout.ConfigError, match="module.0.module.2.weight"):
            c.update_policy_weights_(missing)
        assert c.update_policy_weights_(actor) == 2, "the refused pushes took no version"
        c.next()  # the run goes on


def test_actor_refused_before_anything_starts():
    actor = ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), in_keys=["pixels"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
    )
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=8, total_frames=8)
    assert e.value.field == "policy" and "pixels" in str(e.value)
