"""Is there anything left to learn over a preemption heuristic? One-step clairvoyant deviations.

On a whole kvrl-eval job of a Preemption-v0 task whose ``env.features.slot_rules`` put the
heuristic in slot 0, the base policy answers every decision with ``--base`` (slot 0 and its mode:
exactly the heuristic, tests/test_demand.py). At ``--decisions`` decision points drawn uniformly
from the base episode, every other valid action is tried once, the base policy answering all the
other decisions, and each such episode is served to the end of the job. The sim is deterministic,
so the goodput difference to the base episode is the clairvoyant value of that single deviation
(the action's advantage under the base policy, Q(s, a) - V(s), measured over the whole job).

By the policy improvement theorem, if no deviation at any state gains, the base policy cannot be
improved by any policy, however much it observes; the size of the best deviations bounds what one
step of policy iteration from the heuristic can gain, and the mean deviation says how much a
policy that explores around the heuristic pays. The deviations see the future (the job's arrivals
and output lengths): they bound, they are not a policy.

    python scripts/rl_victim_deviation.py --task classes_preemption --split val --seeds 0,1,2 \\
        --decisions 24 --workers 16 --out deviation.jsonl -- \\
        'env.features.slot_rules=[{name: slo_slack, mode: swap, pace: 0.5},most_blocks,lifo,{name: longest_remaining, key: tenant},fewest_computed]' \\
        env.features.slo=true

Writes one JSON line per (seed, decision) to ``--out`` (every tried action's goodput and gain in %
of the base episode's, and the observation the base episode had there) and prints a summary over
all decisions (kvrl.analysis.stats.mean_ci).

Can an observing policy find the gainful deviations? ``--fit <jsonl> [<jsonl> ...]`` fits, for each
action, a ridge regression of its gain on the observation, leaving one seed out at a time; on the
held-out seed's decisions it takes the action of highest predicted gain (the base when none is
predicted above zero) and reports the gain realised (rollout classification policy iteration,
Lagoudakis & Parr, ICML 2003, one step from the heuristic), beside the clairvoyant best and the mean
deviation.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np


@functools.lru_cache(maxsize=4)
def _setup(task: str, seed: int, overrides: tuple, split: str, resample: float):
    """The task's env config and the job's requests (kvrl-eval's ``job_config``), per process."""
    from kvrl.envs.config import load_task
    from rl_rollout_oracle import job_requests     # scripts/ is on sys.path when run as a script

    args = [f"seed={seed}", "env.episode.step_time_sigma=0.0", "env.episode.rate_scales=null", *overrides]
    env_id, cfg = load_task(task, args)
    requests, _ = job_requests(cfg, split, seed, resample)
    return env_id, cfg, requests


def serve(task: str, seed: int, overrides: tuple, split: str, resample: float, base: int,
          deviation: tuple[int, int] | None = None, record: bool = False) -> dict:
    """Serve the job with ``base`` at every decision except ``deviation = (decision index, action)``;
    its goodput tok/s, number of decisions and, with ``record``, each decision's valid actions and
    observation."""
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)

    env_id, cfg, requests = _setup(task, seed, overrides, split, resample)
    env = gym.make(env_id, config=cfg).unwrapped
    obs, _ = env.reset(seed=seed, options={"workload": requests})
    masks, observations, k = [], [], 0
    while True:
        if record:
            masks.append(np.flatnonzero(env.action_masks()).tolist())
            observations.append(np.asarray(obs, dtype=np.float64).tolist())
        action = deviation[1] if deviation is not None and k == deviation[0] else base
        obs, _, terminated, truncated, info = env.step(action)
        k += 1
        if terminated or truncated:
            env.close()
            return {"goodput": float(info["metrics"]["goodput_tok_s"]), "decisions": k, "masks": masks,
                    "observations": observations}


def _trial(args: tuple) -> tuple:
    logging.disable(logging.WARNING)
    task, seed, overrides, split, resample, base, k, action = args
    return seed, k, action, serve(task, seed, overrides, split, resample, base, (k, action))["goodput"]


def learnability(rows: list[dict], ridge: float) -> dict:
    """Leave-one-seed-out: per action a ridge fit (``ridge`` on standardised observations) of its
    gain (%) on the observation; on each held-out decision the action of highest predicted gain,
    the base where none is above 0. Returns the realised gains (%) and how often it deviated."""
    seeds = sorted({r["seed"] for r in rows})
    realised, deviated = [], 0
    for held in seeds:
        train = [r for r in rows if r["seed"] != held]
        x = np.array([r["observation"] for r in train])
        mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
        coef = {}
        for act in {a for r in train for a in r["gain_pct"]}:
            mine = [r for r in train if act in r["gain_pct"]]
            xa = np.c_[(np.array([r["observation"] for r in mine]) - mu) / sd, np.ones(len(mine))]
            y = np.array([r["gain_pct"][act] for r in mine])
            reg = ridge * np.eye(xa.shape[1])
            reg[-1, -1] = 0.0                               # the intercept is not shrunk
            coef[act] = np.linalg.solve(xa.T @ xa + reg, xa.T @ y)
        for r in (r for r in rows if r["seed"] == held):
            z = np.r_[(np.asarray(r["observation"]) - mu) / sd, 1.0]
            pred = {act: float(z @ coef[act]) for act in r["gain_pct"] if act in coef}
            best = max(pred, key=pred.get) if pred else None
            if best is not None and pred[best] > 0:
                realised.append(r["gain_pct"][best])
                deviated += 1
            else:
                realised.append(0.0)
    return {"realised": realised, "deviated": deviated}


RIDGES = (1.0, 10.0, 100.0, 1000.0)


def summarise(rows: list[dict]) -> dict:
    """Over the decisions of ``rows`` (``--out`` lines), each as ``(mean, 95% CI half-width)`` in %
    of the base: ``best`` (the clairvoyant best deviation), ``uniform`` (a deviation drawn
    uniformly) and ``fitted[ridge]`` (:func:`learnability`, with how many decisions it deviated at)."""
    from kvrl.analysis.stats import mean_ci

    tried = [r for r in rows if r["gain_pct"]]
    fitted = {}
    for ridge in RIDGES:
        out = learnability(rows, ridge)
        fitted[ridge] = (*mean_ci(out["realised"]), out["deviated"])
    return {"best": mean_ci([max(r["gain_pct"].values()) for r in tried]),
            "uniform": mean_ci([float(np.mean(list(r["gain_pct"].values()))) for r in tried]),
            "fitted": fitted}


def fit_report(paths: list[str]) -> None:
    """Print the learnability of the deviations in ``paths`` (``--out`` files of earlier runs)."""
    rows = [json.loads(line) for path in paths for line in open(path)]
    s = summarise(rows)
    print(f"{len(rows)} decisions, seeds {sorted({r['seed'] for r in rows})}")
    print("| policy at the drawn decisions | gain over the base, % (mean ± 95% CI) | deviates at |\n|---|---:|---:|")
    print(f"| clairvoyant best deviation | {s['best'][0]:+.2f} ± {s['best'][1]:.2f} | all |")
    print(f"| a deviation drawn uniformly | {s['uniform'][0]:+.2f} ± {s['uniform'][1]:.2f} | all |")
    for ridge, (m, ci, deviated) in s["fitted"].items():
        print(f"| fitted on the observation (ridge {ridge:g}), held out by seed | {m:+.2f} ± {ci:.2f} | "
              f"{deviated} of {len(rows)} |")


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="classes_preemption")
    p.add_argument("--split", default="val")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--resample", type=float, default=0.8)
    p.add_argument("--base", type=int, default=1, help="the base action (default 1: slot 0, swap)")
    p.add_argument("--decisions", type=int, default=24, help="decision points drawn per seed")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--fit", nargs="+", default=None, help="only report the learnability of these --out files")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the task (put the slot rules here)")
    a = p.parse_args()
    if a.fit:
        fit_report(a.fit)
        return
    logging.disable(logging.WARNING)
    seeds = [int(s) for s in a.seeds.split(",")]
    overrides = tuple(a.overrides)
    t0 = time.time()
    base = {s: serve(a.task, s, overrides, a.split, a.resample, a.base, record=True) for s in seeds}
    trials, points = [], {}
    for s in seeds:
        rng = np.random.default_rng(s)
        n = base[s]["decisions"]
        points[s] = sorted(rng.choice(n, size=min(a.decisions, n), replace=False).tolist())
        trials += [(a.task, s, overrides, a.split, a.resample, a.base, k, act)
                   for k in points[s] for act in base[s]["masks"][k] if act != a.base]
    print(f"# {a.task} {a.split} seeds {seeds}: base goodput {[round(base[s]['goodput'], 1) for s in seeds]}, "
          f"decisions {[base[s]['decisions'] for s in seeds]}; {len(trials)} deviation episodes", flush=True)
    scores: dict = {}
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        for seed, k, act, goodput in pool.map(_trial, trials, chunksize=1):
            scores.setdefault((seed, k), {})[act] = goodput
    from kvrl.analysis.stats import mean_ci

    best_gain, mean_gain = [], []
    for s in seeds:
        for k in points[s]:
            tried = scores.get((s, k), {})
            gains = {act: 100.0 * (g - base[s]["goodput"]) / base[s]["goodput"] for act, g in tried.items()}
            row = {"seed": s, "decision": k, "base_goodput": base[s]["goodput"], "goodput": tried,
                   "gain_pct": gains, "observation": base[s]["observations"][k]}
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if gains:
                best_gain.append(max(gains.values()))
                mean_gain.append(float(np.mean(list(gains.values()))))
    best, mean = np.array(best_gain), np.array(mean_gain)
    m_best, ci_best = mean_ci(best)
    m_mean, ci_mean = mean_ci(mean)
    print(f"\n{len(best)} decision points over seeds {seeds} ({time.time() - t0:.0f} s):")
    print(f"best deviation per decision: {m_best:+.3f}% ± {ci_best:.3f} (mean ± 95% CI); max {best.max():+.3f}%, "
          f"share with a gain > 0.1%: {np.mean(best > 0.1):.2f}, > 0.5%: {np.mean(best > 0.5):.2f}")
    print(f"mean deviation per decision: {m_mean:+.3f}% ± {ci_mean:.3f}")


if __name__ == "__main__":
    main()
