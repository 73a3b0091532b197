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


def test_a_cnn_actor_on_an_env_this_process_cannot_make_is_refused_naming_why():
    # The trainer reads the env's spaces with gymnasium.make; when that fails here (a
    # dependency only the nodes have), the exporter guesses a flat observation from the
    # actor's first Linear, which a CNN cannot take. The error says the shape was guessed
    # and why the spaces were unknown, not only that the policy failed on it.
    gym = pytest.importorskip("gymnasium")
    env_id = "RolloutTest/NeedsOpenCV-v0"

    def needs_opencv(**kw):
        raise gym.error.DependencyNotInstalled("opencv-python package not installed")

    if env_id not in gym.registry:
        gym.register(env_id, entry_point=needs_opencv)
    actor = TensorDictModule(
        nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 6)),
        in_keys=["observation"],
        out_keys=["action"],
    )
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(env_id, actor, frames_per_batch=8, total_frames=8)
    msg = str(e.value)
    assert e.value.field == "policy", msg
    assert "fails on an example observation of shape [2, 288], guessed" in msg, msg
    assert f"gymnasium.make({env_id!r}) failed here" in msg, msg
    assert "DependencyNotInstalled: opencv-python package not installed" in msg and "\n" not in msg, msg
    # Another field's error on the same env is its own, without the guess's story.
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(env_id, actor, frames_per_batch=8, total_frames=8, exploration_type=3)
    assert e.value.field == "exploration_type" and "guessed" not in str(e.value), e.value


def actor_with(**kw):
    torch.manual_seed(0)
    return ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        **kw,
    )


@needs_onnx
def test_the_log_prob_goes_under_the_actors_log_prob_key_and_only_when_it_returns_one():
    # torchrl's losses read the key the actor names (e.g. `set_keys(sample_log_prob=...)`).
    named = actor_with(return_log_prob=True, log_prob_key="sample_log_prob")
    with rollout.DistributedCollector("CartPole-v1", named, frames_per_batch=32, total_frames=32, seed=5) as c:
        td = c.next()
    keys = set(td.keys(include_nested=True, leaves_only=True))
    assert "sample_log_prob" in keys and "action_log_prob" not in keys, keys
    with torch.no_grad():
        logits = named.module[0](TensorDict(observation=td["observation"], batch_size=[32]))["logits"]
    want = torch.distributions.OneHotCategorical(logits=logits).log_prob(td["action"].float())
    np.testing.assert_allclose(td["sample_log_prob"].numpy(), want.numpy(), atol=1e-5)

    silent = actor_with(return_log_prob=False)
    with rollout.DistributedCollector("CartPole-v1", silent, frames_per_batch=32, total_frames=32, seed=5) as c:
        keys = set(c.next().keys(include_nested=True, leaves_only=True))
    assert not any("log_prob" in (k if isinstance(k, str) else k[-1]) for k in keys), keys


@needs_onnx
def test_each_frame_says_which_weights_and_which_node_made_it():
    actor = cartpole_actor()
    # Async, 2 nodes: after an update, batches already in flight still carry version 0.
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=16, total_frames=-1, nodes=2, seed=5) as c:
        first = c.next()
        assert first["collector", "weights_version"].dtype == torch.int64
        assert first["collector", "weights_version"].shape == first.batch_size
        assert (first["collector", "weights_version"] == 0).all()
        assert (first["collector", "node"] == first["collector", "node"][0]).all()
        assert int(first["collector", "node"][0]) in (0, 1)
        assert c.update_policy_weights_() == 1
        seen = set()
        for _ in range(12):
            td = c.next()
            seen.add(int(td["collector", "weights_version"][0]))
            assert (td["collector", "weights_version"] == td["collector", "weights_version"][0]).all()
        assert 1 in seen, seen
    # Sync: the first axis is the nodes, each with its own index.
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=32, total_frames=32, nodes=2, sync=True, seed=5) as c:
        td = c.next()
    assert td.batch_size == (2, 16)
    assert td["collector", "node"][:, 0].tolist() == [0, 1]
    assert (td["collector", "node"] == td["collector", "node"][:, :1]).all()
    assert td.view(-1)["collector", "weights_version"].shape == (32,)


@pytest.mark.parametrize("name", ["device", "policy_device", "storing_device", "env_device"])
def test_torchrls_device_arguments_take_the_cpu_and_refuse_another_device_in_one_sentence(name):
    for cpu in ("cpu", torch.device("cpu"), "cpu:0"):
        with rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8, **{name: cpu}) as c:
            assert c.next() is not None
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8, **{name: "cuda:0"})
    assert e.value.field == name and "CPU" in str(e.value) and "\n" not in str(e.value), e.value


def test_postproc_is_called_on_each_batch_as_torchrl_calls_it():
    calls = []

    def postproc(batch):
        calls.append(batch.index)
        return ("processed", batch)

    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=24, seed=1, postproc=postproc) as c:
        got = list(c)
    assert [g[0] for g in got] == ["processed"] * 3 and calls == [0, 1, 2], (got, calls)
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=8, total_frames=8, postproc="no")
    assert e.value.field == "postproc", e.value


@needs_onnx
def test_the_example_help_shows_runs():
    # help(rollout.DistributedCollector) shows one torchrl example: it must run as written.
    import textwrap

    doc = rollout.DistributedCollector.__doc__
    after = doc.split("Example (torchrl's PPO actor on CartPole, two local nodes)::", 1)[1].splitlines()[1:]
    lines = []
    for line in after:
        if line.strip() and not line.startswith(" " * 8):
            break  # the indented block ends at the next paragraph
        lines.append(line)
    block = "\n".join(lines)
    assert "DistributedCollector(" in block and "update_policy_weights_()" in block
    exec(textwrap.dedent(block), {})
