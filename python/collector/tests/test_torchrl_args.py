"""torchrl's other collector arguments: a torchrl script's collector line runs unchanged, each
argument honoured (``track_policy_version``), accepted where its value changes nothing here, or
refused in one sentence naming it; a name no torchrl collector takes stays a ``TypeError``."""

import itertools

import numpy as np
import pytest

import rollout
from rollout import _torchrl_args

KW = dict(frames_per_batch=20, total_frames=40, seed=1)


@pytest.mark.parametrize(
    "name, value",
    [
        ("track_traj_ids", True),
        ("reset_when_done", True),
        ("return_same_td", False),
        ("set_truncated", False),
        ("interruptor", None),
        ("use_buffers", True),
        ("trust_policy", False),
        ("no_cuda_sync", True),
        ("compile_policy", False),
        ("cudagraph_policy", None),
        ("create_env_kwargs", {}),
        ("replay_buffer", None),
        ("extend_buffer", True),
        ("weight_updater", None),
        ("policy_factory", None),
        ("track_policy_version", False),
    ],
)
def test_torchrls_defaults_and_its_own_loops_knobs_are_accepted_and_change_nothing(name, value):
    with rollout.DistributedCollector("CartPole-v1", **KW) as plain:
        want = [b["observation"].copy() for b in plain]
    with rollout.DistributedCollector("CartPole-v1", **KW, **{name: value}) as c:
        got = [b["observation"].copy() for b in c]
    assert len(got) == len(want) and all((g == w).all() for g, w in zip(got, want)), name


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("reset_when_done", False, "reset every env"),
        ("return_same_td", True, "TensorDict of its own"),
        ("set_truncated", True, "never at a batch's end"),
        ("compile_policy", True, "ONNX export"),
        ("cudagraph_policy", {"warmup": 2}, "CUDA graphs"),
        ("replay_buffer", object(), "buffer.extend"),
        ("weight_updater", object(), "update_policy_weights_()"),
        ("create_env_kwargs", {"render_mode": "rgb_array"}, "env_config"),
        ("policy_factory", lambda: None, "pass the policy itself"),
        ("backend", "ray", "launcher="),
        ("track_traj_ids", False, "always records"),
        ("track_policy_version", "uuid", "pass True"),
        ("track_traj_ids", 1, "always records"),
    ],
)
def test_a_value_rollout_cannot_honour_is_refused_in_one_sentence_naming_the_argument(name, value, says):
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", **KW, **{name: value})
    msg = str(e.value)
    assert e.value.field == name and says in msg and "\n" not in msg, msg


def test_a_name_no_torchrl_collector_takes_is_pythons_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'frames_per_bach'"):
        rollout.DistributedCollector("CartPole-v1", frames_per_bach=20, total_frames=40)


def test_track_policy_version_writes_each_frames_weights_version_as_torchrl_names_it():
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensordict")
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=20, total_frames=-1, seed=1, tensordict=True, track_policy_version=True) as c:
        td = c.next()
        assert td["policy_version"].dtype == torch.int64 and td["policy_version"].shape == td.batch_size
        assert (td["policy_version"] == 0).all()
        version = c.update_policy_weights_({"weight": np.zeros((2, 4), np.float32), "bias": np.zeros(2, np.float32)})
        assert version > 0
        after = [td for td in itertools.islice(iter(c.next, None), 50) if (td["collector", "weights_version"] == version).all()]
        assert after, "a batch of the new weights within 50"
        assert (after[0]["policy_version"] == version).all()
    with rollout.DistributedCollector("CartPole-v1", frames_per_batch=20, total_frames=20, seed=1, tensordict=True) as c:
        assert "policy_version" not in c.next().keys(), "only when asked, as in torchrl"


def test_every_argument_of_torchrls_collector_is_taken():
    collectors = pytest.importorskip("torchrl.collectors")
    import inspect

    own = set(inspect.signature(rollout.DistributedCollector.__init__).parameters) | set(_torchrl_args.names())
    theirs = set(inspect.signature(collectors.Collector.__init__).parameters) - {"self", "kwargs"}
    assert theirs <= own, sorted(theirs - own)
