"""Off-policy actors as torchrl's DQN and TD3 examples build them: a ``QValueActor``
with an ``EGreedyModule``, a deterministic actor with an ``AdditiveGaussianModule``.
The nodes draw the actions torchrl would (greedy, epsilon-greedy, Gaussian noise on
the action), record a Q-value actor's ``action_value`` and ``chosen_action_value`` as
torchrl's ``QValueModule`` writes them, and the annealed ``eps`` and ``sigma`` reach
them with the weights."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
pytest.importorskip("onnx")

from tensordict.nn import TensorDictModule, TensorDictSequential  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import Bounded, OneHot  # noqa: E402
from torchrl.modules import MLP, AdditiveGaussianModule, EGreedyModule, QValueActor, TanhModule  # noqa: E402

import rollout  # noqa: E402

warnings.filterwarnings("ignore")

FRAMES = 2000


def dqn_actor(eps_init=1.0):
    torch.manual_seed(0)
    q = QValueActor(MLP(in_features=4, out_features=2, num_cells=[16]), in_keys=["observation"], spec=OneHot(2))
    greedy = EGreedyModule(spec=OneHot(2), eps_init=eps_init, eps_end=0.0, annealing_num_steps=1000)
    return q, greedy, TensorDictSequential(q, greedy)


def greedy_actions(q, td):
    with torch.no_grad():
        return q(td.select("observation").clone())["action"].argmax(-1)


def agreement(q, td):
    return (td["action"].argmax(-1) == greedy_actions(q, td)).float().mean().item()


def assert_q_values_are_the_actors(q, td):
    """``action_value`` is the Q-network's output for each frame's observation, and
    ``chosen_action_value`` the greedy action's (as torchrl's QValueModule writes it,
    whatever action exploration then took)."""
    with torch.no_grad():
        want = q(td.select("observation").clone())
    assert td["action_value"].shape == want["action_value"].shape, (td["action_value"].shape, want["action_value"].shape)
    assert td["chosen_action_value"].shape == want["chosen_action_value"].shape
    torch.testing.assert_close(td["action_value"], want["action_value"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(td["chosen_action_value"], want["chosen_action_value"], atol=1e-5, rtol=1e-5)


def within(x, want, tol):
    assert abs(x - want) <= tol, f"{x} is not {want} +- {tol}"


def test_a_dqn_actor_is_epsilon_greedy_and_its_annealed_eps_reaches_the_nodes_with_the_weights():
    q, greedy, actor = dqn_actor(eps_init=1.0)
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=FRAMES, total_frames=-1, seed=2) as c:
        td = c.next()
        keys = set(td.keys(include_nested=True, leaves_only=True))
        assert td["action"].dtype == torch.int64 and td["action"].shape == (FRAMES, 2), "one-hot, as QValueActor's spec"
        assert not keys & {"logits", "action_log_prob"}, keys
        assert_q_values_are_the_actors(q, td)
        # eps = 1: uniform over the 2 actions, so the greedy one half of the time
        # (binomial, 2000 draws: sd 0.011).
        within(agreement(q, td), 0.5, 0.05)
        # torchrl's loop: greedy.step(frames) anneals eps, update_policy_weights_() pushes it.
        greedy.step(600)  # eps 1 -> 0.4: the greedy action with 1 - 0.4 + 0.4 / 2 = 0.8
        within(greedy.eps.item(), 0.4, 1e-4)
        version = c.update_policy_weights_()
        td = next(td for td in iter(c.next, None) if (td["collector", "weights_version"] == version).all())
        within(agreement(q, td), 0.8, 0.05)
        assert_q_values_are_the_actors(q, td)
        greedy.step(10_000)  # eps_end: 0
        version = c.update_policy_weights_()
        td = next(td for td in iter(c.next, None) if (td["collector", "weights_version"] == version).all())
        assert agreement(q, td) == 1.0


def test_deterministic_exploration_or_a_bare_q_value_actor_takes_the_greedy_action():
    q, _, actor = dqn_actor(eps_init=1.0)
    with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=500, total_frames=500, seed=2, exploration_type="deterministic") as c:
        assert agreement(q, c.next()) == 1.0
    with rollout.DistributedCollector("CartPole-v1", q, frames_per_batch=500, total_frames=500, seed=2) as c:
        td = c.next()
        assert agreement(q, td) == 1.0
        assert_q_values_are_the_actors(q, td)


def td3_actor(sigma):
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    nn.init.zeros_(net.weight)
    nn.init.zeros_(net.bias)  # the action is 0: the noise is never clipped at the bounds
    spec = Bounded(-2.0, 2.0, (1,))
    actor = TensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
    )
    noise = AdditiveGaussianModule(spec=spec, sigma_init=sigma, sigma_end=sigma / 10, annealing_num_steps=1000)
    return actor, noise, TensorDictSequential(actor, noise)


def test_a_td3_actor_adds_gaussian_noise_of_the_annealed_sigma():
    actor, noise, policy = td3_actor(sigma=0.5)
    with rollout.DistributedCollector("Pendulum-v1", policy, frames_per_batch=FRAMES, total_frames=-1, seed=4) as c:
        td = c.next()
        assert set(td.keys()) >= {"action", "observation"} and not set(td.keys()) & {"loc", "scale", "action_log_prob"}
        # N(0, 0.5): sample sd within 0.02 of 0.5 (its sd ~0.008 at 2000 draws), mean within 0.04.
        a = td["action"].squeeze(-1)
        within(a.std().item(), 0.5, 0.03)
        within(a.mean().item(), 0.0, 0.04)
        noise.step(1000)  # sigma_end: 0.05
        version = c.update_policy_weights_()
        td = next(td for td in iter(c.next, None) if (td["collector", "weights_version"] == version).all())
        within(td["action"].std().item(), 0.05, 0.004)
    with rollout.DistributedCollector("Pendulum-v1", policy, frames_per_batch=200, total_frames=200, seed=4, exploration_type="deterministic") as c:
        assert (c.next()["action"] == 0).all(), "deterministic: the actor's own action"


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: TensorDictSequential(td3_actor(0.1)[0], EGreedyModule(spec=Bounded(-2.0, 2.0, (1,)))), "QValueModule"),
        (lambda: TensorDictSequential(dqn_actor()[2], TensorDictModule(nn.Identity(), in_keys=["action"], out_keys=["action"])), "last module"),
    ],
    ids=["egreedy-without-q-values", "exploration-not-last"],
)
def test_exploration_the_nodes_do_not_run_is_refused_in_one_sentence_when_built(make, says):
    env = "Pendulum-v1" if "QValue" in says else "CartPole-v1"
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector(env, make(), frames_per_batch=10, total_frames=10)
    msg = str(e.value)
    assert e.value.field == "policy" and says in msg and "\n" not in msg, msg


def test_python_nodes_draw_the_same_exploration():
    # Python nodes run the exported model with onnxruntime: the same mixture and noise,
    # and the scalar `eps`/`sigma` buffers are weights of shape [] there too.
    import subprocess
    import sys

    python_node = [sys.executable, "-m", "rollout_node"]
    if subprocess.run(python_node + ["--help"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip(f"no rollout_node in {sys.executable} (pip install ./python/node)")
    kw = {"frames_per_batch": FRAMES, "total_frames": FRAMES, "seed": 2, "launcher": "process", "node_command": python_node}
    q, greedy, actor = dqn_actor(eps_init=0.4)
    with rollout.DistributedCollector("CartPole-v1", actor, **kw) as c:
        td = c.next()
        within(agreement(q, td), 0.8, 0.05)
        assert_q_values_are_the_actors(q, td)
    _, _, policy = td3_actor(sigma=0.5)
    with rollout.DistributedCollector("Pendulum-v1", policy, **kw) as c:
        within(c.next()["action"].std().item(), 0.5, 0.03)


def test_a_model_the_nodes_cannot_run_is_refused_when_the_collector_is_built():
    # torch.randn_like exports as RandomNormalLike, which tract types but cannot
    # evaluate: the trainer's trial pass refuses it, naming the op, before any node starts
    # (it used to fail every node five times over).
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(3, 1)

        def forward(self, x):
            a = self.net(x)
            return a + 0.1 * torch.randn_like(a)

    actor = TensorDictModule(Noisy(), in_keys=["observation"], out_keys=["action"])
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("Pendulum-v1", actor, frames_per_batch=10, total_frames=10)
    msg = str(e.value)
    assert e.value.field == "policy" and "RandomNormalLike" in msg and "\n" not in msg, msg
