"""The bench's torchrl actors, written as a torchrl user writes them.

- ``nature_cnn_actor``: the Nature-DQN CNN (Mnih et al. 2015: conv 32 8x8/4, conv 64
  4x4/2, conv 64 3x3/1, dense 512, ReLU) under ``ProbabilisticActor(OneHotCategorical)``,
  reading uint8 frames (scaled by 1/255 inside the module): ``[4, 84, 84]`` stacked
  grayscale frames, or ALE's raw ``[210, 160, 3]`` RGB frames (channels last, permuted
  inside the module).
- ``gaussian_actor``: a 256-256 ReLU MLP giving ``loc`` and ``scale``
  (``NormalParamExtractor``) under ``ProbabilisticActor(TanhNormal)`` with the env's
  action bounds, as torchrl's SAC and PPO MuJoCo examples build it.

Both ``return_log_prob=True``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, TanhNormal


class NatureCNN(nn.Module):
    """uint8 frames ``[B, C, H, W]`` (or ``[B, H, W, C]`` with ``channels_last``) to
    ``n_actions`` logits."""

    def __init__(self, obs_shape: Sequence[int], n_actions: int, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        c = obs_shape[-1] if channels_last else obs_shape[0]
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.convs(torch.zeros(1, *self._chw(obs_shape))).shape[-1]
        self.head = nn.Sequential(nn.Linear(n, 512), nn.ReLU(), nn.Linear(512, n_actions))

    def _chw(self, shape):
        return (shape[-1], shape[0], shape[1]) if self.channels_last else tuple(shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32) / 255.0
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.convs(x))


def nature_cnn_actor(obs_shape: Sequence[int], n_actions: int, channels_last: bool = False) -> ProbabilisticActor:
    net = NatureCNN(obs_shape, n_actions, channels_last)
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )


def gaussian_actor(obs_dim: int, action_dim: int, low: float, high: float, hidden: Sequence[int] = (256, 256)) -> ProbabilisticActor:
    net = nn.Sequential(
        MLP(in_features=obs_dim, out_features=2 * action_dim, num_cells=list(hidden), activation_class=nn.ReLU),
        NormalParamExtractor(),
    )
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high},
        return_log_prob=True,
    )
