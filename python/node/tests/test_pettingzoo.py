"""PettingZoo multi-agent envs on the Python node (issue 40; PROTOCOL.md §3, version 10): specs
and layouts of real envs, every key of every frame against PettingZoo stepped by hand with the
recorded actions and the documented seeds (agents that die included), the random and onnx
policies' actions and records, ends, replay by seed, and what is refused."""

import importlib
import io

import msgpack
import numpy as np
import pytest
import torch
from torch import nn

from conftest import node_spec, tensors
from rollout_node import wire
from rollout_node.collect import BuildError, restart_seed
from rollout_node.envpool_backend import make_workers
from rollout_node.marl_replay import check_rows, rows_of
from rollout_node.policy import ActionSpace, PolicyError, random_actions
from rollout_node.replay import main as replay_main

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
KAZ = "pettingzoo:pettingzoo.butterfly.knights_archers_zombies_v11"
#: Zombies every 3 steps: knights and archers die one by one within ~150 steps.
KAZ_CONFIG = {"spawn_delay": 3}
#: A seed whose random-policy batches of 2 x 150 frames see an archer and a knight die before
#: the others, and an episode end in each row.
KAZ_SEED = 3
RANDOM = {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0}
SPREAD_GROUPS = {"agent": ["agent_0", "agent_1", "agent_2"]}
KAZ_GROUPS = {"archer": ["archer_0", "archer_1"], "knight": ["knight_0", "knight_1"]}
GOLDEN, MASK64 = 0x9E3779B97F4A7C15, (1 << 64) - 1


def spec(env, envs, config=None, policy=None, **rollout):
    return node_spec(env=env, envs=envs, config=config, policy=policy or dict(RANDOM), **rollout)


def make(name, config):
    """A fresh ParallelEnv of a ``pettingzoo:<module>`` id, as a user makes it."""
    return importlib.import_module(name.split(":")[1]).parallel_env(**(config or {}))


def reference(batch, name, config, groups, seeds, max_traj=None, first_ids=None, lanes=None):
    """Every env key of ``batch`` ([E, T, ...]) as PettingZoo gives it: row k reset with
    ``seeds[k]`` then without a seed after each episode's end (no agent left, or
    ``max_traj`` frames), stepped with the batch's actions of the agents in ``env.agents``;
    absent agents zero; an agent the step returned no flags for terminated and truncated, the
    cut truncating every agent, the env's flags those of every agent (torchrl's rules).
    Trajectory ids from ``first_ids[k]`` (default k) in steps of ``lanes`` (default E)."""
    E, T = batch["collector.traj_ids"].shape
    lanes = lanes or E
    want = {k: np.zeros_like(v) for k, v in batch.items()}
    for k in range(E):
        env = make(name, config)
        obs, _ = env.reset(seed=seeds[k])
        sc, traj = 0, k if first_ids is None else first_ids[k]
        for t in range(T):
            present = list(env.agents)
            acts = {a: _as_env_action(batch[f"{g}.action"][k, t, j]) for g, ag in groups.items() for j, a in enumerate(ag) if a in present}
            nxt, r, te, tr, _ = env.step(acts)
            cut = max_traj is not None and sc + 1 >= max_traj
            flags = []
            for g, ag in groups.items():
                for j, a in enumerate(ag):
                    want[f"{g}.mask"][k, t, j] = a in present
                    want[f"next.{g}.mask"][k, t, j] = a in env.agents
                    if a in present:
                        want[f"{g}.observation"][k, t, j] = obs[a]
                        want[f"{g}.action"][k, t, j] = acts[a]
                    if a in nxt:
                        want[f"next.{g}.observation"][k, t, j] = nxt[a]
                    want[f"next.{g}.reward"][k, t, j, 0] = r.get(a, 0.0)
                    term, trunc = bool(te.get(a, True)), bool(tr.get(a, True)) or cut
                    want[f"next.{g}.terminated"][k, t, j, 0] = term
                    want[f"next.{g}.truncated"][k, t, j, 0] = trunc
                    want[f"next.{g}.done"][k, t, j, 0] = term or trunc
                    flags.append((term, trunc))
            done = not env.agents or cut or all(a or b for a, b in flags)
            want["next.done"][k, t, 0] = done
            want["next.truncated"][k, t, 0] = done and all(b for _, b in flags)
            want["next.terminated"][k, t, 0] = done and all(a for a, _ in flags)
            want["collector.traj_ids"][k, t] = traj
            want["step_count"][k, t, 0] = sc
            sc += 1
            obs = nxt
            if done:
                obs, _ = env.reset()
                sc, traj = 0, traj + lanes
    return want


def _as_env_action(v):
    return int(v) if np.ndim(v) == 0 else v.copy()


def assert_env_keys(batch, want, recorded):
    assert set(batch) == set(want)
    for key in want:
        if key in recorded:
            continue
        assert batch[key].dtype == want[key].dtype, key
        assert np.array_equal(batch[key], want[key]), (key, np.argwhere(batch[key] != want[key])[:5])


def spread_layout(n=3, recorded=()):
    layout = {
        "agent.observation": ["f32", [n, 18]], "next.agent.observation": ["f32", [n, 18]],
        "agent.action": ["i64", [n]], "agent.mask": ["bool", [n]], "next.agent.mask": ["bool", [n]],
        "next.agent.reward": ["f32", [n, 1]],
        "next.agent.terminated": ["bool", [n, 1]], "next.agent.truncated": ["bool", [n, 1]], "next.agent.done": ["bool", [n, 1]],
        "next.done": ["bool", [1]], "next.terminated": ["bool", [1]], "next.truncated": ["bool", [1]],
        "collector.traj_ids": ["i64", []], "step_count": ["i64", [1]],
    }
    layout.update(recorded)
    return layout


def test_simple_spread_is_one_group_of_three_agents():
    w = make_workers(spec(SPREAD, 2))
    box = {"kind": "box", "dtype": "f32", "shape": [18], "low": float("-inf"), "high": float("inf")}
    assert w.specs == {
        "observation": {"kind": "dict", "spaces": {"agent": box}},
        "action": {"kind": "dict", "spaces": {"agent": {"kind": "discrete", "n": 5}}},
        "agents": SPREAD_GROUPS,
    }
    assert w.layout() == spread_layout(recorded={"agent.action_log_prob": ["f32", [3]]})
    b = w.collect(20)
    assert {k: [v.dtype.name, list(v.shape)] for k, v in b.items()}["agent.observation"] == ["float32", [2, 10, 3, 18]]
    for k, (dtype, shape) in w.layout().items():
        assert list(b[k].shape) == [2, 10, *shape] and wire_dtype(b[k]) == dtype, k
    assert not {"observation", "action", "next.reward"} & set(b)


def wire_dtype(a):
    return {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "bool", "uint8": "u8"}[a.dtype.name]


def test_knights_archers_zombies_are_two_groups_and_record_nothing_when_told():
    w = make_workers(spec(KAZ, 1, KAZ_CONFIG, policy={**RANDOM, "record": False}))
    box = {"kind": "box", "dtype": "f64", "shape": [27, 5], "low": -1.0, "high": 1.0}
    assert w.specs == {
        "observation": {"kind": "dict", "spaces": {"archer": box, "knight": box}},
        "action": {"kind": "dict", "spaces": {"archer": {"kind": "discrete", "n": 6}, "knight": {"kind": "discrete", "n": 6}}},
        "agents": KAZ_GROUPS,
    }
    layout = w.layout()
    assert layout["archer.observation"] == ["f64", [2, 27, 5]] and layout["next.knight.done"] == ["bool", [2, 1]]
    assert not [k for k in layout if k.endswith("action_log_prob")]
    assert set(w.collect(10)) == set(layout)


def test_double_to_float_reports_and_collects_f64_observations_as_f32():
    w = make_workers(spec(KAZ, 1, KAZ_CONFIG), double_to_float=True)
    assert w.specs["observation"]["spaces"]["knight"]["dtype"] == "f32"
    assert w.layout()["next.knight.observation"] == ["f32", [2, 27, 5]]
    b = w.collect(5)
    want = reference(b, KAZ, KAZ_CONFIG, KAZ_GROUPS, seeds=[7])
    assert b["knight.observation"].dtype == np.float32
    assert np.array_equal(b["knight.observation"], want["knight.observation"].astype(np.float32))


@pytest.mark.parametrize("max_traj", [None, 10])
def test_every_key_of_every_simple_spread_frame_is_what_pettingzoo_gives(max_traj):
    w = make_workers(spec(SPREAD, 2, max_frames_per_traj=max_traj))
    batches = [w.collect(2 * 40), w.collect(2 * 40)]
    b = {k: np.concatenate([x[k] for x in batches], axis=1) for k in batches[0]}
    want = reference(b, SPREAD, None, SPREAD_GROUPS, seeds=[7, 8], max_traj=max_traj)
    assert_env_keys(b, want, {"agent.action_log_prob"})
    ends = np.flatnonzero(b["next.done"][0, :, 0])
    # max_cycles 25 truncates every agent: the episode ends there, truncated; or the node's cut.
    assert ends.tolist() == ([24, 49, 74] if max_traj is None else [9, 19, 29, 39, 49, 59, 69, 79])
    assert b["next.truncated"][:, ends].all() and not b["next.terminated"].any()
    assert b["agent.mask"].all()
    # The node's cut truncates every agent, as max_cycles does (torchrl reads per-agent flags).
    assert b["next.agent.truncated"][0, ends, :, 0].all()
    assert not b["next.agent.truncated"][0, np.setdiff1d(np.arange(80), ends), :, 0].any()


def test_box_actions_are_f32_per_agent_and_their_frames_are_pettingzoo_s():
    config = {"continuous_actions": True}
    w = make_workers(spec(SPREAD, 2, config=config))
    assert w.specs["action"]["spaces"]["agent"] == {"kind": "box", "dtype": "f32", "shape": [5], "low": 0.0, "high": 1.0}
    assert w.layout()["agent.action"] == ["f32", [3, 5]]
    b = w.collect(2 * 30)
    assert b["agent.action"].dtype == np.float32 and len(np.unique(b["agent.action"])) > 100
    assert ((b["agent.action"] >= 0) & (b["agent.action"] <= 1)).all()
    assert (b["agent.action_log_prob"] == 0).all()  # -ln(1 - 0) summed over the box
    assert_env_keys(b, reference(b, SPREAD, config, SPREAD_GROUPS, seeds=[7, 8]), {"agent.action_log_prob"})


def kaz_batch(envs=2, frames=150, policy=None, **rollout):
    w = make_workers(spec(KAZ, envs, KAZ_CONFIG, policy=policy, seed=KAZ_SEED, **rollout))
    return w, w.collect(envs * frames)


def test_knights_and_archers_that_die_are_masked_and_flagged_as_pettingzoo_says():
    w, b = kaz_batch()
    want = reference(b, KAZ, KAZ_CONFIG, KAZ_GROUPS, seeds=[KAZ_SEED, KAZ_SEED + 1])
    assert_env_keys(b, want, {"archer.action_log_prob", "knight.action_log_prob"})
    masks = np.concatenate([b["archer.mask"], b["knight.mask"]], axis=2)  # [E, T, 4]
    # Some agent died while others played on (not only whole episodes ending together).
    partial = masks.any(axis=2) & ~masks.all(axis=2)
    assert partial.any(), "no frame with some agents dead and others alive"
    k, t = np.argwhere(partial)[0]
    # The first frame an agent is absent: its step before said terminated, it is terminated
    # and zero from then on, and its last observation was the step's next observation.
    assert masks[k, t - 1].all()  # the first such frame: all four played the step before
    g, j = next((g, j) for g in KAZ_GROUPS for j in range(2) if not b[f"{g}.mask"][k, t, j])
    assert b[f"next.{g}.terminated"][k, t - 1, j, 0] and b[f"{g}.mask"][k, t - 1, j]
    assert b[f"next.{g}.observation"][k, t - 1, j].any()
    assert not b[f"{g}.observation"][k, t, j].any() and b[f"{g}.action"][k, t, j] == 0
    # Gone: the step returns it no flags, so it is terminated and truncated (torchrl's rule),
    # absent after the step too; the agents still playing keep the episode going.
    assert b[f"next.{g}.terminated"][k, t, j, 0] and b[f"next.{g}.truncated"][k, t, j, 0]
    assert not b[f"next.{g}.mask"][k, t - 1, j] and not b[f"next.{g}.mask"][k, t, j]
    assert not b["next.done"][k, t - 1, 0] and masks[k, t].any()
    assert b["next.done"][:, :, 0].any(), "an episode ended in the batch"


def test_the_random_policy_draws_every_agent_in_order_and_records_its_log_density():
    w, b = kaz_batch(frames=150)
    rng = np.random.default_rng(((KAZ_SEED * GOLDEN) & MASK64) ^ 1)
    six = ActionSpace(n=6)
    E, T = b["collector.traj_ids"].shape
    want = {g: np.zeros((E, T, 2), np.int64) for g in KAZ_GROUPS}
    for t in range(T):
        for k in range(E):
            for g in ("archer", "knight"):
                for j in range(2):
                    want[g][k, t, j] = random_actions(six, rng, 1)[0]
    for g in KAZ_GROUPS:
        mask = b[f"{g}.mask"]
        assert not mask.all(), "some agent is absent in the batch"
        assert np.array_equal(b[f"{g}.action"], np.where(mask, want[g], 0))
        lp = b[f"{g}.action_log_prob"]
        assert lp.dtype == np.float32
        assert np.array_equal(lp, np.where(mask, np.float32(-np.log(6.0)), np.float32(0)))


class GroupLogits(nn.Module):
    """[K, n, obs] -> [K, n, actions]: one linear layer shared by a group's agents."""

    def __init__(self, obs, n_actions, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Linear(obs, n_actions)

    def forward(self, x):
        return self.net(x.flatten(2).float())


class TwoGroups(nn.Module):
    def __init__(self):
        super().__init__()
        self.archer, self.knight = GroupLogits(135, 6, 1), GroupLogits(135, 6, 2)

    def forward(self, archer, knight):
        return self.archer(archer), self.knight(knight)


def onnx_bytes(module, examples, inputs, outputs):
    f = io.BytesIO()
    axes = {name: {0: "K"} for name in [*inputs, *outputs]}
    torch.onnx.export(module, tuple(examples), f, input_names=inputs, output_names=outputs,
                      dynamic_axes=axes, dynamo=False, do_constant_folding=False)
    return f.getvalue()


def onnx_policy(model, mode="deterministic", **config):
    return {"config": {"kind": "onnx", "model": model, "head": "categorical", **config}, "exploration": mode, "init_seed": 0}


@pytest.mark.parametrize("names", [("agent.observation", "agent.logits"), ("obs", "logits")])
def test_an_onnx_model_of_a_group_acts_as_the_model_run_by_hand(names):
    pytest.importorskip("onnxruntime")
    m = GroupLogits(18, 5, 0)
    model = onnx_bytes(m, [torch.zeros(2, 3, 18)], [names[0]], [names[1]])
    w = make_workers(spec(SPREAD, 2, policy=onnx_policy(model)))
    assert w.layout()["agent.logits"] == ["f32", [3, 5]]
    b = w.collect(2 * 30)
    with torch.no_grad():
        logits = m(torch.from_numpy(b["agent.observation"].reshape(-1, 3, 18))).numpy().reshape(2, 30, 3, 5)
    assert np.allclose(b["agent.logits"], logits, atol=1e-5)
    assert np.array_equal(b["agent.action"], logits.argmax(-1))
    lp = torch.log_softmax(torch.from_numpy(logits).double(), -1).numpy()
    assert np.allclose(b["agent.action_log_prob"], np.take_along_axis(lp, b["agent.action"][..., None], -1)[..., 0], atol=1e-5)
    assert_env_keys(b, reference(b, SPREAD, None, SPREAD_GROUPS, seeds=[7, 8]), {"agent.logits", "agent.action_log_prob"})


def test_an_onnx_model_of_two_groups_zeroes_the_dead_agents():
    pytest.importorskip("onnxruntime")
    m = TwoGroups()
    x = torch.zeros(2, 2, 27, 5, dtype=torch.float64)
    model = onnx_bytes(m, [x, x], ["archer.observation", "knight.observation"], ["archer.logits", "knight.logits"])
    _, b = kaz_batch(policy=onnx_policy(model, "random"))
    for g, net in (("archer", m.archer), ("knight", m.knight)):
        mask = b[f"{g}.mask"]
        assert not mask.all()
        with torch.no_grad():
            logits = net(torch.from_numpy(b[f"{g}.observation"].reshape(-1, 2, 27, 5))).numpy().reshape(2, 150, 2, 6)
        assert np.allclose(b[f"{g}.logits"], np.where(mask[..., None], logits, 0), atol=1e-5)
        lp = torch.log_softmax(torch.from_numpy(logits).double(), -1).numpy()
        chosen = np.take_along_axis(lp, b[f"{g}.action"][..., None], -1)[..., 0]
        assert np.allclose(b[f"{g}.action_log_prob"], np.where(mask, chosen, 0), atol=1e-5)
        assert (b[f"{g}.action"][~mask] == 0).all()
    assert_env_keys(b, reference(b, KAZ, KAZ_CONFIG, KAZ_GROUPS, seeds=[KAZ_SEED, KAZ_SEED + 1]),
                    {"archer.logits", "knight.logits", "archer.action_log_prob", "knight.action_log_prob"})


def test_ends_send_each_group_observation_once_and_the_trainer_rebuilds_it():
    w = make_workers(spec(SPREAD, 2, max_frames_per_traj=20))
    b = w.collect(2 * 100)
    ends = wire.batch_ends(b, 2, 100)
    assert ends is not None
    rows, once = ends
    assert set(once) == {"next.agent.observation"}
    assert rows == [19, 39, 59, 79, 99, 119, 139, 159, 179, 199]
    frame = {"type": "batch", "data": {"batch_size": [2, 100], "tensors": {
        k: wire.to_tensor(v, wire_dtype(v)) for k, v in b.items() if k not in once}},
        "ends": {"rows": rows, "tensors": {k: wire.to_tensor(v, wire_dtype(v)) for k, v in once.items()}}}
    back = tensors(wire.expand_batch(msgpack.unpackb(msgpack.packb(frame, use_bin_type=True), raw=False)))
    assert set(back) == set(b)
    for k in b:
        assert np.array_equal(back[k], b[k]), k


def test_an_agent_that_leaves_makes_its_frame_an_end():
    """Its last next observation is not zero, its next frame's observation is: that row is sent."""
    _, b = kaz_batch(frames=150)
    ends = wire.batch_ends(b, 2, 150, min_saved=0)
    left = np.zeros((2, 150), bool)
    for g in KAZ_GROUPS:
        m = b[f"{g}.mask"]
        left[:, :-1] |= (m[:, :-1] & ~m[:, 1:]).any(axis=2)
    assert left.any()
    assert set(np.flatnonzero(left)) <= set(ends[0])


def test_replay_by_seed_checks_every_frame_of_an_output_file(tmp_path, capsys):
    w, b1 = kaz_batch(frames=100, max_frames_per_traj=120)
    b2 = w.collect(2 * 100)
    path = tmp_path / "out.msgpack"
    with open(path, "wb") as f:
        for i, b in enumerate((b1, b2)):
            data = {k: wire.to_tensor(v, wire_dtype(v)) for k, v in b.items()}
            f.write(msgpack.packb({"batch": i, "node": 0, "weights_version": 0, "data": data}, use_bin_type=True))
    args = [str(path), "--env", KAZ, "--seed", str(KAZ_SEED), "--env-config", '{"spawn_delay": 3}', "--max-frames-per-traj", "120"]
    assert replay_main(args) == 0
    assert "400 frames replay through PettingZoo" in capsys.readouterr().out
    problems, _ = check_rows(rows_of([b1, b2]), KAZ, KAZ_SEED + 1, KAZ_CONFIG, 120)  # the wrong seed
    assert len(problems) == 2 and problems[0].startswith("row 0 frame ")
    b2["next.knight.terminated"][1, 50, 0, 0] ^= True
    assert check_rows(rows_of([b1, b2]), KAZ, KAZ_SEED, KAZ_CONFIG, 120)[0] == [
        "row 1 frame 150: terminated, truncated, done of knight_0 "
        f"({bool(b2['next.knight.terminated'][1, 50, 0, 0])}, False, {bool(b2['next.knight.done'][1, 50, 0, 0])}), "
        f"PettingZoo gives ({not b2['next.knight.terminated'][1, 50, 0, 0]}, False, {bool(b2['next.knight.done'][1, 50, 0, 0])})"]


def test_a_seed_message_starts_every_env_anew_from_the_new_seed():
    w = make_workers(spec(SPREAD, 2))
    w.collect(2 * 10)
    assert w.set_seed(100) == 102
    b = w.collect(2 * 30)
    assert_env_keys(b, {**reference(b, SPREAD, None, SPREAD_GROUPS, seeds=[100, 101]),
                        "collector.traj_ids": b["collector.traj_ids"]}, {"agent.action_log_prob"})
    assert b["step_count"][:, 0, 0].tolist() == [0, 0]


def test_a_row_whose_env_raises_is_rebuilt_with_its_restart_seed_and_the_others_keep_theirs():
    import marl_envs

    marl_envs.MADE[0] = 0  # env 1 of 3 (the second made) raises at its 17th step
    config = {"module": "mpe2.simple_spread_v3", "fail_at": 17, "which": 2}
    w = make_workers(spec("pettingzoo:marl_envs:flaky", 3, config=config))
    b = w.collect(3 * 40)
    assert w.restart_count == [0, 1, 0]
    rows = {k: {key: v[k:k + 1] for key, v in b.items()} for k in range(3)}
    for k in (0, 2):
        want = reference(rows[k], SPREAD, None, SPREAD_GROUPS, seeds=[7 + k], first_ids=[k], lanes=3)
        assert_env_keys(rows[k], want, {"agent.action_log_prob"})
    # Row 1 from its first frame: reset with the restart seed, ids of its lane after the one
    # the failed attempt handed out (1): 4, then 7 at its next episode.
    want = reference(rows[1], SPREAD, None, SPREAD_GROUPS, seeds=[restart_seed(8, 1)], first_ids=[4], lanes=3)
    assert_env_keys(rows[1], want, {"agent.action_log_prob"})


def test_init_random_frames_act_at_random_then_the_model_acts():
    pytest.importorskip("onnxruntime")
    m = GroupLogits(18, 5, 0)
    model = onnx_bytes(m, [torch.zeros(2, 3, 18)], ["agent.observation"], ["agent.logits"])
    w = make_workers(spec(SPREAD, 2, policy=onnx_policy(model), init_random_frames=10))
    b = w.collect(2 * 20)
    rng = np.random.default_rng(((7 * GOLDEN) & MASK64) ^ 1)
    five = ActionSpace(n=5)
    draws = np.array([[[random_actions(five, rng, 1)[0] for _ in range(3)] for _ in range(2)] for _ in range(10)])
    assert np.array_equal(b["agent.action"][:, :10], draws.swapaxes(0, 1))
    assert (b["agent.action_log_prob"][:, :10] == np.float32(-np.log(5.0))).all()
    assert (b["agent.logits"][:, :10] == 0).all()
    with torch.no_grad():
        logits = m(torch.from_numpy(b["agent.observation"][:, 10:].reshape(-1, 3, 18))).numpy().reshape(2, 10, 3, 5)
    assert np.array_equal(b["agent.action"][:, 10:], logits.argmax(-1))
    assert np.allclose(b["agent.logits"][:, 10:], logits, atol=1e-5)


def test_a_snapshot_or_restore_is_refused_with_the_reason():
    from rollout_node import collect

    w = make_workers(spec(SPREAD, 1))
    for act in (lambda: collect.snapshot(w), lambda: collect.restore(w, {"workers": []})):
        with pytest.raises(collect.CheckpointError, match="does not checkpoint multi-agent envs"):
            act()


@pytest.mark.parametrize("env, says", [
    ("pettingzoo:no_such_module_at_all", "cannot import `no_such_module_at_all`: ModuleNotFoundError"),
    ("pettingzoo:mpe2.simple_spread_v3:no_factory", "module `mpe2.simple_spread_v3` has no function `no_factory`"),
    ("pettingzoo:numpy", "module `numpy` has neither `parallel_env` nor `env`"),
    ("pettingzoo:", "a PettingZoo id is `pettingzoo:<module>`"),
    ("pettingzoo:numpy:zeros", "the factory returned a ndarray, not a PettingZoo ParallelEnv or AECEnv"),
])
def test_bad_ids_are_refused_with_a_reason(env, says):
    with pytest.raises(BuildError) as e:
        make_workers(spec(env, 1, config={"shape": 2} if env.endswith("zeros") else None))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_an_aec_factory_is_converted_and_collects_the_same_frames():
    b = make_workers(spec(SPREAD + ":env", 1)).collect(30)
    a = make_workers(spec(SPREAD, 1)).collect(30)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_a_group_of_agents_of_different_spaces_is_refused_naming_the_group_and_the_agent():
    # simple_adversary's adversary_0 observes 8 numbers, its agents 10: called agent_2, it
    # would join group `agent`.
    config = {"module": "mpe2.simple_adversary_v3", "names": {"adversary_0": "agent_2"}}
    with pytest.raises(BuildError) as e:
        make_workers(spec("pettingzoo:marl_envs:renamed", 1, config=config))
    assert str(e.value).startswith("env `pettingzoo:marl_envs:renamed`: agent: agent `agent_0` observes Box(")
    assert "agent `agent_2` of its group Box(" in str(e.value)


@pytest.mark.parametrize("kind", ["linear", "mlp", "constant"])
def test_a_network_policy_is_refused_naming_it(kind):
    with pytest.raises(BuildError, match=f"policy {kind} serves single-agent envs"):
        make_workers(spec(SPREAD, 1, policy={"config": {"kind": kind, "hidden": [4]}}))


def test_an_onnx_model_without_a_groups_input_is_refused_naming_it():
    pytest.importorskip("onnxruntime")
    x = torch.zeros(2, 2, 27, 5, dtype=torch.float64)
    model = onnx_bytes(GroupLogits(135, 6, 0), [x], ["archer.observation"], ["archer.logits"])
    with pytest.raises(PolicyError, match="no input `knight.observation` for group `knight`"):
        make_workers(spec(KAZ, 1, KAZ_CONFIG, policy=onnx_policy(model)))


@pytest.mark.parametrize("field, value", [("state", [{"name": "h", "shape": [4]}]), ("exploration", {"kind": "ou"})])
def test_a_recurrent_or_exploring_onnx_policy_is_refused_naming_the_field(field, value):
    pytest.importorskip("onnxruntime")
    model = onnx_bytes(GroupLogits(18, 5, 0), [torch.zeros(2, 3, 18)], ["agent.observation"], ["agent.logits"])
    with pytest.raises(PolicyError, match=f"spec.policy.config.{field}: a multi-agent"):
        make_workers(spec(SPREAD, 1, policy=onnx_policy(model, **{field: value})))


def test_the_node_serves_a_pettingzoo_env_to_a_trainer_each_observation_once(trainer):
    trainer.start_node()
    ready = trainer.join(spec(SPREAD, 2, frames_per_batch=200, max_frames_per_traj=20))
    assert ready["type"] == "ready" and ready["specs"]["agents"] == SPREAD_GROUPS
    assert ready["layout"] == spread_layout(recorded={"agent.action_log_prob": ["f32", [3]]})
    trainer.send({"type": "continue", "seq": 1, "frames": 200})
    raw = trainer.recv(expand=False)
    assert raw["ends"]["rows"] == [19, 39, 59, 79, 99, 119, 139, 159, 179, 199]
    assert set(raw["ends"]["tensors"]) == {"next.agent.observation"} and "next.agent.observation" not in raw["data"]["tensors"]
    b = tensors(wire.expand_batch(raw))
    assert_env_keys(b, reference(b, SPREAD, None, SPREAD_GROUPS, seeds=[7, 8], max_traj=20), {"agent.action_log_prob"})
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_a_bad_id_is_a_failed_frame_naming_the_module(trainer):
    trainer.start_node()
    failed = trainer.join(spec("pettingzoo:mpe2.no_such_env_v0", 1))
    assert failed["type"] == "failed"
    assert "cannot import `mpe2.no_such_env_v0`" in failed["reason"]
    code, err = trainer.finish()
    assert code == 1 and "mpe2.no_such_env_v0" in err


def test_dict_observations_per_agent_are_leaves_under_the_group_and_pettingzoos_frames():
    import marl_envs

    config = {"module": "mpe2.simple_spread_v3", "N": 3, "max_cycles": 25}
    w = make_workers(spec("pettingzoo:marl_envs:dict_obs", 2, config=config))
    box = lambda d: {"kind": "box", "dtype": "f32", "shape": [d], "low": float("-inf"), "high": float("inf")}  # noqa: E731
    assert w.specs["observation"]["spaces"]["agent"] == {
        "kind": "dict", "spaces": {"pos": box(2), "rest": {"kind": "dict", "spaces": {"other": box(16)}}}}
    lay = w.layout()
    for head in ("", "next."):
        assert lay[f"{head}agent.observation.pos"] == ["f32", [3, 2]]
        assert lay[f"{head}agent.observation.rest.other"] == ["f32", [3, 16]]
    assert "agent.observation" not in lay
    b = w.collect(2 * 30)
    # The flat env stepped by hand with the recorded actions gives every leaf of every frame.
    plain = {k: v for k, v in b.items() if not k.split(".")[-1] in ("pos", "other") or "observation" not in k}
    plain["agent.observation"] = np.concatenate([b["agent.observation.pos"], b["agent.observation.rest.other"]], axis=-1)
    plain["next.agent.observation"] = np.concatenate([b["next.agent.observation.pos"], b["next.agent.observation.rest.other"]], axis=-1)
    want = reference(plain, SPREAD, {"N": 3, "max_cycles": 25}, SPREAD_GROUPS, seeds=[7, 8])
    assert_env_keys(plain, want, {"agent.action_log_prob"})
    assert marl_envs.DictObs.split(np.arange(18))["rest"]["other"].shape == (16,)
    w.close()


def test_image_observations_per_agent_keep_their_dtype_and_shape_and_are_pettingzoos():
    pytest.importorskip("pymunk")
    name = "pettingzoo:pettingzoo.butterfly.pistonball_v6"
    config = {"n_pistons": 4, "max_cycles": 12}
    w = make_workers(spec(name, 2, config=config))
    groups = {"piston": [f"piston_{i}" for i in range(4)]}
    assert w.specs["agents"] == groups
    obs = w.specs["observation"]["spaces"]["piston"]
    assert (obs["kind"], obs["dtype"]) == ("box", "u8") and len(obs["shape"]) == 3
    assert w.layout()["piston.observation"] == ["u8", [4, *obs["shape"]]]
    b = w.collect(2 * 15)
    assert b["piston.observation"].dtype == np.uint8 and b["piston.action"].dtype == np.float32
    want = reference(b, name, config, groups, seeds=[7, 8])
    assert_env_keys(b, want, {"piston.action_log_prob"})
    assert b["next.done"][:, 11, 0].all(), "max_cycles 12: every env's episode ends at its 12th step"
    # ends: each image sent once but at each episode's end and each row's last frame.
    rows, once = wire.batch_ends(b, 2, 15)
    assert rows == [11, 14, 15 + 11, 15 + 14] and set(once) == {"next.piston.observation"}
    w.close()
