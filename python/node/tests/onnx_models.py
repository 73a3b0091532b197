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
