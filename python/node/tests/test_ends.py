"""Each observation crosses the wire once (PROTOCOL.md §3, Ends; version 9): a batch holds
``observation`` and, for ``next.observation``, only the rows where it is not the next
frame's observation (episode ends and each env's last frame), which the trainer writes
back. Against the scripted trainer, on real envs replayed through gymnasium."""

import copy

import numpy as np
import pytest

from conftest import node_spec, tensors
from rollout_node import wire

from test_any_env import replay

RANDOM = {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0}


def recv_sized(trainer):
    """The next non-heartbeat frame as sent (not expanded) and its body's length."""
    while True:
        (n,) = np.frombuffer(wire.read_exact(trainer.rfile, 4), dtype=">u4")
        f = wire.decode(wire.read_exact(trainer.rfile, int(n)))
        if f["type"] != "heartbeat":
            return f, int(n)


def test_pong_frames_cost_at_most_five_percent_over_one_observation_and_replay_exactly(trainer):
    pytest.importorskip("ale_py")
    config = {"max_episode_steps": 60}
    trainer.start_node()
    trainer.join(node_spec(policy=RANDOM, envs=2, env="ALE/Pong-v5", config=config, frames_per_batch=200))
    trainer.send({"type": "continue", "seq": 1, "frames": 2 * 100})
    raw, size = recv_sized(trainer)
    assert raw["type"] == "batch"
    assert "next.observation" not in raw["data"]["tensors"]
    # Episodes cut at 60 steps: env 0's frame 59 and env 1's (flat 159), and each env's last.
    assert raw["ends"]["rows"] == [59, 99, 159, 199], raw["ends"]["rows"]
    assert raw["ends"]["tensors"]["next.observation"]["shape"] == [4, 210, 160, 3]
    obs_bytes = 200 * 210 * 160 * 3
    assert size <= 1.05 * obs_bytes, size / obs_bytes
    batch = tensors(wire.expand_batch(copy.deepcopy(raw)))
    nxt, obs = batch["next.observation"], batch["observation"]
    assert (nxt[:, :-1][~batch["next.done"][:, :-1, 0]] == obs[:, 1:][~batch["next.done"][:, :-1, 0]]).all()
    assert replay(batch, "ALE/Pong-v5", config, 2, seeds={0: 7, 1: 8}) == [0, 2]
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_cartpole_batches_send_the_rows_where_episodes_end_once_that_saves_16_kib(trainer):
    trainer.start_node()
    trainer.join(node_spec(policy=RANDOM, envs=2, frames_per_batch=2000))
    # 2 x 1,000 frames of 16-byte observations: 32 KB to save, sent once.
    trainer.send({"type": "continue", "seq": 1, "frames": 2000})
    raw, _ = recv_sized(trainer)
    done = wire.from_tensor(raw["data"]["tensors"]["next.done"]).reshape(-1)
    want = sorted(set(np.flatnonzero(done).tolist()) | {999, 1999})
    assert len(want) > 40, "a random policy ends many CartPole episodes in 1,000 frames"
    assert raw["ends"]["rows"] == want
    got = tensors(wire.expand_batch(raw))
    assert sum(replay(got, "CartPole-v1", None, 2, seeds={0: 7, 1: 8})) == int(done.sum())
    # 2 x 50 frames would save 1.6 KB: sent whole.
    trainer.send({"type": "continue", "seq": 2, "frames": 100})
    raw, _ = recv_sized(trainer)
    assert "ends" not in raw and "next.observation" in raw["data"]["tensors"]
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


@pytest.mark.parametrize("change, says", [
    (lambda f: f["ends"].update(rows=[3, 1]), "not strictly increasing"),
    (lambda f: f["ends"].update(rows=[1, 2]), "lacks an env's last frame"),
    (lambda f: f["ends"].update(rows=[1, 3, 8]), "past the batch's 8 frames"),
    (lambda f: f["data"]["tensors"].update({"next.observation": f["data"]["tensors"]["observation"]}),
     "is not the `next.` key"),
])
def test_the_scripted_trainers_reading_refuses_ends_that_do_not_fit(change, says):
    obs = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    nxt = np.concatenate([obs[:, 1:], obs[:, -1:] + 100], axis=1)
    assert wire.batch_ends({"observation": obs, "next.observation": nxt}, 2, 4) is None, "96 bytes to save"
    rows, ends = wire.batch_ends({"observation": obs, "next.observation": nxt}, 2, 4, min_saved=0)
    assert rows == [3, 7]
    f = {"type": "batch", "data": {"batch_size": [2, 4], "tensors": {"observation": wire.to_tensor(obs, "f32")}},
         "ends": {"rows": rows, "tensors": {k: wire.to_tensor(a, "f32") for k, a in ends.items()}}}
    assert (wire.from_tensor(wire.expand_batch(copy.deepcopy(f))["data"]["tensors"]["next.observation"]) == nxt).all()
    change(f)
    with pytest.raises(wire.ProtocolError, match=says):
        wire.expand_batch(f)
