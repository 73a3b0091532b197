"""``python -m rollout_node`` against a scripted trainer, for envs beyond f32 boxes: ``hello``
speaks version 5, ``ready`` carries the specs and the layout they give, batches travel in the
env's own dtypes, ``--double-to-float``, and a space the node or its policy cannot take is a
``failed`` naming the key, then exit 1."""

import numpy as np
import pytest

from conftest import node_spec, tensors

from test_any_env import DICT_OBS, PONG_SPECS, replay

RANDOM = {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0}


def test_a_dict_env_is_ready_with_its_specs_and_its_batches_keep_their_dtypes(trainer):
    trainer.start_node("--import", "spaces_env")
    spec = node_spec(policy=RANDOM, envs=2, env="DictSpaces-v0", config={"action": "multi_binary"})
    ready = trainer.join(spec)
    assert ready["type"] == "ready", ready
    assert ready["specs"] == {"observation": DICT_OBS, "action": {"kind": "multi_binary", "n": 4}}
    layout = ready["layout"]
    assert layout["observation.inner.img"] == ["u8", [4, 4]] and layout["next.observation.pos"] == ["f64", [2]]
    assert layout["observation.count"] == ["i64", []] and layout["action"] == ["u8", [4]]
    assert "observation" not in layout
    trainer.send({"type": "continue", "seq": 1, "frames": 20})
    b = trainer.recv()
    assert b["type"] == "batch" and b["data"]["batch_size"] == [2, 10]
    wire_dtypes = {k: t["dtype"] for k, t in b["data"]["tensors"].items()}
    assert wire_dtypes == {k: v[0] for k, v in layout.items()}
    t = tensors(b)
    assert t["observation.inner.img"].shape == (2, 10, 4, 4) and t["action"].shape == (2, 10, 4)
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_double_to_float_reports_and_sends_f64_boxes_as_f32(trainer):
    trainer.start_node("--import", "spaces_env", "--double-to-float")
    spec = node_spec(policy=RANDOM, envs=1, env="DictSpaces-v0", config={"action": "discrete"})
    ready = trainer.join(spec)
    assert ready["specs"]["observation"]["spaces"]["pos"] == {"kind": "box", "dtype": "f32", "shape": [2], "low": -1.0, "high": 1.0}
    assert ready["specs"]["action"] == {"kind": "discrete", "n": 3, "start": -1}
    trainer.send({"type": "continue", "seq": 1, "frames": 4})
    b = trainer.recv()
    assert b["data"]["tensors"]["next.observation.pos"]["dtype"] == "f32"
    assert set(tensors(b)["action"].reshape(-1)) <= {-1, 0, 1}
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_a_space_the_node_cannot_collect_fails_it_naming_the_key_and_the_space(trainer):
    trainer.start_node("--import", "spaces_env")
    f = trainer.join(node_spec(policy=RANDOM, envs=1, env="TupleInDict-v0"))
    assert f["type"] == "failed", f
    assert "observation.foo: Tuple(Discrete(2), Discrete(3)) cannot be collected" in f["reason"], f
    code, err = trainer.finish()
    assert code == 1 and "error: cannot build the node: observation.foo: Tuple" in err, err


def test_a_network_on_a_discrete_observation_fails_the_node_naming_the_key_and_why(trainer):
    trainer.start_node()
    f = trainer.join(node_spec(env="FrozenLake-v1"))  # linear; its observation is Discrete(16)
    assert f["type"] == "failed", f
    assert "policy linear cannot take observation: discrete 16 (it takes a 1-D f32 or f64 box)" in f["reason"], f
    assert trainer.finish()[0] == 1


def test_pong_frames_travel_as_uint8_and_replay_exactly(trainer):
    pytest.importorskip("ale_py")
    config = {"max_episode_steps": 30}
    trainer.start_node()  # ALE ids: the node imports ale-py itself
    ready = trainer.join(node_spec(policy=RANDOM, envs=2, env="ALE/Pong-v5", config=config))
    assert ready["specs"] == PONG_SPECS, ready
    assert ready["layout"]["observation"] == ["u8", [210, 160, 3]]
    got = []
    for seq in (1, 2):
        trainer.send({"type": "continue", "seq": seq, "frames": 2 * 20})
        b = trainer.recv()
        assert b["type"] == "batch" and b["seq"] == seq
        assert b["data"]["tensors"]["observation"]["dtype"] == "u8"
        assert len(b["data"]["tensors"]["observation"]["data"]) == 2 * 20 * 210 * 160 * 3
        got.append(tensors(b))
    batch = {k: np.concatenate([g[k] for g in got], axis=1) for k in got[0]}
    # node_spec's rollout.seed is 7: row k is first reset with 7 + k.
    assert replay(batch, "ALE/Pong-v5", config, 2, seeds={0: 7, 1: 8}) == [0, 2]
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_a_box_of_one_bound_everywhere_sends_one_number_and_too_many_different_ones_are_refused():
    import gymnasium as gym

    from rollout_node import spaces

    atari = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    s = spaces.specs(atari, gym.spaces.Discrete(6))
    assert s["observation"] == {"kind": "box", "dtype": "u8", "shape": [210, 160, 3], "low": 0.0, "high": 255.0}
    # 2^19 elements with per-element bounds, low and high: exactly the limit.
    n = spaces.MAX_SPEC_VALUES // 2
    ramp = np.arange(n, dtype=np.float32)
    s = spaces.specs(gym.spaces.Box(ramp, ramp + 1), gym.spaces.Discrete(2))
    assert len(s["observation"]["low"]) == n and len(s["observation"]["high"]) == n
    with pytest.raises(spaces.SpaceError) as e:
        spaces.specs(gym.spaces.Box(ramp, ramp + 1), gym.spaces.MultiDiscrete([2, 3]))
    assert e.value.key == "action" and "more than 1048576 numbers in all" in str(e.value), e.value
