"""Does traffic an agent never saw look new to it? Its observations on other families against those of
its own training episodes: per decision (nearest-neighbour distance) and over a window of decisions
(how much one feature varies).

    python scripts/rl_obs_shift.py --agent docs/results/agents/throttle_planner-rcpi-seed0 \
        --task throttle_planner --episodes 12 --feature arrival_rate_short --window 8 \
        throttle_planner:test throttle_planner_heldout:test throttle_planner_heldout_conv:test

The training observations come from ``--episodes`` episodes of ``--task`` as its environment draws
them for training (train split, the task's window, loads and step-time noise; seeds 1000, 1001, ...),
the agent deciding. Each ``TASK:SPLIT`` is served whole at the task's scenario load, step times
unperturbed (as scripts/rl_action_mix.py does), seed 0. Prints a Markdown table: per family, the
decisions, the share of them whose mean distance to their 5 nearest training observations (features
standardised by the training set's) exceeds the training set's own 99th percentile (leave one out),
the median over decisions of ``--feature``'s standard deviation over the last ``--window`` decisions,
and the share of decisions where that is below the training episodes' 5th percentile.

``--guard_action A`` adds a second table: each family's goodput (tok/s) served by the agent, by the
agent guarded (action A wherever the decision's distance exceeds that 99th percentile), and by A
throughout, with the share of decisions the guard took: whether falling back where the traffic looks
new would have kept the agent from its loss there.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np

K = 5


def serve(env, policy, seed: int) -> tuple[np.ndarray, list[int], float]:
    """One episode with ``policy(observation) -> action``: its observations and actions at each
    decision and its goodput (tok/s)."""
    obs, _ = env.reset(seed=seed)
    seen, actions, done = [], [], False
    while not done:
        seen.append(obs)
        actions.append(int(policy(obs)))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        done = terminated or truncated
    return np.array(seen), actions, info["metrics"]["goodput_tok_s"]


def knn_distance(x: np.ndarray, train: np.ndarray, leave_one_out: bool = False) -> np.ndarray:
    """Mean Euclidean distance of each row of ``x`` to its ``K`` nearest rows of ``train``."""
    d = np.sqrt(((x[:, None, :] - train[None, :, :]) ** 2).sum(-1))
    if leave_one_out:
        np.fill_diagonal(d, np.inf)
    return np.sort(d, axis=1)[:, :K].mean(1)


def rolling_sd(values: np.ndarray, window: int) -> np.ndarray:
    """The standard deviation over each full window of consecutive decisions."""
    return np.array([values[i - window + 1:i + 1].std() for i in range(window - 1, len(values))])


def main() -> None:
    logging.disable(logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", required=True)
    p.add_argument("--task", required=True, help="the agent's training task")
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--feature", default="arrival_rate_short")
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--guard_action", type=int, default=None, help="the action a guarded agent falls back to")
    p.add_argument("families", nargs="+", help="TASK:SPLIT")
    a = p.parse_args()
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.agent_io import load_agent
    from kvrl.envs.config import load_task
    from kvrl.envs.features import ENGINE_FEATURES, HISTORY_FEATURES

    column = (*ENGINE_FEATURES, *HISTORY_FEATURES).index(a.feature)
    agent = load_agent(a.agent)
    env_id, cfg = load_task(a.task, [])
    env = gym.make(env_id, config=cfg).unwrapped
    episodes = []
    for i in range(a.episodes):
        agent.reset()                                  # a recurrent agent starts each episode afresh
        episodes.append(serve(env, agent.act, 1000 + i)[0])
    train = np.concatenate(episodes)
    mu, sd = train.mean(0), train.std(0) + 1e-3
    z_train = (train - mu) / sd
    far = np.quantile(knn_distance(z_train, z_train, leave_one_out=True), 0.99)
    calm = np.quantile(np.concatenate([rolling_sd(e[:, column], a.window) for e in episodes if len(e) >= a.window]), 0.05)
    rows, guarded = [("training episodes", train, episodes)], []
    looks_new = lambda obs: knn_distance(((obs - mu) / sd)[None], z_train)[0] > far   # noqa: E731
    for family in a.families:
        task, split = family.split(":")
        env_id, cfg = load_task(task, [f"env.episode.split={split}", "env.episode.window_s=null",
                                       "env.episode.step_time_sigma=0.0", "env.episode.rate_scales=[1.0]"])
        family_env = gym.make(env_id, config=cfg).unwrapped
        agent.reset()
        obs, _, alone = serve(family_env, agent.act, 0)
        rows.append((family, obs, [obs]))
        if a.guard_action is not None:
            fallback, flags = a.guard_action, []
            agent.reset()
            _, _, with_guard = serve(family_env, lambda o: fallback if flags.append(looks_new(o)) or flags[-1]
                                     else agent.act(o), 0)
            taken = np.mean(flags)
            _, _, constant = serve(family_env, lambda o: fallback, 0)
            guarded.append((family, alone, with_guard, constant, taken))
    print(f"| family | decisions | beyond the training q99 of 5-NN distance | median sd of {a.feature} over "
          f"{a.window} decisions | below the training q5 ({calm:.3f}) |")
    print("|---|---:|---:|---:|---:|")
    for name, obs, eps in rows:
        dist = knn_distance((obs - mu) / sd, z_train, leave_one_out=name == "training episodes")
        sds = np.concatenate([rolling_sd(e[:, column], a.window) for e in eps if len(e) >= a.window])
        print(f"| {name} | {len(obs)} | {np.mean(dist > far):.0%} | {np.median(sds):.3f} | {np.mean(sds < calm):.0%} |")
    if guarded:
        print(f"\n| family | agent | agent guarded (action {a.guard_action} where new) | action {a.guard_action} throughout "
              "| decisions the guard took |")
        print("|---|---:|---:|---:|---:|")
        for family, alone, with_guard, constant, taken in guarded:
            print(f"| {family} | {alone:.1f} | {with_guard:.1f} | {constant:.1f} | {taken:.0%} |")


if __name__ == "__main__":
    main()
