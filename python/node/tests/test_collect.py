"""The node's collection loop (``Workers.collect``) in process, against a plain reference: each
worker's own env stepped one call at a time with the Rust node's rules (PROTOCOL.md §§3, 5),
so every field the fast loop writes by column is checked frame by frame."""

import gymnasium as gym
import numpy as np
import pytest

import flaky_env
from conftest import node_spec
from rollout_node.collect import Workers, restart_seed

SEED, FIRST_LANE, LANES = 7, 1, 5


def spec(env, envs, config=None, **rollout):
    """A node of lanes ``FIRST_LANE..`` of ``LANES``, seeded with ``SEED``."""
    return node_spec(env, envs, config, first_lane=FIRST_LANE, lanes=LANES, **{"seed": SEED, **rollout})


def weights(policy):
    rng = np.random.default_rng(3)
    return {k: rng.uniform(-0.5, 0.5, s).astype(np.float32) for k, s in policy.layout.items()}


def reference_row(env, k, policy, steps, max_traj=None, seed=None, next_id=None):
    """Worker ``k``'s frames, stepped by hand: reset with its seed (then none) when it must,
    one action, one step, the cut at ``max_traj``; as dicts of lists, one entry per frame."""
    e = gym.make(env)
    pending = SEED + k if seed is None else seed
    ids = FIRST_LANE + k if next_id is None else next_id
    needs_reset, obs, traj, sc = True, None, None, 0
    out = {key: [] for key in ("observation", "action", "next.observation", "next.reward", "next.done",
                               "next.terminated", "next.truncated", "collector.traj_ids", "step_count")}
    for _ in range(steps):
        if needs_reset:
            o, _ = e.reset(seed=pending)
            pending = None
            obs = np.asarray(o, np.float32).reshape(-1)
            traj, ids, sc = ids, ids + LANES, 0
        a = policy.act(obs[None])[0]
        o, r, te, tr, _ = e.step(a if policy.action.discrete else a.reshape(e.action_space.shape))
        nxt = np.asarray(o, np.float32).reshape(-1)
        trunc = bool(tr) or (max_traj is not None and sc + 1 >= max_traj and not te)
        for key, v in (("observation", obs), ("action", a), ("next.observation", nxt),
                       ("next.reward", [np.float32(r)]), ("next.done", [bool(te) or trunc]),
                       ("next.terminated", [bool(te)]), ("next.truncated", [trunc]),
                       ("collector.traj_ids", traj), ("step_count", [sc])):
            out[key].append(v)
        sc += 1
        needs_reset = bool(te) or trunc
        obs = nxt
    return out


def assert_row(batch, k, ref, columns):
    for key, frames in ref.items():
        got = batch[key][k, columns]
        want = np.asarray(frames, batch[key].dtype).reshape(got.shape)
        assert got.tobytes() == want.tobytes(), f"row {k}, `{key}` differs"


@pytest.mark.parametrize("env,envs,max_traj", [
    ("CartPole-v1", 1, None), ("CartPole-v1", 3, 9), ("Pendulum-v1", 3, 7), ("MountainCarContinuous-v0", 2, 5),
])
def test_every_field_of_every_frame_is_what_the_rows_own_env_gives(env, envs, max_traj):
    w = Workers(spec(env, envs, max_frames_per_traj=max_traj))
    w.policy.set_weights(0, weights(w.policy))
    T, batches = 40, 3
    got = [w.collect(T * envs) for _ in range(batches)]
    whole = {key: np.concatenate([b[key] for b in got], axis=1) for key in got[0]}
    for k in range(envs):
        assert_row(whole, k, reference_row(env, k, w.policy, T * batches, max_traj), slice(None))
    w.close()


def test_a_row_whose_env_raises_mid_batch_is_collected_again_and_the_others_keep_theirs():
    # Env 1 of 3 (the first FlakyCartPole made after COUNT is set to -1) raises at its 17th step.
    flaky_env.COUNT[0] = -1
    w = Workers(spec("FlakyCartPole-v0", 3, config={"fail_at": 17}))
    w.policy.set_weights(0, weights(w.policy))
    b = w.collect(3 * 30)
    assert w.restart_count == [0, 1, 0]
    pol = w.policy
    for k in (0, 2):
        assert_row(b, k, reference_row("CartPole-v1", k, pol, 30), slice(None))
    # Row 1 is the rebuilt env's from its first frame: reset with the restart seed, trajectory
    # ids of its lane after the ones the failed attempt handed out.
    rebuilt = reference_row("CartPole-v1", 1, pol, 30, seed=restart_seed(SEED + 1, 1), next_id=int(b["collector.traj_ids"][1, 0]))
    assert_row(b, 1, rebuilt, slice(None))
    assert b["collector.traj_ids"][1, 0] > FIRST_LANE + 1 and b["collector.traj_ids"][1, 0] % LANES == (FIRST_LANE + 1) % LANES
    w.close()


def test_init_random_frames_end_at_that_frame_of_each_worker_even_mid_batch():
    # 25 random frames per worker, in batches of 40 per worker: frames 25.. of the first batch
    # are the (deterministic) policy's, as the Rust node counts them frame by frame.
    w = Workers(spec("CartPole-v1", 2, init_random_frames=25))
    w.policy.set_weights(0, weights(w.policy))
    b = w.collect(2 * 40)
    for k in range(2):
        policy_acts = w.policy.act(b["observation"][k])
        assert np.array_equal(b["action"][k, 25:], policy_acts[25:]), f"row {k} after its 25th frame"
        assert not np.array_equal(b["action"][k, :25], policy_acts[:25]), f"row {k}: its first 25 are the policy's"
    w.close()


def grouped(envs, per, **rollout):
    s = spec("CartPole-v1", envs, **rollout)
    s["envs_per_worker"] = per
    s["policy"]["config"] = {"kind": "mlp", "hidden": [16, 16]}
    return s


def test_envs_grouped_into_workers_collect_the_frames_of_one_env_per_worker():
    batches = []
    for per in (1, 2, 4):
        w = Workers(grouped(4, per))
        w.policy.set_weights(0, weights(w.policy))
        batches.append([w.collect(4 * 30) for _ in range(2)])
        w.close()
    for per, got in zip((2, 4), batches[1:]):
        for a, b in zip(batches[0], got):
            for key in a:
                assert np.array_equal(a[key], b[key]), f"envs_per_worker {per}: `{key}` differs"


def test_init_random_frames_count_a_workers_envs_together():
    # 2 envs per worker, 20 random frames per worker: 10 steps of each env, then the policy's.
    w = Workers(grouped(2, 2, init_random_frames=20))
    w.policy.set_weights(0, weights(w.policy))
    b = w.collect(2 * 30)
    for k in range(2):
        policy_acts = w.policy.act(b["observation"][k])
        assert np.array_equal(b["action"][k, 10:], policy_acts[10:]), f"row {k} after the worker's 20th frame"
    w.close()


def test_a_snapshot_has_one_entry_per_worker_of_its_envs_and_restores():
    from rollout_node.collect import restore, snapshot

    w = Workers(grouped(4, 2))
    w.policy.set_weights(0, weights(w.policy))
    w.collect(4 * 10)
    state = snapshot(w)
    assert [len(x["rollout"]["envs"]) for x in state] == [2, 2]
    assert [x["rollout"]["frames"] for x in state] == [20, 20]
    after = w.collect(4 * 10)
    v = Workers(grouped(4, 2))
    v.policy.set_weights(0, weights(v.policy))
    restore(v, {"workers": state, "base_seed": SEED})
    again = v.collect(4 * 10)
    for key in after:
        assert np.array_equal(after[key], again[key]), key
    w.close()
    v.close()


@pytest.mark.parametrize("per", [0, 3, "2", None])
def test_envs_that_do_not_split_into_workers_are_refused_by_name(per):
    from rollout_node.collect import BuildError

    s = grouped(4, 2)
    s["envs_per_worker"] = per
    with pytest.raises(BuildError, match="envs_per_worker"):
        Workers(s)
