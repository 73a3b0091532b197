#!/usr/bin/env python3
"""Records gymnasium transitions for the Rust parity test (tests/tests/gym_parity.rs).

Setup:   pip install gymnasium        (recorded with gymnasium 1.4.0, numpy 2.4.6, CPython 3.11)
Run:     python3 scripts/gym_fixtures.py   (from the repository root)
Output:  tests/fixtures/gym/<env-id>.json

Each transition holds the internal state before the step (`env.unwrapped.state` widened to
float64, exact), the TimeLimit's elapsed steps before the step, the action, the next
observation, the next internal state, the reward, and terminated / truncated. Floats are
written as strings holding Python's `repr`, so they round-trip exactly whatever the JSON
parser's float precision (the Rust test parses them with `str::parse::<f64>`).

Besides random episodes the script places the env in edge states (walls, goal, speed
limits, out-of-range actions) and sets the TimeLimit counter close to the limit to record
truncations, including a step that is both terminated and truncated.
"""

import json
import math
import os
import sys

import gymnasium as gym
import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gym")


def f(x):
    """An exact float as a string (repr of the float64 value)."""
    return repr(float(x))


def fl(xs):
    return [f(x) for x in np.asarray(xs, dtype=np.float64).ravel()]


class Recorder:
    def __init__(self, env_id):
        self.env_id = env_id
        self.env = gym.make(env_id)
        self.max_steps = self.env.spec.max_episode_steps
        self.transitions = []

    @property
    def u(self):
        return self.env.unwrapped

    def reset(self, seed=None):
        self.env.reset(seed=seed)

    def set(self, state, elapsed=None):
        """Resets, then overwrites the internal state (keeping its numpy dtype) and the counter."""
        self.env.reset()
        self.u.state = state
        if elapsed is not None:
            self.env._elapsed_steps = elapsed

    def step(self, action):
        """One recorded step; returns (terminated, truncated)."""
        state = fl(self.u.state)
        elapsed = int(self.env._elapsed_steps)
        if isinstance(action, (int, np.integer)):
            act = int(action)
        else:
            action = np.asarray(action, dtype=np.float32).reshape(1)
            act = fl(action)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.transitions.append(
            {
                "state": state,
                "elapsed": elapsed,
                "action": act,
                "obs": fl(obs),
                "next_state": fl(self.u.state),
                "reward": f(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            }
        )
        return terminated, truncated

    def write(self):
        os.makedirs(OUT_DIR, exist_ok=True)
        path = os.path.join(OUT_DIR, f"{self.env_id}.json")
        doc = {
            "env": self.env_id,
            "gymnasium": gym.__version__,
            "numpy": np.__version__,
            "max_episode_steps": self.max_steps,
            "transitions": self.transitions,
        }
        with open(path, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"))
            fh.write("\n")
        n_term = sum(t["terminated"] for t in self.transitions)
        n_trunc = sum(t["truncated"] for t in self.transitions)
        print(f"{path}: {len(self.transitions)} transitions, {n_term} terminated, "
              f"{n_trunc} truncated, {os.path.getsize(path)} bytes")


def cartpole():
    r = Recorder("CartPole-v1")
    rng = np.random.default_rng(1)
    terminal = []
    # Random episodes to termination, then episodes with constant / alternating actions.
    policies = ["random"] * 8 + ["left", "right", "alternate"]
    for ep, policy in enumerate(policies):
        r.reset(seed=ep)
        t = 0
        while True:
            if policy == "random":
                a = int(rng.integers(2))
            elif policy == "left":
                a = 0
            elif policy == "right":
                a = 1
            else:
                a = t % 2
            state = np.array(r.u.state)
            term, trunc = r.step(a)
            t += 1
            if term or trunc:
                terminal.append((state, a))
                break
    # Truncation at the time limit, then a step both terminated and truncated.
    r.reset(seed=100)
    r.env._elapsed_steps = r.max_steps - 3
    for a in (0, 1, 0):
        r.step(a)
    for state, a in terminal[:2]:
        r.set(state.copy(), elapsed=r.max_steps - 1)
        r.step(a)
    # Edge states: near each termination bound, large velocities.
    thr = 12 * 2 * math.pi / 360
    for state in ([2.39, 0.6, 0.0, 0.0], [-2.39, -0.6, 0.0, 0.0], [0.0, 0.0, thr - 1e-3, 0.3],
                  [0.0, 0.0, -thr + 1e-3, -0.3], [1.0, 5.0, 0.1, -4.0], [0.0, 0.0, 0.0, 0.0]):
        for a in (0, 1):
            r.set(np.array(state, dtype=np.float64), elapsed=int(rng.integers(0, 400)))
            r.step(a)
    r.write()


def pendulum():
    r = Recorder("Pendulum-v1")
    rng = np.random.default_rng(2)
    edge = [5.0, -5.0, 2.0, -2.0, 0.0, 1.0, -1.0, 2.0000002, -1.9999999, 1e-7, 0.3, 123.456]
    for ep in range(5):
        r.reset(seed=ep)
        for t in range(40):
            if t < len(edge) and ep % 2 == 0:
                a = edge[t]
            else:
                a = rng.uniform(-2.5, 2.5)
            r.step([a])
    # Truncation at the time limit.
    r.reset(seed=50)
    r.env._elapsed_steps = r.max_steps - 3
    for a in (1.0, -2.0, 5.0):
        r.step([a])
    # Edge states: speed clipping, angles far from [-pi, pi), exactly +-pi.
    states = [[0.0, 7.9], [0.0, -7.9], [math.pi, 0.0], [-math.pi, 0.0], [3 * math.pi, 1.0],
              [-7 * math.pi / 2, -3.0], [100.0, 8.0], [-1e3, -8.0], [1e-9, 0.0], [2 * math.pi, 0.5]]
    for s in states:
        for a in (2.0, -2.0, 5.0, 0.0, rng.uniform(-2, 2)):
            r.set(np.array(s, dtype=np.float64), elapsed=int(rng.integers(0, 150)))
            r.step([a])
    # NumPy computes scalar `x ** 2` with libm pow, which differs from `x * x` in the last bit
    # for about one value in 1700 (f64 and f32 alike): record states and torques where it does.
    found = {"th": 0, "thdot": 0, "u": 0}
    while min(found.values()) < 3:
        th, thdot = rng.uniform(-20, 20), rng.uniform(-8, 8)
        u = np.float32(rng.uniform(-2, 2))
        an = ((np.float64(th) + np.pi) % (2 * np.pi)) - np.pi
        hits = {"th": an**2 != an * an, "thdot": np.float64(thdot) ** 2 != thdot * thdot, "u": u**2 != u * u}
        if any(hits[k] and found[k] < 3 for k in hits):
            for k in hits:
                found[k] += int(hits[k])
            r.set(np.array([th, thdot]), elapsed=int(rng.integers(0, 199)))
            r.step([u])
    # Random states with random actions.
    for _ in range(50):
        s = np.array([rng.uniform(-20, 20), rng.uniform(-8, 8)])
        r.set(s, elapsed=int(rng.integers(0, 199)))
        r.step([rng.uniform(-3, 3)])
    r.write()


def mountain_car():
    r = Recorder("MountainCarContinuous-v0")
    rng = np.random.default_rng(3)
    edge = [5.0, -5.0, 1.0, -1.0, 0.0, 1.0000001, -0.99999994, 0.5, 1e-8, -123.0]
    # Random episodes from reset (the first step of each runs on the float64 reset state).
    for ep in range(6):
        r.reset(seed=ep)
        for t in range(25):
            if ep % 2 == 0 and t < len(edge):
                a = edge[t]
            else:
                a = rng.uniform(-1.5, 1.5)
            r.step([a])
    # First step after reset with each edge action (float64 state, clipped and unclipped force).
    for i, a in enumerate(edge):
        r.reset(seed=100 + i)
        r.step([a])
    # Drive to the goal from float32 states: several steps, ending terminated.
    for s, a in (([0.3, 0.04], 1.0), ([0.35, 0.03], 5.0), ([0.2, 0.05], 0.7)):
        r.set(np.array(s, dtype=np.float32))
        for _ in range(20):
            term, trunc = r.step([a])
            if term or trunc:
                break
    # Goal from a float64 state (as right after reset), and terminated + truncated.
    r.set(np.array([0.449, 0.05]))
    r.step([0.5])
    r.set(np.array([0.44, 0.06], dtype=np.float32), elapsed=r.max_steps - 1)
    r.step([-0.25])
    # Truncation at the time limit.
    r.reset(seed=60)
    r.env._elapsed_steps = r.max_steps - 3
    for a in (1.0, -1.0, 5.0):
        r.step([a])
    # Left wall, speed limits, right edge, goal boundary, negative velocity at goal.
    states = [[-1.19, -0.07], [-1.2, -0.01], [-1.2, 0.0], [0.0, 0.0699], [0.0, -0.0699], [-0.5, 0.07],
              [0.59, 0.07], [0.45, 0.0], [0.45, -0.001], [0.4499, 0.0001], [-0.52, 0.0]]
    for s in states:
        for a in (1.0, -1.0, 5.0, -5.0, 0.0, rng.uniform(-1, 1)):
            r.set(np.array(s, dtype=np.float32), elapsed=int(rng.integers(0, 990)))
            r.step([a])
    # A step ending exactly on float32(0.45): NumPy compares float32 with the Python float
    # 0.45 in float32, so this terminates (a float64 comparison would not).
    goal = np.float32(0.45)
    n = 0
    while n < 3:
        v0, a = np.float32(rng.uniform(0.0, 0.06)), np.float32(rng.uniform(-1, 1))
        p0 = np.float32(0.4)
        for _ in range(4):  # the slope depends on the position: iterate to a fixed point
            r.set(np.array([p0, v0], dtype=np.float32))
            r.u.step(np.array([a]))
            v_new = np.float32(r.u.state[1])
            p0 = np.float32(goal - v_new)
        r.set(np.array([p0, v0], dtype=np.float32))
        r.u.step(np.array([a]))
        if np.float32(r.u.state[0]) == goal and r.u.state[1] >= 0:
            r.set(np.array([p0, v0], dtype=np.float32))
            term, _ = r.step([a])
            assert term
            n += 1
    # The same states as float64 (the reset dtype).
    for s in states:
        r.set(np.array(s, dtype=np.float64))
        r.step([rng.uniform(-2, 2)])
    r.write()


def main():
    which = sys.argv[1:] or ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"]
    makers = {"CartPole-v1": cartpole, "Pendulum-v1": pendulum, "MountainCarContinuous-v0": mountain_car}
    for env_id in which:
        makers[env_id]()


if __name__ == "__main__":
    main()
