"""Headroom of an adaptive watermark: a clairvoyant rollout planner on kvrl-eval's own test jobs.

At every decision epoch the planner copies the whole simulated serving state, serves the rest of
the job once per candidate watermark (that watermark for ``--hold`` epochs, then the base
constant to the end) and keeps the candidate whose finished job has the best goodput. It sees the
future (arrivals and output lengths are in the copied state), so it is an upper reference, not a
policy: by the rollout argument it is never worse than its base constant on a deterministic job,
and what it gains over the best constant bounds what any adaptive watermark can gain there.

    python scripts/rl_rollout_oracle.py --task pressure --base 0.03 --seeds 0,1,2 --workers 2
    python scripts/rl_rollout_oracle.py --grid conf/rl_headroom.yaml --split val --workers 16

``--grid``: a YAML list of scenarios (``name``, ``task``, ``overrides``, optional ``base``): every
scenario x seed is one job, and the summary is per scenario (the base is then the best constant of
the scenario on the seeds, chosen per job from the constants it ran first).

Jobs are kvrl-eval's: the task's test split, ``resample`` share per seed, ``seed=<s>``; the
constant rows come from the same env and are checked against ``kvrl.apps.eval.run_job``.
Prints one JSON line per job and a paired summary (kvrl.analysis.stats).
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from kvrl.envs.rollout import finish as _finish   # actions here are fractions (to_fraction passes them through)


def _env(task: str, seed: int, overrides: list[str]):
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.config import load_task

    args = [f"seed={seed}", "env.episode.step_time_sigma=0.0", "env.episode.rate_scales=null",
            "engine.prefix_hash=xxh3", *overrides]      # xxh3: a keyed blake2b state cannot be deep-copied
    env_id, cfg = load_task(task, args)
    return gym.make(env_id, config=cfg).unwrapped, cfg


def job_requests(cfg, split: str, seed: int, resample: float):
    """The requests of kvrl-eval's job on ``split`` at ``seed`` (``job_config``: the seeded
    ``resample`` share) for the task config ``cfg``, and that job's run config. Also used by
    scripts/rl_victim_deviation.py."""
    from omegaconf import OmegaConf

    from kvrl.apps.eval import Job, Policy, job_config
    from kvrl.builder import build_executor
    from kvrl.envs.session import cached_workload

    run = copy.deepcopy(dict(cfg.run))
    job = job_config(run, "watermark", Job(Policy("x", "x", {"name": "fixed", "fraction": 0.01}), split, seed), resample)
    env_run = job["workload"]
    ex = build_executor(OmegaConf.create(job))
    return list(cached_workload(env_run, ex.vocab_size, job["engine"].get("max_model_len") or ex.max_model_len)), job


def run_jobs(fn, jobs: list, workers: int, out=None) -> list[dict]:
    """``fn`` over ``jobs`` in ``workers`` processes; each result printed as one JSON line as it
    comes (and appended to ``out``); returns the results in the order they finished. Also used by
    scripts/rl_rule_headroom.py."""
    results = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for future in as_completed([pool.submit(fn, job) for job in jobs]):
            r = future.result()
            results.append(r)
            print(json.dumps(r), flush=True)
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    return results


def _constant(task, seed, overrides, split, resample, fraction) -> float:
    env, cfg = _env(task, seed, overrides + [f"watermark.fraction={fraction}"])
    requests, _ = job_requests(cfg, split, seed, resample)
    env.actions.to_fraction = lambda a, clip=False: (float(a), False)
    env.reset(seed=seed, options={"workload": requests})
    return _finish(env, fraction)


def _oracle(task, seed, overrides, split, resample, base, candidates, hold) -> dict:
    """The rollout planner's job: goodput tok/s and the watermark it held at every epoch."""
    env, cfg = _env(task, seed, overrides + [f"watermark.fraction={base}"])
    requests, _ = job_requests(cfg, split, seed, resample)
    env.actions.to_fraction = lambda a, clip=False: (float(a), False)
    env.reset(seed=seed, options={"workload": requests})
    chosen, done = [], False
    while not done:
        scores = {}
        for cand in candidates:
            trial = copy.deepcopy(env)
            ended = False
            for _ in range(hold):
                _, _, term, trunc, info = trial.step(cand)
                if term or trunc:
                    ended = True
                    scores[cand] = float(info["metrics"]["goodput_tok_s"])
                    break
            if not ended:
                scores[cand] = _finish(trial, base)
        best = max(candidates, key=lambda c: (scores[c], c == base))
        for _ in range(hold):
            _, _, term, trunc, info = env.step(best)
            chosen.append(best)
            if term or trunc:
                done = True
                final = float(info["metrics"]["goodput_tok_s"])
                break
    return {"goodput": final, "actions": chosen}


def _job(args_tuple):
    name, task, seed, overrides, split, resample, base, candidates, hold, constants = args_tuple
    logging.disable(logging.WARNING)
    t = time.process_time()
    out = {"scenario": name, "task": task, "seed": seed, "overrides": overrides,
           "constants": {str(c): _constant(task, seed, overrides, split, resample, c) for c in constants}}
    if base is None:                   # this job's best constant
        base = float(max(out["constants"], key=out["constants"].get))
    out["base"] = base
    out["oracle"] = _oracle(task, seed, overrides, split, resample, base, candidates, hold)
    out["cpu_s"] = time.process_time() - t
    return out


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="pressure")
    p.add_argument("--split", default="test")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--resample", type=float, default=0.8)
    p.add_argument("--base", type=float, default=None, help="the rollouts' constant (default: the job's best)")
    p.add_argument("--grid", default=None, help="a YAML list of scenarios {name, task, overrides[, base]}")
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--candidates", default="0.0,0.01,0.03,0.05,0.1,0.2")
    p.add_argument("--constants", default="0.0,0.01,0.03,0.05,0.1,0.2")
    p.add_argument("--hold", type=int, default=4, help="epochs a chosen watermark is held")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    cands = [float(c) for c in a.candidates.split(",")]
    consts = [float(c) for c in a.constants.split(",")]
    if a.grid:
        import yaml

        scenarios = yaml.safe_load(open(a.grid))
    else:
        scenarios = [{"name": a.task, "task": a.task, "overrides": list(a.overrides), "base": a.base}]
    jobs = [(sc["name"], sc["task"], s, list(sc.get("overrides", [])), a.split, a.resample, sc.get("base", a.base),
             cands, a.hold, consts) for sc in scenarios for s in seeds]
    results = run_jobs(_job, jobs, a.workers, a.out)
    from kvrl.analysis.stats import paired_compare

    for sc in scenarios:
        mine = [r for r in results if r["scenario"] == sc["name"]]
        oracle = {r["seed"]: r["oracle"]["goodput"] for r in mine}
        means = {c: sum(r["constants"][str(c)] for r in mine) / len(mine) for c in consts}
        best = max(means, key=means.get)
        print(f"\n## {sc['name']} ({sc['task']} {sc.get('overrides', [])}): oracle {sum(oracle.values()) / len(oracle):.1f} goodput tok/s")
        for c in consts:
            fixed = {r["seed"]: r["constants"][str(c)] for r in mine}
            cmp = paired_compare(oracle, fixed, "goodput_tok_s")
            print(f"fixed {c}{' (best)' if c == best else ''}: {means[c]:.1f}; oracle - fixed = {cmp.delta:+.1f} "
                  f"± {cmp.delta_ci:.1f} ({cmp.pct_change:+.1f}%, p {cmp.p_value:.3g})")


if __name__ == "__main__":
    main()
