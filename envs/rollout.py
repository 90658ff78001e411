"""Rollouts from a copied serving state: what each watermark action would lead to.

A :class:`~kvrl.envs.watermark_env.WatermarkEnv` episode served to completion (``reset(options=
{"workload": requests})``) is deterministic on the sim backend, and the whole environment (engine,
sim executor, feature tracker, pending arrivals) can be copied with :func:`copy.deepcopy`. From
any decision point, :func:`action_scores` serves a copy once per action: the action for one
decision epoch, then ``base`` until the episode ends, and returns each copy's finished-episode
goodput. ``base`` is a constant action index or a policy, a callable from the observation to an
action index, which then acts on the observation each step returns. The copies see the future
(arrivals and output lengths are in the copied state), so:

* the greedy choice over these scores is a clairvoyant **rollout planner** (an upper reference for
  what an adaptive watermark can gain over its base, scripts/rl_rollout_oracle.py);
* the scores, as regression targets for the observation, teach a policy the *expected* gain of each
  action given what it can observe (rollout classification policy iteration, Lagoudakis & Parr,
  ICML 2003): :func:`collect` gathers them on training windows (scripts/rl_rcpi.py fits the
  policy).

With a :class:`~kvrl.envs.guess.Guess` the copies see a guessed future instead (drawn arrivals and
output lengths, averaged over several draws): the scores are then what a server could expect from
each action, and their greedy choice is the planner of docs/rl.md, "A planner that averages its
guesses and does not know when traffic stops"; fitted to them, a policy imitates that planner
(expert iteration).

Engine prefix hashes must be copyable: the env is built with ``engine.prefix_hash=xxh3`` (a keyed
BLAKE2b state cannot be deep-copied; the scenarios here use no shared prefixes).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np

from kvrl.envs.guess import Guess, guess_future

Base = Union[int, Callable[[np.ndarray], int]]
"""A base: a constant action index, or a policy (observation -> action index)."""


def base_action(base: Base, obs: Optional[np.ndarray]):
    """The action ``base`` takes at observation ``obs``: a policy's on ``obs``, a constant as it is
    (it ignores ``obs``; scripts/rl_rollout_oracle.py passes watermark fractions as constants)."""
    return int(base(obs)) if callable(base) else base


def finish(env, base: Base, obs: Optional[np.ndarray] = None) -> float:
    """Serve the rest of ``env``'s episode following ``base``; the episode's goodput tok/s. A policy
    base acts on ``obs`` (the observation at ``env``'s current decision point, required then) and
    then on the observation each step returns."""
    if callable(base) and obs is None:
        raise ValueError("a policy base needs the current observation")
    while True:
        obs, _, terminated, truncated, info = env.step(base_action(base, obs))
        if terminated or truncated:
            return float(info["metrics"]["goodput_tok_s"])


def action_scores(env, base: Base, hold: int = 1, guess: Optional[Guess] = None,
                  rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Finished-episode goodput (tok/s) of each action of ``env``'s discrete action space: the
    action for ``hold`` decision epochs from the current decision point, then ``base`` to the
    end (a policy base from the observation the last held step returns). ``env`` itself is not
    advanced.

    With ``guess``, the copies do not hold the future: each of ``guess.samples`` draws (from ``rng``)
    replaces the arrivals to come and every output length by a guess a server could make
    (:func:`kvrl.envs.guess.guess_future`), every action is served on the same draws, and an action's
    score is its mean goodput over them: its expected outcome under that guess, not its outcome on the
    one future that happened."""
    if guess is None:
        return _served_scores(env, base, hold)
    if rng is None:
        raise ValueError("guessed scores need an rng to draw the futures")
    total = np.zeros(env.action_space.n, dtype=np.float64)
    for _ in range(guess.samples):
        guessed = copy.deepcopy(env)
        guess_future(guessed.driver.loop, guess, rng)
        total += _served_scores(guessed, base, hold)
    return total / guess.samples


def _served_scores(env, base: Base, hold: int) -> np.ndarray:
    """:func:`action_scores` on the future ``env`` holds."""
    scores = np.empty(env.action_space.n, dtype=np.float64)
    for action in range(env.action_space.n):
        trial = copy.deepcopy(env)
        score = None
        for _ in range(hold):
            obs, _, terminated, truncated, info = trial.step(action)
            if terminated or truncated:
                score = float(info["metrics"]["goodput_tok_s"])
                break
        scores[action] = finish(trial, base, obs) if score is None else score
    return scores


@dataclass
class RolloutData:
    """Observations and, per observation, every action's finished-episode goodput (tok/s), the
    base's action there and its score."""

    observations: list[np.ndarray] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)
    base_scores: list[float] = field(default_factory=list)
    base_actions: list[int] = field(default_factory=list)

    def add(self, obs: np.ndarray, scores: np.ndarray, base: int) -> None:
        """One decision: ``base`` is the base's action at ``obs`` (its score is the base score)."""
        self.observations.append(np.asarray(obs, dtype=np.float32))
        self.scores.append(scores)
        self.base_scores.append(float(scores[base]))
        self.base_actions.append(int(base))

    def extend(self, other: "RolloutData") -> None:
        for name in ("observations", "scores", "base_scores", "base_actions"):
            getattr(self, name).extend(getattr(other, name))

    def advantages_pct(self) -> np.ndarray:
        """Each action's gain over the base action, in % of the base's goodput (rows: decisions)."""
        scores = np.asarray(self.scores)
        base = np.asarray(self.base_scores)[:, None]
        return 100.0 * (scores - base) / np.maximum(base, 1e-9)

    def save(self, path: str) -> None:
        np.savez_compressed(path, observations=np.asarray(self.observations), scores=np.asarray(self.scores),
                            base_scores=np.asarray(self.base_scores),
                            base_actions=np.asarray(self.base_actions, dtype=np.int64))

    @classmethod
    def load(cls, paths: Sequence[str], base: Optional[int] = None) -> "RolloutData":
        """Files saved before ``base_actions`` existed (a constant base) take ``base`` at every
        decision; without it, the first action whose score is the base score."""
        data = cls()
        for path in paths:
            with np.load(path) as z:
                data.observations += list(z["observations"])
                data.scores += list(z["scores"])
                data.base_scores += list(z["base_scores"])
                if "base_actions" in z:
                    data.base_actions += [int(a) for a in z["base_actions"]]
                elif base is not None:
                    data.base_actions += [int(base)] * len(z["base_scores"])
                else:
                    data.base_actions += [int(np.flatnonzero(row == b)[0])
                                          for row, b in zip(z["scores"], z["base_scores"])]
        return data


def collect(env, base: Base, episodes: int, rng: np.random.Generator, explore: float = 0.3,
            hold: int = 1, record: float = 1.0, skip_s: float = 0.0, until_s: Optional[float] = None,
            guess: Optional[Guess] = None, into: Optional[RolloutData] = None,
            on_record: Optional[Callable[[RolloutData], None]] = None) -> RolloutData:
    """Rollout scores at decisions of ``episodes`` training windows of ``env``.

    Each episode is one window of the env's split (its usual draw: window, load scale, step-time
    perturbation) served to completion. A decision is scored with probability ``record`` once
    ``skip_s`` seconds of engine time have passed (the first seconds of a window start from an
    empty pool, unlike serving) and, with ``until_s``, before that many seconds have (to teach the
    first seconds of an episode, which an evaluation episode starts with too; the window stops
    there). Between decisions the episode follows ``base`` (a policy on the observation each step
    returns), or a uniformly random action with probability ``explore`` (so
    that the states also cover what the learned policy will do). Each scored decision records the
    base's action there. With ``guess``, the scores are :func:`action_scores`' guessed ones (what a
    server could expect), not the clairvoyant ones. The decisions are added to ``into`` (returned;
    a new :class:`RolloutData` without it), and ``on_record`` is called with it after each (to save
    what is done when a run can be stopped at any moment)."""
    data = RolloutData() if into is None else into
    for _ in range(episodes):
        requests, _ = env.session.episode(rng, None)
        obs, _ = env.reset(seed=int(rng.integers(2**31)), options={"workload": list(requests)})
        start_s = requests[0].arrival_s
        done = False
        while not done:
            elapsed = env.driver.engine.now - start_s
            if until_s is not None and elapsed >= until_s:
                break                           # nothing more to score in this window
            if elapsed >= skip_s and rng.random() < record:
                data.add(obs, action_scores(env, base, hold, guess, rng), base_action(base, obs))
                if on_record is not None:
                    on_record(data)
            action = int(rng.integers(env.action_space.n)) if rng.random() < explore else base_action(base, obs)
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return data
