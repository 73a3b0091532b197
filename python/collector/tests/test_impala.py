"""IMPALA (examples/impala_torchrl.py) through rollout's async collector: V-trace's
inputs are what the batches carry, and the learner learns.

- Smoke (every run, a few seconds per env): over 24 async batches of the example's own
  loop, every key torchrl's ``VTrace`` and ``A2CLoss`` read is in each batch with
  torchrl's shapes and dtypes; each frame's recorded ``action_log_prob`` (the
  behaviour log-prob ``log mu``) is the log-prob of its action under the actor *of that
  frame's version* (``policy_version``), recomputed from the ``state_dict`` the learner
  kept for that version, within ``1e-5`` (on Pendulum plus what rounding the recorded
  action to float32 can change a ``TanhNormal`` log-prob by near the bounds); the
  versions advance as the learner pushes, differ across batches, and lag behind the
  learner's (so V-trace has something to correct, and the learner's current actor
  would not give the recorded log-probs).
- V-trace: on a batch of the weights the learner still has, ``rho`` is 1 and
  :func:`impala_torchrl.vtrace` gives torchrl's TD(1) targets and advantages, as
  V-trace must on-policy (each env's row of the ``[envs, T]`` batch is its time axis).
  torchrl's ``VTrace`` module scores ``log pi`` on its actor's mode rather than on the
  recorded action, which the example therefore does not use: a test pins that.
- ``make_collector`` passes ``max_policy_lag`` and ``prefetch`` only when they are given.
- Learning (opt-in, ``ROLLOUT_LONG_TESTS=1``): the mean return of the last 20 episodes
  passes 475 on CartPole (seconds) and -200 on Pendulum (minutes); the figures measured
  are at the two tests.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest

_MISSING = [m for m in ("torch", "tensordict", "torchrl", "onnx") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"needs {', '.join(_MISSING)}: the torch extra (pip install ./python/collector[torch])"
)

ENVS = ("CartPole-v1", "Pendulum-v1")
BATCHES = 24
LOGP_TOLERANCE = 1e-5
SEED = 0


@pytest.fixture
def one_thread():
    """The learner's small tensors: one thread is fastest on a shared machine."""
    import torch

    warnings.filterwarnings("ignore", category=UserWarning)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def expected_layout(task, batch_size) -> dict:
    """key -> (shape, dtype) of what ``VTrace``, ``A2CLoss`` and the learner read, as a
    torchrl collector lays a batch out."""
    import torch

    b = tuple(batch_size)
    action = ((*b, task.action_dim), torch.int64) if not task.continuous else ((*b, task.action_dim), torch.float32)
    return {
        "observation": ((*b, task.obs_dim), torch.float32),
        "action": action,
        "action_log_prob": (b, torch.float32),
        ("next", "observation"): ((*b, task.obs_dim), torch.float32),
        ("next", "reward"): ((*b, 1), torch.float32),
        ("next", "done"): ((*b, 1), torch.bool),
        ("next", "terminated"): ((*b, 1), torch.bool),
        "policy_version": (b, torch.int64),
        ("collector", "weights_version"): (b, torch.int64),
        ("collector", "node"): (b, torch.int64),
        ("collector", "traj_ids"): (b, torch.int64),
    }


def rounding_allowance(actor, frames):
    """Per frame: how much the log-prob of a continuous action can move when the
    action is rounded to float32 (|d log p / d a| times float32's spacing at the action).
    The node computed its log-prob from the unrounded sample; near a ``TanhNormal`` 's
    bounds that difference passes 1e-5 (measured up to 5e-5 at |a| > 1.999)."""
    import torch

    a = frames["action"].detach().clone().requires_grad_(True)
    lp = actor.get_dist(frames).log_prob(a)
    (grad,) = torch.autograd.grad(lp.sum(), a)
    return (grad.abs() * torch.finfo(torch.float32).eps * a.detach().abs()).sum(-1)


@pytest.mark.parametrize("env", ENVS)
def test_impala_batches_record_the_log_probs_of_their_frames_versions(env, one_thread):
    import torch
    from torchrl.objectives.value import VTrace

    import impala_torchrl

    torch.manual_seed(SEED)
    task = impala_torchrl.TASKS[env]
    actor, critic = impala_torchrl.make_actor_critic(task)
    read = set(impala_torchrl.make_loss(task, actor, critic).in_keys)
    read |= set(VTrace(gamma=task.gamma, actor_network=actor, value_network=critic).in_keys)
    seen = []  # per batch: node, versions, learner's version, worst log-prob gap, gap to the learner's actor

    def check(td, versions, learner_version):
        layout = expected_layout(task, td.batch_size)
        assert read <= set(layout), f"keys VTrace/A2CLoss read that the test does not check: {read - set(layout)}"
        assert td.batch_size == (4, task.frames_per_batch // 4), td.batch_size  # one node's [envs, T]
        for key, (shape, dtype) in layout.items():
            assert td[key].shape == shape and td[key].dtype == dtype, (key, td[key].shape, td[key].dtype)
        assert (td["policy_version"] == td["collector", "weights_version"]).all()
        assert td["collector", "node"].unique().numel() == 1, "an async batch is one node's"
        recomputed = versions.log_prob(td)
        gap = (recomputed - td["action_log_prob"]).abs()
        allowance = torch.zeros_like(gap)
        if task.continuous:
            for version in td["policy_version"].unique().tolist():
                mask = td["policy_version"] == version
                allowance[mask] = rounding_allowance(versions.actor(version), td[mask])
        excess = (gap - LOGP_TOLERANCE - allowance).max().item()
        assert excess <= 0, f"a recorded log-prob is {gap.max():.3g} from its version's actor ({excess:.3g} past the tolerance)"
        with torch.no_grad():
            current = actor.get_dist(td).log_prob(td["action"])
        seen.append((
            int(td["collector", "node"][(0,) * td.ndim]), td["policy_version"].unique().tolist(), learner_version,
            gap.max().item(), (current - td["action_log_prob"]).abs().max().item(),
        ))

    collector = impala_torchrl.make_collector(task, actor, BATCHES * task.frames_per_batch, nodes=2, envs_per_node=4, seed=SEED)
    try:
        history = impala_torchrl.train(task, collector, actor, critic, BATCHES * task.frames_per_batch, on_batch=check)
    finally:
        collector.shutdown()
    assert len(seen) == BATCHES == len(history.frames)
    # Versions advance: every node's versions never go back and end newer than they began.
    for node in (0, 1):
        mine = [min(v) for n, v, *_ in seen if n == node]
        assert mine == sorted(mine) and mine[-1] > mine[0], (node, mine)
    # They differ across batches, and lag the learner's: the nodes collect while it learns.
    distinct = {tuple(v) for _, v, *_ in seen}
    assert len(distinct) >= BATCHES // 2, distinct
    lagging = [(v, lv, cur) for _, v, lv, _, cur in seen if min(v) < lv]
    assert len(lagging) >= BATCHES // 2, seen
    # On those, the learner's current actor does not give the recorded log-probs: only
    # the frame's own version does (the check above would fail with the wrong one).
    assert max(cur for *_, cur in lagging) > 100 * LOGP_TOLERANCE, lagging
    assert history.max_lag[-1] >= 1 and all(lag >= 0 for lag in history.max_lag)


@pytest.mark.parametrize("env", ENVS)
def test_vtrace_on_the_learners_own_weights_is_td1(env, one_thread):
    import dataclasses

    import torch
    from torchrl.objectives.value import TD1Estimator

    import impala_torchrl

    torch.manual_seed(SEED)
    task = dataclasses.replace(impala_torchrl.TASKS[env], reward_scale=1.0, normalize_advantage=False)
    actor, critic = impala_torchrl.make_actor_critic(task)
    collector = impala_torchrl.make_collector(task, actor, 2 * task.frames_per_batch, nodes=2, envs_per_node=4, seed=SEED)
    try:
        data = next(iter(collector))  # version 0: the actor the learner holds (no step taken)
        assert (data["policy_version"] == 0).all()
        data = data.clone()
    finally:
        collector.shutdown()
    stats = impala_torchrl.vtrace(task, data, actor, critic)
    assert abs(stats["rho"] - 1.0) < 1e-4 and stats["clipped"] <= 0.5, stats
    reference = TD1Estimator(gamma=task.gamma, value_network=critic)(data.clone().exclude("advantage", "value_target"))
    for key in ("value_target", "advantage"):
        assert torch.allclose(data[key], reference[key], atol=1e-3, rtol=1e-4), (key, (data[key] - reference[key]).abs().max())
    # CartPole's initial policy ends episodes inside the batch's 64-frame rows, so there
    # the comparison covers V-trace's cut at `done` as well as its bootstrap at the row's
    # end (Pendulum's 32-frame rows end no 200-step episode: the bootstrap only).
    if env == "CartPole-v1":
        assert data["next", "done"].any()



@pytest.mark.parametrize("env", ENVS)
def test_torchrls_vtrace_module_scores_its_actors_mode_not_the_recorded_action(env, one_thread):
    """Why :func:`impala_torchrl.vtrace` computes ``log pi`` itself: torchrl's ``VTrace``
    module (0.14) gives, on a batch of other weights than its actor's, the V-trace of the
    actor's *mode* (``log pi(mode | x) - log mu(a | x)``), not of the recorded action.
    On-policy the two agree once ``rho`` is clipped at 1 (the mode is at least as likely
    as any action), so this shows off-policy, where they differ. If this fails, torchrl
    scores the recorded action and the example could use the module."""
    import copy
    import dataclasses

    import torch
    from tensordict.nn import InteractionType, set_interaction_type
    from torchrl.objectives.value import VTrace

    import impala_torchrl

    torch.manual_seed(SEED)
    task = dataclasses.replace(impala_torchrl.TASKS[env], reward_scale=1.0, normalize_advantage=False)
    actor, critic = impala_torchrl.make_actor_critic(task)
    collector = impala_torchrl.make_collector(task, actor, task.frames_per_batch, nodes=1, envs_per_node=4, seed=SEED)
    try:
        data = next(iter(collector)).clone()
    finally:
        collector.shutdown()
    learner = copy.deepcopy(actor)  # the learner a few steps on: other weights than the batch's
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = data.clone()
    impala_torchrl.vtrace(task, ours, learner, critic)
    module = VTrace(gamma=task.gamma, actor_network=learner, value_network=critic)
    with torch.no_grad():
        theirs = module(data.clone())
    assert not torch.allclose(theirs["advantage"], ours["advantage"], atol=1e-3), "torchrl's VTrace now scores the recorded action"
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        mode = learner(data.select("observation").clone())["action"]
    as_mode = data.clone().set("action", mode)
    impala_torchrl.vtrace(task, as_mode, learner, critic)
    assert torch.allclose(theirs["advantage"], as_mode["advantage"], atol=1e-4), (theirs["advantage"] - as_mode["advantage"]).abs().max()
    assert torch.allclose(theirs["value_target"], as_mode["value_target"], atol=1e-4)


def test_make_collector_passes_max_policy_lag_and_prefetch_only_when_given(monkeypatch):
    import rollout

    import impala_torchrl

    made = []

    def record(*args, **kwargs):
        made.append(kwargs)

    monkeypatch.setattr(rollout, "DistributedCollector", record)
    task = impala_torchrl.TASKS["CartPole-v1"]
    impala_torchrl.make_collector(task, None, 1_000)
    impala_torchrl.make_collector(task, None, 1_000, max_policy_lag=3, prefetch=2)
    assert "max_policy_lag" not in made[0] and "prefetch" not in made[0]
    assert made[1]["max_policy_lag"] == 3 and made[1]["prefetch"] == 2
    assert all(m["sync"] is False and m["track_policy_version"] is True for m in made)


# Measured (2026-12-07, this 2-core machine shared with a Rust build, load average 3 to
# 8), 2 local nodes x 4 envs (one worker each), the example's CartPole task (256-frame
# batches of [4, 64], one Adam step and one weight push per batch, policy lag 2 versions
# on most batches), until the mean return of the last 20 episodes passes 475: seeds 0-4
# at 104,448 to 253,696 frames (4.1 to 9.8 s); seeds 0 and 1 again at 248,832 and 90,880
# (14.9 and 4.9 s): an async run's batch order depends on timing, so a seed does not fix
# the run.
CARTPOLE_BUDGET = 600_000


@pytest.mark.skipif(not os.environ.get("ROLLOUT_LONG_TESTS"), reason="up to a minute of IMPALA: opt-in with ROLLOUT_LONG_TESTS=1")
def test_impala_learns_cartpole_through_rollouts_async_collector(one_thread):
    history = _learn("CartPole-v1", CARTPOLE_BUDGET)
    assert history.solved_at is not None, f"best mean return of the last 20 episodes {history.best:.1f} in {history.frames[-1]} frames"


# Measured as CartPole's, the example's Pendulum task (128-frame batches of [4, 32],
# TanhNormal with tanh_loc, entropy bonus 0.01, advantages standardised per batch, rewards
# scaled by 0.1 for V-trace), until the mean return of the last 20 episodes passes -200:
# 5 of 7 runs: seed 0 at 444,032 and 772,864 frames (107 and 98 s), seed 1 at 800,768
# (119 s), seed 2 at 505,600 (62 s); seed 1 once and seed 3 did not within 2,000,000
# frames (best -276 and -240, 268 and 241 s). So this test can fail on an unlucky run.
PENDULUM_BUDGET = 2_000_000


@pytest.mark.skipif(not os.environ.get("ROLLOUT_LONG_TESTS"), reason="2 to 5 minutes of IMPALA: opt-in with ROLLOUT_LONG_TESTS=1")
def test_impala_learns_pendulum_through_rollouts_async_collector(one_thread):
    history = _learn("Pendulum-v1", PENDULUM_BUDGET)
    assert history.solved_at is not None, f"best mean return of the last 20 episodes {history.best:.1f} in {history.frames[-1]} frames"


def _learn(env: str, budget: int):
    """The example's run on ``env`` (seed 0, 2 local nodes x 4 envs) until the threshold
    or ``budget`` frames; its batches lagged the learner."""
    import torch

    import impala_torchrl

    torch.manual_seed(SEED)
    task = impala_torchrl.TASKS[env]
    actor, critic = impala_torchrl.make_actor_critic(task)
    collector = impala_torchrl.make_collector(task, actor, budget, nodes=2, envs_per_node=4, seed=SEED)
    try:
        history = impala_torchrl.train(task, collector, actor, critic, budget, stop_at_threshold=True)
    finally:
        collector.shutdown()
    assert max(history.max_lag) >= 1, "the batches lagged the learner"
    return history
