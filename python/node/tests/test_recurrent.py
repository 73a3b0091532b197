"""Recurrent ``onnx`` policies (PROTOCOL.md §8, Recurrent; version 6): the node keeps one state
per env and its batches record ``is_init``, ``<name>`` and ``next.<name>``, frame for frame
what torchrl's LSTM and GRU modules say when the same envs are stepped by them in torch; the
state lasts across batches, weight updates and seeds, does not advance during
``init_random_frames``, starts at zero for a rebuilt env and survives a checkpoint. A malformed
``state`` or a model that does not fit it fails the node naming the field or the tensor."""

import copy
import functools
import io

import gymnasium as gym
import numpy as np
import pytest
import torch

import flaky_env
import onnx_models as om
from conftest import Trainer, node_spec, tensors
from rollout_node import spaces
from rollout_node.collect import Workers, restart_seed
from rollout_node.onnx_policy import OnnxPolicy
from rollout_node.policy import ActionSpace, PolicyError

TOL = 1e-5
SEED = 7  # node_spec's rollout.seed: env e is first reset with SEED + e
#: The actors checked against torch: (cell, layers).
ACTORS = {"lstm-1": ("lstm", 1), "lstm-2": ("lstm", 2), "gru-1": ("gru", 1)}


@functools.lru_cache(maxsize=None)
def _exported(name, seed=0):
    cell, layers = ACTORS[name]
    torch.manual_seed(seed)
    actor = om.RecurrentActor(cell, layers=layers)
    return actor, om.export_recurrent(actor)


def actor_and_model(name, seed=0):
    """A fresh copy of actor ``name`` (torch-seeded with ``seed``) and its model's bytes."""
    actor, model = _exported(name, seed)
    return copy.deepcopy(actor), model


def recurrent_spec(actor, model, envs=4, per_worker=2, max_episode_steps=20, exploration="deterministic",
                   env="CartPole-v1", **rollout):
    """A node of ``envs`` CartPole envs in workers of ``per_worker``, acting with ``actor``'s
    model and state."""
    spec = node_spec(env=env, envs=envs, config={"max_episode_steps": max_episode_steps}, policy={
        "config": {"kind": "onnx", "model": model, "head": "categorical", "state": actor.state_spec()},
        "exploration": exploration, "init_seed": 0,
    }, **rollout)
    spec["envs_per_worker"] = per_worker
    return spec


def collect(trainer, seq, frames):
    trainer.send({"type": "continue", "seq": seq, "frames": frames})
    b = trainer.recv()
    assert (b["type"], b.get("seq")) == ("batch", seq), b.get("reason", b)
    return b


def assert_frames(got, want, what):
    """Every frame of ``want`` (the torch replay) is the node's: ``is_init``, ``action`` and
    ``step_count`` exactly, the logits and each state within ``TOL``."""
    for key, w in want.items():
        g = got[key]
        assert g.shape == w.shape, f"{what}: `{key}` is {g.shape}, the replay's {w.shape}"
        if key in ("is_init", "action", "step_count"):
            bad = np.argwhere((g != w).reshape(g.shape[:2] + (-1,)).any(axis=-1))
            assert bad.size == 0, f"{what}: `{key}` differs first at (env, frame) {bad[0].tolist()}"
        else:
            np.testing.assert_allclose(g, w, atol=TOL, rtol=0, err_msg=f"{what}: `{key}`")


def stop(trainer):
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


# -- the spec ---------------------------------------------------------------------------------

H, C = {"name": "recurrent_state_h", "shape": [1, 8]}, {"name": "recurrent_state_c", "shape": [1, 8]}
STATE = "spec.policy.config.state"


@pytest.mark.parametrize("state, reason", [
    ({"name": "h", "shape": [1]}, f"{STATE} must be an array, got dict"),
    (["h"], f"{STATE}[0] must be a map, got str 'h'"),
    ([{"shape": [1, 8]}], f"{STATE}[0].name is missing"),
    ([H, {"name": 7, "shape": [1]}], f"{STATE}[1].name must be a string, got int 7"),
    ([H, {"name": "c"}], f"{STATE}[1].shape is missing"),
    ([H, {"name": "c", "shape": [1, -8]}], f"{STATE}[1].shape must be an array of uint"),
    ([H, {"name": "c", "shape": 8}], f"{STATE}[1].shape must be an array of uint"),
    ([{"name": "a..b", "shape": [1]}], f"{STATE}[0].name 'a..b' is not a batch key"),
    ([{"name": "", "shape": [1]}], f"{STATE}[0].name '' is not a batch key"),
    ([H, {"name": "observation", "shape": [1]}], f"{STATE}[1].name `observation` is a key the batch has already"),
    ([{"name": "action", "shape": [1]}], f"{STATE}[0].name `action` is a key the batch has already"),
    ([{"name": "is_init", "shape": [1]}], f"{STATE}[0].name `is_init` is a key the batch has already"),
    ([{"name": "next.h", "shape": [1]}], f"{STATE}[0].name `next.h` is a key the batch has already"),
    ([{"name": "collector.h", "shape": [1]}], f"{STATE}[0].name `collector.h` is a key the batch has already"),
    ([{"name": "observation.h", "shape": [1]}], f"{STATE}[0].name `observation.h` is a key the batch has already"),
    ([H, {"name": "logits", "shape": [1]}], f"{STATE}[1].name `logits` is a key the batch has already"),
    ([{"name": "step_count", "shape": [1]}], f"{STATE}[0].name `step_count` is a key the batch has already"),
    ([{"name": "step_count.h", "shape": [1]}], f"{STATE}[0].name `step_count.h` is a key the batch has already"),
    ([H, {"name": "recurrent_state_h.x", "shape": [1]}], f"{STATE}[1].name `recurrent_state_h.x` and `recurrent_state_h` nest"),
    ([{"name": "c", "shape": [1, 0]}], f"{STATE}[0].shape [1, 0] has a zero dimension"),
    ([H, C, dict(H)], f"{STATE}[2].name `recurrent_state_h` is the name of another state tensor"),
    ([{"name": f"s{i}", "shape": [1]} for i in range(9)], f"{STATE} has 9 tensors, at most 8"),
    ([H, {"name": "c", "shape": [1024, 1025]}], f"{STATE}[1].shape [1024, 1025] has over 1048576 elements"),
    ([{"name": "c", "shape": [1] * 9}], f"{STATE}[0].shape has 9 dimensions"),
    ([{"name": "x" * 129, "shape": [1]}], f"{STATE}[0].name is 129 bytes, a state tensor's name at most 128"),
])
def test_a_malformed_state_fails_the_node_naming_the_field(trainer, state, reason):
    actor, model = actor_and_model("lstm-1")
    spec = recurrent_spec(actor, model)
    spec["policy"]["config"]["state"] = state
    trainer.start_node()
    f = trainer.join(spec, weights=om.state_weights(actor, 0))
    assert f["type"] == "failed", f
    assert f["reason"].startswith(f"cannot build the node: {reason}"), f["reason"]
    code, err = trainer.finish()
    assert code == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("state", [None, []])
def test_an_absent_or_empty_state_is_a_policy_without_state(state):
    actor, model = actor_and_model("lstm-1")
    plain = om.export(om.CategoricalMlp(), torch.zeros(1, 4), ["logits"])
    spec = recurrent_spec(actor, plain)
    spec["policy"]["config"]["state"] = state
    w = Workers(spec)
    assert w.recurrent is None and "is_init" not in w.layout()
    w.close()


# -- the model ----------------------------------------------------------------------------------

def build(model, state, env="CartPole-v1"):
    """The onnx policy of ``model`` with ``state`` (``[{name, shape}]``) for ``env``."""
    e = gym.make(env)
    leaves = spaces.leaves(spaces.specs(e.observation_space, e.action_space)["observation"])
    spec = {"config": {"kind": "onnx", "model": model, "head": "categorical", "state": state}, "exploration": "deterministic"}
    return OnnxPolicy(spec, leaves, ActionSpace.of(e.action_space), 0)


class NoIsInit(torch.nn.Module):
    """An LSTM step without the ``is_init`` input."""

    def __init__(self, actor):
        super().__init__()
        self.actor = actor

    def forward(self, observation, h, c):
        return self.actor(observation, torch.zeros(observation.shape[0], 1, dtype=torch.bool), h, c)


class FloatIsInit(NoIsInit):
    """An LSTM step whose ``is_init`` is a float."""

    def forward(self, observation, is_init, h, c):
        return self.actor(observation, is_init > 0.5, h, c)


class FlatState(NoIsInit):
    """An LSTM step returning its next ``h`` flattened to ``[K, hidden]``."""

    def forward(self, observation, is_init, h, c):
        logits, nh, nc = self.actor(observation, is_init, h, c)
        return logits, nh.flatten(1), nc


def _broken(kind):
    """The bytes of a broken recurrent model ``kind`` (1-layer LSTM, hidden 8, CartPole)."""
    actor, model = actor_and_model("lstm-1")
    ins = om.recurrent_inputs(actor)
    outs = ["logits", "next.recurrent_state_h", "next.recurrent_state_c"]
    if kind == "no is_init":
        del ins["is_init"]
        return om.export_step(NoIsInit(actor), ins, outs)
    if kind == "float is_init":
        ins["is_init"] = torch.zeros(3, 1)
        return om.export_step(FloatIsInit(actor), ins, outs)
    if kind == "flat next h":
        return om.export_step(FlatState(actor), ins, outs)
    if kind == "no next c":
        return om.export_step(actor, ins, outs[:2] + ["c_out"])
    return model


@pytest.mark.parametrize("kind, state, named", [
    ("no is_init", [H, C], r"the recurrent model needs an input `is_init` \(bool \[K, 1\]\)"),
    ("float is_init", [H, C], r"model input `is_init` is float \[K, 1\], the state needs bool \[K, 1\]"),
    ("whole", [{"name": "recurrent_state_h", "shape": [2, 8]}, C],
     r"model input `recurrent_state_h` is float \[K, 1, 8\], the state needs float \[K, 2, 8\]"),
    ("whole", [{"name": "recurrent_state", "shape": [1, 8]}], r"needs an input `recurrent_state` \(float \[K, 1, 8\]\)"),
    ("no next c", [H, C], r"needs an output `next.recurrent_state_c` \(float \[K, 1, 8\]\)"),
    ("flat next h", [H, C], r"model output `next.recurrent_state_h` is float \[K, 8\], the state needs float \[K, 1, 8\]"),
])
def test_a_model_that_does_not_fit_its_state_is_refused_naming_the_tensor(kind, state, named):
    with pytest.raises(PolicyError, match=named):
        build(_broken(kind), state)


def test_a_model_without_is_init_fails_the_node_naming_it(trainer):
    actor, _ = actor_and_model("lstm-1")
    trainer.start_node()
    f = trainer.join(recurrent_spec(actor, _broken("no is_init")), weights=om.state_weights(actor, 0))
    assert f["type"] == "failed" and "needs an input `is_init`" in f["reason"], f
    assert trainer.finish()[0] == 1


def test_the_ready_layout_holds_is_init_and_each_state_and_its_next_as_batches_do(trainer):
    actor, model = actor_and_model("lstm-2")
    trainer.start_node()
    ready = trainer.join(recurrent_spec(actor, model), weights=om.state_weights(actor, 0))
    assert ready["type"] == "ready", ready
    want = {"is_init": ["bool", [1]]}
    for name in ("recurrent_state_h", "recurrent_state_c"):
        want[name] = want["next." + name] = ["f32", [2, 8]]
    assert {k: ready["layout"][k] for k in want} == want
    b = collect(trainer, 1, 40)
    wire_dtypes = {k: [t["dtype"], t["shape"][2:]] for k, t in b["data"]["tensors"].items()}
    assert wire_dtypes == ready["layout"]
    stop(trainer)


# -- against torch --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ACTORS))
def test_every_frame_is_what_the_torch_module_says_across_batches_an_update_and_a_seed(trainer, name):
    # 4 envs in workers of 2, 12 batches of 10 frames each, episodes of at most 20 steps (so
    # they end inside batches and across them); new weights after batch 5, a seed after batch 8.
    actor, model = actor_and_model(name)
    learned = copy.deepcopy(actor)
    om.perturb(learned, 11)
    E, T, UPDATE, SEED_AT, RESEED = 4, 10, 5, 8, 100
    trainer.start_node()
    assert trainer.join(recurrent_spec(actor, model), weights=om.state_weights(actor, 0))["type"] == "ready"
    batches = []
    for seq in range(1, 13):
        batches.append(tensors(collect(trainer, seq, E * T)))
        if seq == UPDATE:
            trainer.send({"type": "update_weights", "weights": om.state_weights(learned, 1)})
            assert trainer.recv() == {"type": "weights_updated", "node": 0, "version": 1}
        if seq == SEED_AT:
            trainer.send({"type": "seed", "seed": RESEED})
            assert trainer.recv()["type"] == "seeded"
    stop(trainer)

    replay = om.RecurrentReplay([SEED + e for e in range(E)], 20, actor.state)
    for seq, got in enumerate(batches, 1):
        if seq == SEED_AT + 1:
            replay.reseed(RESEED)
        assert_frames(got, replay.frames(actor if seq <= UPDATE else learned, T), f"batch {seq}")
    # The state is kept across the update: the first frame after it reads the last one's
    # `next.<name>` in every env not starting an episode there (the replay says the same).
    before, after = batches[UPDATE - 1], batches[UPDATE]
    going_on = ~after["is_init"][:, 0, 0]
    assert going_on.any()
    for n, _ in actor.state:
        assert np.array_equal(after[n][going_on, 0], before["next." + n][going_on, -1])
        assert (after[n][going_on, 0] != 0).any()
    # The seed cut every episode: the next frame of each env starts one, from zero.
    first = batches[SEED_AT]
    assert first["is_init"][:, 0, 0].all() and (first["step_count"][:, 0, 0] == 0).all()
    assert all((first[n][:, 0] == 0).all() for n, _ in actor.state)


def test_init_random_frames_do_not_advance_the_state(trainer):
    # 2 envs of one worker each, 15 random frames each, episodes of at most 8 steps: the random
    # frames cross resets; their state stays zero, and the model's frames then go on from it.
    actor, model = actor_and_model("lstm-1")
    E, T, RANDOM = 2, 10, 15
    trainer.start_node()
    trainer.join(recurrent_spec(actor, model, envs=E, per_worker=1, max_episode_steps=8, init_random_frames=RANDOM),
                 weights=om.state_weights(actor, 0))
    got = [tensors(collect(trainer, seq, E * T)) for seq in (1, 2, 3)]
    stop(trainer)
    whole = {k: np.concatenate([b[k] for b in got], axis=1) for k in got[0]}
    random = np.zeros((E, 3 * T), bool)
    random[:, :RANDOM] = True
    for n, _ in actor.state:
        assert (whole[n][random] == 0).all() and (whole["next." + n][random] == 0).all(), n
        assert (whole["next." + n][~random] != 0).any(), n
    assert (whole["logits"][random] == 0).all()
    assert whole["is_init"][:, 1:RANDOM].any(), "no episode started within the random frames"
    np.testing.assert_array_equal(whole["is_init"], whole["step_count"] == 0)
    replay = om.RecurrentReplay([SEED + e for e in range(E)], 8, actor.state)
    assert_frames(whole, replay.frames(actor, 3 * T, random, whole["action"]), "3 batches")


def test_a_rebuilt_env_starts_from_zero_and_the_others_keep_their_state():
    # Env 1 of 3 (the first FlakyCartPole made after COUNT is set to -1) raises at its 17th
    # step, in the second batch: its row starts over from its restart seed with a zero state,
    # random again for the 2 frames left of its 12 (one model call for its random frames and
    # the model frames of the others); rows 0 and 2 (2 was acted in that column but not
    # stepped) go on as the replay does.
    actor, model = actor_and_model("gru-1")
    flaky_env.COUNT[0] = -1
    spec = recurrent_spec(actor, model, envs=3, per_worker=1, env="FlakyCartPole-v0", init_random_frames=12)
    spec["env"]["config"]["fail_at"] = 17
    w = Workers(spec)
    first, second = w.collect(3 * 10), w.collect(3 * 10)
    assert w.restart_count == [0, 1, 0]
    w.close()
    whole = {k: np.concatenate([first[k], second[k]], axis=1) for k in first}
    random = np.zeros((3, 20), bool)
    random[:, :12] = True
    replay = om.RecurrentReplay([SEED, SEED + 1, SEED + 2], 20, actor.state)
    want = replay.frames(actor, 20, random, whole["action"])
    assert_frames({k: whole[k][[0, 2]] for k in want}, {k: v[[0, 2]] for k, v in want.items()}, "rows 0 and 2")
    rebuilt = om.RecurrentReplay([restart_seed(SEED + 1, 1)], 20, actor.state)
    want = rebuilt.frames(actor, 10, random[[1], 10:], second["action"][[1]])
    assert_frames({k: second[k][[1]] for k in want}, want, "row 1, rebuilt")
    assert second["is_init"][1, 0, 0] and (second["recurrent_state"][1, :3] == 0).all()
    assert (second["next.recurrent_state"][1, 2] != 0).any()


# -- checkpoints ----------------------------------------------------------------------------------

def test_a_restored_snapshot_goes_on_with_the_same_bytes_and_one_without_the_state_is_refused(trainer, tmp_path):
    # Random exploration, 4 envs in workers of 2, new weights after batch 2; a snapshot after
    # every batch from 3 on. The one taken where the next batch has an env going on with a
    # nonzero state and an env starting an episode is restored on a new node.
    actor, model = actor_and_model("lstm-2")
    learned = copy.deepcopy(actor)
    om.perturb(learned, 5)
    spec = recurrent_spec(actor, model, exploration="random")
    trainer.start_node()
    trainer.join(spec, weights=om.state_weights(actor, 0))
    batches, snaps = {}, {}
    for seq in range(1, 10):
        batches[seq] = tensors(collect(trainer, seq, 40))
        if seq == 2:
            trainer.send({"type": "update_weights", "weights": om.state_weights(learned, 1)})
            assert trainer.recv()["type"] == "weights_updated"
        if seq >= 3:
            trainer.send({"type": "snapshot", "id": seq})
            snap = trainer.recv()
            assert (snap["type"], snap["id"]) == ("snapshot", seq), snap
            snaps[seq] = snap["state"]
    stop(trainer)

    def both_kinds(seq):
        nxt = batches[seq + 1]
        going_on = ~nxt["is_init"][:, 0, 0] & (nxt["recurrent_state_h"][:, 0] != 0).any(axis=(1, 2))
        return going_on.any() and nxt["is_init"][:, 0, 0].any()

    at = next((s for s in range(3, 7) if both_kinds(s)), None)
    assert at is not None, "no batch boundary with both an episode going on and one starting"
    state = snaps[at]
    for worker in state["workers"]:
        r = worker["rollout"]["recurrent"]
        assert r["names"] == ["recurrent_state_h", "recurrent_state_c"]
        assert [len(v) for v in r["state"]] == [2 * 2 * 8] * 2  # 2 envs of [2, 8] each
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = Trainer(other_dir)
    try:
        other.start_node()
        other.join(spec, weights=om.state_weights(actor, 0))
        # As a trainer that drops `RolloutState.recurrent` would hand it back: refused, and
        # the node goes on serving.
        dropped = copy.deepcopy(state)
        for worker in dropped["workers"]:
            del worker["rollout"]["recurrent"]
        other.send({"type": "restore", **dropped})
        f = other.recv()
        assert (f["type"], f["id"]) == ("checkpoint_failed", 0), f
        assert "worker 0's recurrent state (RolloutState.recurrent) is missing" in f["reason"], f
        other.send({"type": "restore", **state})
        assert other.recv() == {"type": "restored", "node": 0}
        for seq in range(at + 1, at + 4):
            b = collect(other, seq, 40)
            assert b["weights_version"] == 1
            got = tensors(b)
            assert set(got) == set(batches[seq])
            for k, v in batches[seq].items():
                assert got[k].tobytes() == v.tobytes(), f"batch {seq}, `{k}`"
        stop(other)
    finally:
        other.close()
