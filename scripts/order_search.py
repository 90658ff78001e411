"""Learn the ``scored`` admission order's weights (kvrl/plugins/scored.py) by the cross-entropy method.

The learned policy is a scheduler, not a watermark agent: a weight per feature of a waiting request (its cached
prefix, the tokens it still has to prefill, its predicted output, how long it waited against its TTFT objective,
whether it is already past it). Only the weights' direction matters to the order, so every candidate is scaled to
unit length. Each generation draws ``--population`` candidates around the mean (the mean itself among them) and
serves every one on the *same* ``--windows`` training windows of the task (its training split, its training loads
and step-time perturbation, as kvrl-train draws them: common random numbers), beside the base order (``lpm``, the
defaults of ``scored``) on each; a candidate's fitness is its mean paired goodput gain over the base in % of the
base's. The elite's mean and spread become the next distribution. After every generation the mean is served on
kvrl-eval's val jobs (``--val-seeds``, 80% resamples) beside the base, and the mean with the best paired val gain
is kept (the start itself, ``lpm`` or ``--init``'s weights, while no generation beats it on val). The watermark is
held at ``--fraction``.

    python scripts/order_search.py --task tenants --seed 0 --generations 10 --workers 2 \\
        --out docs/results/agents/tenants-scored-seed0

writes ``scheduler.json`` (the learned scheduler as a plugin config: ``kvrl-eval scheduler=scored
scheduler.cached=...``; ``--overrides`` prints those overrides) and ``search.json`` (every generation). Arguments
after the options are Hydra overrides of the task's scenario.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

FEATURES = ("cached", "prefill", "output", "wait", "late")     # kvrl.plugins.scored.FEATURES (not imported here:
BASE = np.array([1.0, 0.0, 0.0, 0.0, 0.0])                       # workers import kvrl after setting their threads)

_W: dict = {}           # in each worker: the task's train env (its session draws the windows) and job configs


def scheduler_config(weights, length_key: str = "none") -> dict:
    """The ``scored`` scheduler of ``weights`` (in :data:`FEATURES` order) as a plugin config."""
    return {"name": "scored", **{f: round(float(w), 6) for f, w in zip(FEATURES, weights)}, "length_key": length_key}


def overrides_of(config: dict) -> list[str]:
    """Hydra overrides that set the scheduler ``config``."""
    return [f"scheduler={config['name']}", *(f"scheduler.{k}={v}" for k, v in config.items() if k != "name")]


def _init(task: str, overrides: list[str], fraction: float) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    logging.disable(logging.WARNING)
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.apps.eval import Job, Policy, job_config
    from kvrl.envs.config import load_task

    env_id, cfg = load_task(task, [*overrides, "scheduler=scored"])
    _W["env"] = gym.make(env_id, config=cfg).unwrapped
    _W["run"] = job_config(dict(cfg.run), "watermark", Job(Policy("fixed", "heuristic",
                                                                   {"name": "fixed", "fraction": fraction}), "val", 0), None)


def _serve(job: tuple) -> float:
    """One (weights, length key, split, seed) job: its goodput tok/s. ``train``: the training window drawn from
    ``seed`` (its requests and load as the env draws them, a step-time factor from the env's distribution); ``val``:
    kvrl-eval's val job of ``seed``."""
    import copy

    from omegaconf import OmegaConf

    from kvrl.apps.eval import job_workload
    from kvrl.builder import build_engine
    from kvrl.engine.loop import ServingLoop
    from kvrl.envs.session import cached_workload

    weights, length_key, split, seed = job
    cfg = copy.deepcopy(_W["run"])
    cfg["scheduler"] = scheduler_config(weights, length_key)
    factor = 1.0
    if split == "train":
        session = _W["env"].session
        rng = np.random.default_rng(seed)
        requests, _ = session.episode(rng, None)
        sigma = session.config.episode.step_time_sigma
        factor = float(np.exp(rng.normal(0.0, sigma))) if sigma > 0 else 1.0
        engine = build_engine(OmegaConf.create(cfg))
    else:
        cfg["workload"] = job_workload(cfg["workload"], "val", seed, 0.8)
        cfg["seed"] = seed
        engine = build_engine(OmegaConf.create(cfg))
        requests = cached_workload(cfg["workload"], engine.executor.vocab_size, engine.config.max_model_len)
    if factor != 1.0:
        engine.executor.step_time_scale = engine.executor.base_step_time_scale * factor
    loop = ServingLoop(engine, list(requests))
    while not loop.done:
        loop.step()
    return float(engine.metrics.summary()["goodput_tok_s"])


def _gain_pct(scores: np.ndarray, base: np.ndarray) -> np.ndarray:
    return 100.0 * (scores - base) / np.maximum(base, 1e-9)


def _unit(w: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(w))
    return w / n if n > 0 else BASE.copy()


def search(args) -> dict:
    rng = np.random.default_rng(args.seed)
    start = BASE.copy() if args.init is None else _unit(np.array([float(x) for x in args.init.split(",")]))
    mean, std = start.copy(), np.full(len(FEATURES), args.init_std)
    val_seeds = [int(s) for s in args.val_seeds.split(",")]
    history, t0 = [], time.time()
    with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(args.task, args.overrides, args.fraction)) as pool:
        def serve(weights_list, split, seeds):
            jobs = [(w, args.length_key, split, s) for w in weights_list for s in seeds]
            return np.asarray(list(pool.map(_serve, jobs, chunksize=1))).reshape(len(weights_list), len(seeds))

        val_base = serve([BASE], "val", val_seeds)[0]
        start_gain = 0.0 if args.init is None else float(_gain_pct(serve([start], "val", val_seeds)[0], val_base).mean())
        best = {"val_gain_pct": start_gain, "weights": start.tolist(), "generation": -1}   # replaced only if beaten
        for gen in range(args.generations):
            windows = rng.integers(2**31, size=args.windows).tolist()
            cands = [mean.copy()] + [_unit(mean + std * rng.standard_normal(len(FEATURES)))
                                     for _ in range(args.population - 1)]
            scores = serve([BASE, *cands], "train", windows)
            fitness = _gain_pct(scores[1:], scores[0]).mean(axis=1)
            elite = np.argsort(fitness)[::-1][:args.elite]
            mean = _unit(np.mean([cands[i] for i in elite], axis=0))
            std = np.maximum(args.smoothing * np.std([cands[i] for i in elite], axis=0)
                             + (1 - args.smoothing) * std, args.min_std)
            val = serve([mean], "val", val_seeds)[0]
            val_gain = _gain_pct(val, val_base)
            row = {"generation": gen, "train_fitness_best": round(float(fitness.max()), 3),
                   "train_fitness_mean_policy": round(float(fitness[0]), 3),
                   "val_gain_pct": round(float(val_gain.mean()), 3),
                   "val_gain_per_seed": [round(float(g), 2) for g in val_gain],
                   "mean": [round(float(x), 4) for x in mean], "std": [round(float(x), 4) for x in std],
                   "wall_s": round(time.time() - t0, 1)}
            history.append(row)
            print(json.dumps(row), flush=True)
            if val_gain.mean() > best["val_gain_pct"]:
                best = {"val_gain_pct": float(val_gain.mean()), "weights": mean.tolist(), "generation": gen}
            _save(args, best, history, val_base, start_gain)     # kept if the run is cut off
            if args.max_wall_s is not None and time.time() - t0 > args.max_wall_s:
                break
    return best


def _save(args, best: dict, history: list, val_base: np.ndarray, start_gain: float) -> None:
    os.makedirs(args.out, exist_ok=True)
    config = scheduler_config(best["weights"], args.length_key)
    with open(os.path.join(args.out, "scheduler.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(args.out, "search.json"), "w") as f:
        json.dump({"best": best, "start_val_gain_pct": start_gain, "scheduler": config, "overrides": overrides_of(config), "history": history,
                   "val_base_goodput": val_base.tolist(), "features": list(FEATURES),
                   "args": vars(args)}, f, indent=1)


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="tenants")
    p.add_argument("--fraction", type=float, default=0.01, help="the fixed watermark every job holds")
    p.add_argument("--seed", type=int, default=0, help="the search's seed (windows and candidates)")
    p.add_argument("--generations", type=int, default=10)
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--elite", type=int, default=4)
    p.add_argument("--windows", type=int, default=8, help="training windows per generation (shared by its candidates)")
    p.add_argument("--init", default=None, metavar="W1,...,W5",
                   help="start the search at these weights (FEATURES order; e.g. a hand-written order) instead of lpm's")
    p.add_argument("--init_std", type=float, default=0.5)
    p.add_argument("--min_std", type=float, default=0.05)
    p.add_argument("--smoothing", type=float, default=0.7, help="weight of the elite's spread in the next std")
    p.add_argument("--length_key", default="none", choices=["none", "tenant"])
    p.add_argument("--val_seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--max_wall_s", type=float, default=None, help="stop after the generation that passes this wall time")
    p.add_argument("--out", default=None, help="the learned scheduler's directory")
    p.add_argument("--overrides_of", default=None, metavar="DIR", help="print a learned scheduler's Hydra overrides and exit")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the task's scenario")
    a = p.parse_args()
    if a.overrides_of:
        with open(os.path.join(a.overrides_of, "scheduler.json")) as f:
            print(" ".join(overrides_of(json.load(f))))
        return
    if a.out is None:
        p.error("--out is required")
    best = search(a)
    print(json.dumps({"out": a.out, "best_generation": best["generation"], "best_val_gain_pct": round(best["val_gain_pct"], 3),
                      "weights": [round(w, 4) for w in best["weights"]]}))


if __name__ == "__main__":
    main()
