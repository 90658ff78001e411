"""What a saved agent does: its greedy actions over one whole split of its task, as shares per action
and in order (the action labels are the task's rules or bins).

    python scripts/rl_action_mix.py --task throttle_planner --split test --seed 0 \
        docs/results/agents/throttle_planner-rcpi-seed0 docs/results/agents/throttle_planner-rcpi-seed1

The episode serves the split at the task's scenario load, step times unperturbed, as kvrl-eval's
jobs do (kvrl-eval's jobs resample 80% of the split per seed; this serves all of it).

``--override`` (repeated) adds Hydra overrides of the task, e.g. a gate's action set
(``env.action.rules=[...]``) on a task that lists other rules.

``--first N --first_action A`` serves each agent again with its first N decisions replaced by action A,
and the split at A throughout: where in the episode an agent's loss to A lies.

    python scripts/rl_action_mix.py --task throttle_planner_heldout --first 8 --first_action 1 \
        docs/results/agents/throttle_planner-rcpi-seed0
"""
from __future__ import annotations

import argparse
import logging
import os


def action_labels(env) -> list[str]:
    """The task's action labels: each rule as ``name(params)``, else each bin."""
    rules = env.actions.rules
    if rules is None:
        return [f"{float(b):g}" for b in env.actions.config.bins]
    return [r["name"] + "(" + ", ".join(f"{k}={v}" for k, v in r.items() if k != "name") + ")" for r in rules]


def main() -> None:
    logging.disable(logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first", type=int, default=0, help="with --first_action: decisions replaced")
    p.add_argument("--first_action", type=int, default=None, help="the action index of the replaced decisions")
    p.add_argument("--override", action="append", default=[], help="a Hydra override of the task (repeatable)")
    p.add_argument("agents", nargs="+", help="kvrl-train or rl_rcpi run directories (best_model.zip, agent.json)")
    a = p.parse_args()
    import gymnasium as gym
    import numpy as np

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.agent_io import load_agent
    from kvrl.envs.config import load_task

    env_id, cfg = load_task(a.task, [f"env.episode.split={a.split}", "env.episode.window_s=null",
                                     "env.episode.step_time_sigma=0.0", "env.episode.rate_scales=[1.0]", *a.override])
    env = gym.make(env_id, config=cfg).unwrapped
    labels = action_labels(env)

    def serve(policy) -> tuple[list[int], float]:
        """The split served with ``policy(decision index, observation)``: its actions and goodput (tok/s)."""
        obs, _ = env.reset(seed=a.seed)
        actions, done = [], False
        while not done:
            actions.append(int(policy(len(actions), obs)))
            obs, _, terminated, truncated, info = env.step(actions[-1])
            done = terminated or truncated
        return actions, info["metrics"]["goodput_tok_s"]

    if a.first_action is not None:
        print(f"{labels[a.first_action]} throughout: goodput {serve(lambda k, obs: a.first_action)[1]:.1f} tok/s")
    for path in a.agents:
        model = load_agent(path)
        actions, goodput = serve(lambda k, obs: model.act(obs))
        model.reset()                              # a recurrent agent starts the next episode afresh
        shares = np.bincount(actions, minlength=len(labels)) / len(actions)
        print(f"{os.path.basename(path.rstrip('/'))}: {len(actions)} decisions, goodput {goodput:.1f} tok/s")
        print("  " + "; ".join(f"{label} {share:.0%}" for label, share in zip(labels, shares)))
        print("  in order: " + " ".join(str(x) for x in actions))
        if a.first_action is not None:
            _, replaced = serve(lambda k, obs: a.first_action if k < a.first else model.act(obs))
            print(f"  its first {a.first} decisions at {labels[a.first_action]}: goodput {replaced:.1f} tok/s")


if __name__ == "__main__":
    main()
