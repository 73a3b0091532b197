"""Actors written in PyTorch and exported as ONNX the way a user exports theirs (issue 29's
export: ``dynamo=False, do_constant_folding=False`` keeps the state_dict's names), and what
torch.distributions says of their actions: the reference the node's recordings are held to."""

import io

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal, TanhTransform, AffineTransform, TransformedDistribution


class CategoricalMlp(nn.Module):
    """A ReLU MLP giving the logits of a discrete action (CartPole: 4 -> 2)."""

    def __init__(self, obs=4, n=2, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n))

    def forward(self, observation):
        return self.net(observation)


class GaussianActor(nn.Module):
    """A tanh MLP for the mean and a state-independent log-std (Pendulum: 3 -> 1)."""

    def __init__(self, obs=3, d=1, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, d))
        # Not named `log_std`: the exporter renames an initializer whose name an output takes
        # (it would be `log_std.1` in the model, no longer the state_dict's name).
        self.actor_log_std = nn.Parameter(torch.full((d,), -0.5))

    def forward(self, observation):
        return self.net(observation), self.actor_log_std


class TanhNormalActor(nn.Module):
    """A ReLU MLP for the pre-tanh mean and a softplus scale (Pendulum: 3 -> 1)."""

    def __init__(self, obs=3, d=1, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU(), nn.Linear(hidden, 2 * d))
        self.d = d

    def forward(self, observation):
        out = self.net(observation)
        return out[:, : self.d], nn.functional.softplus(out[:, self.d :]) + 1e-3


class ImageCnn(nn.Module):
    """A small CNN on uint8 HWC images (cast to float inside), logits of ``n`` actions."""

    def __init__(self, hwc=(12, 12, 3), n=3):
        super().__init__()
        h, w, c = hwc
        self.conv = nn.Sequential(nn.Conv2d(c, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2), nn.ReLU())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).numel()
        self.head = nn.Linear(flat, n)

    def forward(self, observation):
        x = observation.permute(0, 3, 1, 2).float() / 255.0  # the model takes uint8
        return self.head(self.conv(x).flatten(1))


class DeterministicActor(nn.Module):
    """A tanh MLP whose output is the action itself (Pendulum: 3 -> 1, in [-2, 2])."""

    def __init__(self, obs=3, d=1, hidden=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, d), nn.Tanh())

    def forward(self, observation):
        return 2.0 * self.net(observation)


def export(module, example, outputs):
    """The ``.onnx`` file's bytes of ``module`` (input ``observation``, batch axis dynamic)."""
    f = io.BytesIO()
    axes = {name: {0: "batch"} for name in ["observation", *outputs]}
    if isinstance(module, GaussianActor):
        del axes["log_std"]  # a parameter: [d] whatever the batch
    torch.onnx.export(
        module, (example,), f, input_names=["observation"], output_names=list(outputs),
        dynamic_axes=axes, dynamo=False, do_constant_folding=False,
    )
    return f.getvalue()


def state_weights(module, version):
    """``module``'s state_dict as PROTOCOL.md's Weights (what a learner pushes)."""
    from rollout_node import wire

    return wire.weights_to_wire(version, {k: v.detach().numpy().astype(np.float32).copy() for k, v in module.state_dict().items()})


def perturb(module, seed):
    """Changes every parameter of ``module`` (a learner's step)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))


def reference(module, head, obs, action, low=None, high=None, at_mode=False):
    """What ``module`` says of ``action`` on ``obs``: ``(mode, log_prob, params)`` as float64
    numpy: the module's own (float32) outputs, torch.distributions on them in float64.

    ``at_mode``: a tanh-normal's log-prob is taken at the mode computed in float64, not at the
    recorded (float32) action: inverting tanh near the bounds turns the action's rounding into
    large errors (the caller checks that the recorded action is that mode within 1e-5)."""
    with torch.no_grad():
        x = torch.from_numpy(np.asarray(obs))
        out = module(x if x.dtype == torch.uint8 else x.float())
        a = torch.from_numpy(np.asarray(action))
        if head == "categorical":
            z = out.double()
            return z.argmax(-1).numpy(), Categorical(logits=z).log_prob(a).numpy(), {"logits": z.numpy()}
        loc, spread = (t.double() for t in out)
        scale = torch.exp(spread) if isinstance(module, GaussianActor) else spread
        scale = scale.expand_as(loc)
        lo, hi = torch.from_numpy(low).double(), torch.from_numpy(high).double()
        params = {"loc": loc.numpy(), "scale": scale.numpy()}
        if head == "normal":
            mode = torch.clamp(loc, lo, hi)
            return mode.numpy(), Normal(loc, scale).log_prob(a.double()).sum(-1).numpy(), params
        c, h = (hi + lo) / 2, (hi - lo) / 2
        dist = TransformedDistribution(Normal(loc, scale), [TanhTransform(), AffineTransform(c, h)])
        mode = c + h * torch.tanh(loc)
        return mode.numpy(), dist.log_prob(mode if at_mode else a.double()).sum(-1).numpy(), params


#: The state tensors of torchrl's recurrent modules, by cell: their batch keys (``LSTMModule``
#: and ``GRUModule``'s default ``in_keys``), each ``[num_layers, hidden]`` per env.
STATE_NAMES = {"lstm": ("recurrent_state_h", "recurrent_state_c"), "gru": ("recurrent_state",)}


class RecurrentActor(nn.Module):
    """A torchrl ``LSTMModule`` or ``GRUModule`` (``cell``) under a linear head giving the
    logits of ``n`` actions, one step at a time as a recurrent ONNX model runs it (PROTOCOL.md
    §8, Recurrent): ``forward(observation [K, obs], is_init bool [K, 1], *state)``, each state
    ``[K, layers, hidden]``, zeroed where ``is_init``; returns the logits, then each state's
    next value. Its state_dict's names (``rnn.lstm.weight_ih_l0``, ..., ``head.weight``) are
    the model's weights."""

    def __init__(self, cell="lstm", obs=4, n=2, hidden=8, layers=1):
        super().__init__()
        from torchrl.modules import GRUModule, LSTMModule

        make = {"lstm": LSTMModule, "gru": GRUModule}[cell]
        self.cell, self.obs = cell, obs
        self.rnn = make(input_size=obs, hidden_size=hidden, num_layers=layers, in_key="observation", out_key="embed")
        self.head = nn.Linear(hidden, n)
        #: ``[(name, shape)]`` of the state, as ``policy.config.state`` lists it.
        self.state = [(name, (layers, hidden)) for name in STATE_NAMES[cell]]

    def state_spec(self):
        """``policy.config.state`` of this actor."""
        return [{"name": name, "shape": list(shape)} for name, shape in self.state]

    def forward(self, observation, is_init, *state):
        keep = (~is_init).to(observation.dtype).unsqueeze(-1)  # [K, 1, 1]
        layers_first = [(s * keep).transpose(0, 1).contiguous() for s in state]  # [layers, K, hidden]
        x = observation.unsqueeze(1)  # a sequence of one step
        if self.cell == "lstm":
            y, (h, c) = self.rnn.lstm(x, (layers_first[0], layers_first[1]))
            nxt = (h, c)
        else:
            y, h = self.rnn.gru(x, layers_first[0])
            nxt = (h,)
        return (self.head(y.squeeze(1)), *(s.transpose(0, 1) for s in nxt))


def export_step(module, inputs, outputs):
    """The ``.onnx`` file's bytes of ``module`` taking ``inputs`` (``{name: example tensor}``,
    in its arguments' order) and giving ``outputs`` (names), the first axis of every one of
    them dynamic (``K``); opset 18, the state_dict's names kept."""
    f = io.BytesIO()
    names = list(inputs)
    torch.onnx.export(
        module, tuple(inputs.values()), f, input_names=names, output_names=list(outputs),
        dynamic_axes={name: {0: "K"} for name in [*names, *outputs]},
        dynamo=False, do_constant_folding=False, opset_version=18,
    )
    return f.getvalue()


def recurrent_inputs(actor, rows=3):
    """Example inputs of a :class:`RecurrentActor`, ``{name: tensor}`` in its order."""
    inputs = {"observation": torch.randn(rows, actor.obs), "is_init": torch.zeros(rows, 1, dtype=torch.bool)}
    inputs.update({name: torch.randn(rows, *shape) for name, shape in actor.state})
    return inputs


def export_recurrent(actor):
    """The ``.onnx`` file's bytes of a :class:`RecurrentActor`: inputs ``observation``,
    ``is_init`` and its state; outputs ``logits`` and ``next.<name>`` of each state."""
    return export_step(actor, recurrent_inputs(actor), ["logits", *("next." + name for name, _ in actor.state)])


class RecurrentReplay:
    """The reference a recurrent node's batches are held to: ``len(seeds)`` CartPole envs
    (``max_episode_steps``), env ``e`` first reset with ``seeds[e]`` and then without a seed,
    stepped together one frame at a time by a :class:`RecurrentActor` in torch, deterministic
    (the first argmax), keeping the state per env as PROTOCOL.md §8 (Recurrent) says: zero at
    the start, zeroed on the first frame of each episode (``is_init``, ``step_count`` 0), the
    actor's next state kept for the env's next frame."""

    def __init__(self, seeds, max_episode_steps, state):
        import gymnasium as gym

        n = len(seeds)
        self.envs = [gym.make("CartPole-v1", max_episode_steps=max_episode_steps) for _ in range(n)]
        self.pending = list(seeds)
        self.obs = np.zeros((n, 4), np.float32)
        self.step_count = np.zeros(n, np.int64)
        self.needs_reset = np.ones(n, bool)
        self.names = [name for name, _ in state]
        self.state = [torch.zeros(n, *shape) for _, shape in state]

    def reseed(self, seed):
        """``seed {seed}``: env ``e`` starts a new episode from ``reset(seed + e)`` at its next frame."""
        self.pending = [seed + e for e in range(len(self.envs))]
        self.needs_reset[:] = True

    def frames(self, actor, T, random=None, actions=None):
        """The next ``T`` frames of every env, ``{key: [E, T, ...] array}`` as a batch holds
        them (``observation``, ``action``, ``logits``, ``is_init``, each ``<name>`` and
        ``next.<name>``, ``step_count``). Where ``random`` (bool ``[E, T]``) is set, the env
        takes ``actions``' action instead and the actor's output is not used: the state
        stays, and ``logits`` are 0 (``init_random_frames``)."""
        out = {key: [] for key in ("observation", "action", "logits", "is_init", "step_count",
                                   *self.names, *("next." + n for n in self.names))}
        for t in range(T):
            for e, env in enumerate(self.envs):
                if self.needs_reset[e]:
                    self.obs[e], _ = env.reset(seed=self.pending[e])
                    self.pending[e], self.step_count[e], self.needs_reset[e] = None, 0, False
            is_init = torch.from_numpy(self.step_count == 0)
            state = [torch.where(is_init.view(-1, *[1] * (s.dim() - 1)), torch.zeros_like(s), s) for s in self.state]
            with torch.no_grad():
                logits, *nxt = actor(torch.from_numpy(self.obs.copy()), is_init[:, None], *state)
            action = logits.argmax(-1).numpy()
            if random is not None:
                held = torch.from_numpy(random[:, t])
                action = np.where(random[:, t], actions[:, t], action)
                logits = torch.where(held[:, None], torch.zeros_like(logits), logits)
                nxt = [torch.where(held.view(-1, *[1] * (s.dim() - 1)), s, n) for s, n in zip(state, nxt)]
            for key, v in (("observation", self.obs.copy()), ("action", action), ("logits", logits.numpy()),
                           ("is_init", is_init.numpy()[:, None]), ("step_count", self.step_count[:, None].copy()),
                           *zip(self.names, (s.numpy() for s in state)),
                           *zip(("next." + n for n in self.names), (s.numpy() for s in nxt))):
                out[key].append(v)
            for e, env in enumerate(self.envs):
                o, _, te, tr, _ = env.step(int(action[e]))
                self.obs[e] = o
                self.step_count[e] += 1
                self.needs_reset[e] = te or tr
            self.state = nxt
        return {key: np.stack(v, axis=1) for key, v in out.items()}


# -- Ornstein-Uhlenbeck exploration (PROTOCOL.md §8, Exploration modules) ------------------------

def with_eps(model, name="eps", eps=1.0, output="ou_eps"):
    """``model`` (bytes) with an f32 initializer ``name`` holding ``eps`` (a number: shape
    ``[]``, as torchrl's buffer; a list: that shape) read by an ``Identity`` into an extra
    output ``output``: what rollout's exporter adds for an ``OrnsteinUhlenbeckProcessModule``
    (``ou_eps``) or an ``EGreedyModule`` (``egreedy_eps``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    proto = onnx.load_from_string(model)
    value = np.array(eps, np.float32)
    proto.graph.initializer.append(numpy_helper.from_array(value, name))
    proto.graph.node.append(helper.make_node("Identity", [name], [output]))
    proto.graph.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, list(value.shape)))
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def ou_config(eps="eps", theta=0.15, mu=0.0, sigma=0.2, sigma_min=None, n_steps_annealing=1000, dt=0.01, x0=()):
    """An ``exploration`` config (torchrl's defaults unless given)."""
    return {"kind": "ornstein_uhlenbeck", "eps": eps, "theta": theta, "mu": mu, "sigma": sigma,
            "sigma_min": sigma_min, "n_steps_annealing": n_steps_annealing, "dt": dt, "x0": list(x0)}


def ou_state(d=1):
    """The config's ``state`` of an OU module on an action of ``d`` values."""
    return [{"name": "_ou_prev_noise", "shape": [d]}, {"name": "_ou_steps", "shape": [1]}]
