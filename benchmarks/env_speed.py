"""How fast an RL task's environment steps in the sim: decisions per second of wall time.

Steps ``kvrl/<task>`` (a ``conf/env`` task, its shipped profile) with one fixed action for ``--decisions``
decisions, resetting at each episode's end, after one untimed reset, and prints one line:
``<task>: <n> decisions in <s> s = <rate>/s (<episodes> episodes)``. CPU only; time it over several
processes with ``farm-bench`` (docs/rl.md, "What was tried").

    python benchmarks/env_speed.py --task pressure --decisions 600
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="pressure", help="a task of conf/env/")
    ap.add_argument("--decisions", type=int, default=600)
    ap.add_argument("--action", type=int, default=1, help="the fixed action (a bin index for discrete tasks)")
    args = ap.parse_args()

    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the task ids)
    from kvrl.envs.config import load_task

    env_id, cfg = load_task(args.task)
    env = gym.make(env_id, config=cfg)
    env.reset(seed=0)
    episodes = 0
    t0 = time.perf_counter()
    for _ in range(args.decisions):
        _, _, terminated, truncated, _ = env.step(args.action)
        if terminated or truncated:
            env.reset()
            episodes += 1
    wall = time.perf_counter() - t0
    print(f"{args.task}: {args.decisions} decisions in {wall:.2f} s = {args.decisions / wall:.0f}/s ({episodes} episodes)")


if __name__ == "__main__":
    main()
