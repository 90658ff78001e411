"""A watermark agent found by direct policy search: the cross-entropy method with common random numbers.

Why this and not more TD learning: on the pressure tasks a good watermark policy differs from the
best constant by a few percent of goodput, while one training window's goodput varies by tens of
percent from the next (docs/rl.md, "What was tried"). DQN and PPO learn from per-window returns
and settle on a constant. Here every candidate policy of a generation serves the *same* training
windows (same arrivals, same load scale, same step-time perturbation: common random numbers), and
its fitness is its goodput relative to the base constant on each of those windows, so the
window-to-window variance cancels and a gain of a fraction of a percent is visible.

**The policy** is a linear score of the task's observation, rounded to a bin index:
``action = clip(round(theta . obs + b), 0, K - 1)``. It is exactly a linear Q-network
(``Q_k = k * (theta . obs + b) - k^2 / 2``, whose arg max is that rounding), so it is saved as an
SB3 DQN with ``net_arch=[]`` (``best_model.zip`` + ``agent.json``) and ``kvrl-eval`` and the
``agent`` plugin load it like any DQN agent. The search starts at the base constant (``theta = 0``,
``b`` = the base bin), or at a given linear policy (``--init``: a heuristic written as a score, so
the search refines the rule instead of rediscovering it), and keeps a diagonal Gaussian over
``(theta, b)``.

**The base** is a bin of the task (``--base``, the val-picked constant) or, on a task whose actions
hand the watermark to rules (``env.action.rules``), an action index (``--base-action``, e.g. 0 for
the val-tuned rule of ``throttle_planner``); the rounding then ranges over the rules in their order.

**Mixtures.** On a task with ``env.episode.workloads`` the training windows draw their family as
training does (``Session.episode``), so every candidate of a generation serves the same families,
loads and windows. Episodes start from an empty engine, as kvrl-eval's jobs do, and run to the
end: a candidate is scored as the policy it is, not as a deviation that another policy finishes.

**References.** By default a job's gain is over the base. With ``--references`` it is over the best
of the base and those actions (each held throughout) on that job: a window where the rule collapses
and one where it gains a little then weigh by how far a candidate is from the better answer there,
not by how far the rule fell, so a policy must be right in both to score.

**Selection.** After every generation the distribution's mean is served on the ``val`` split
(``--val-seeds`` seeded 80% resamples, as kvrl-eval's, with the cost model as is) beside the base
on the same jobs; with ``--val-families`` each seed's job is served on every family's val split (at
the family's own rate), with ``--val-loads`` at every load its training episodes draw (the task's
``episode.rate_scales``: a task whose val split runs at another load than its test split is then
not selected for val's load alone), and a seed's gain is the mean over those jobs. The mean with the best
paired val gain is saved (the start itself, the base or ``--init``'s policy, while no generation
beats it on val). Windows are served to completion (no time limit), so an episode is scored as
kvrl-eval scores a job: ``goodput_tok_s``.

    python scripts/rl_cem.py --task hinted --base 0.03 --generations 12 --seed 0 \\
        --out docs/results/agents/hinted-cem-seed0 [hydra overrides of the task ...]

Arguments after the options are Hydra overrides of the task's scenario, as in kvrl-train.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

import numpy as np

_ENVS: dict = {}          # in each worker: split -> env


def _make_env(task: str, overrides: list[str], split: str):
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.config import load_task

    extra = [] if split == "train" else [f"env.episode.split={split}", "env.episode.step_time_sigma=0.0"]
    env_id, cfg = load_task(task, [*overrides, *extra])
    return env_id, cfg, gym.make(env_id, config=cfg).unwrapped


def _init(task: str, overrides: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    for split in ("train", "val"):
        _ENVS[split] = _make_env(task, overrides, split)[2]


def act(params: np.ndarray, obs: np.ndarray, n_actions: int) -> int:
    """The linear-rounded policy's bin index for one observation (``params = (theta, b)``)."""
    return int(np.clip(np.rint(float(params[:-1] @ obs) + params[-1]), 0, n_actions - 1))


def serve(env, params: np.ndarray, requests, seed: int) -> float:
    """Goodput tok/s of ``requests`` served to completion under ``params``'s policy."""
    obs, _ = env.reset(seed=seed, options={"workload": requests})
    while True:
        obs, _, terminated, truncated, info = env.step(act(params, obs, env.action_space.n))
        if terminated or truncated:
            return float(info["metrics"]["goodput_tok_s"])


def _train_window(window_seed: int):
    env = _ENVS["train"]
    requests, _ = env.session.episode(np.random.default_rng(window_seed), None)
    return list(requests)


# A val cell: (family of episode.workloads or None, absolute rate scale or None: the family's own, its
# position among the training loads or None).
ValCell = tuple[Optional[int], Optional[float], Optional[int]]


def _family_workload(session, family: Optional[int]) -> dict:
    """The workload config of ``episode.workloads``' family ``family`` (None: the scenario's own)."""
    from omegaconf import OmegaConf

    if family is None:
        return OmegaConf.to_container(session.run.workload, resolve=True)
    return dict(session.families[family])


def val_cells(session, families: list[Optional[int]], loads: bool) -> list[ValCell]:
    """The (family, rate scale) cells every val seed is served on: each family at its own rate, or with
    ``loads`` at each rate scale its training episodes draw (``episode.rate_scales``), as kvrl-train
    validates a task "at every training load"."""
    from kvrl.envs.config import episode_rate_scales

    if not loads:
        return [(f, None, None) for f in families]
    cells = []
    for f in families:
        rates = episode_rate_scales(session.config, _family_workload(session, f))
        if rates is None:
            raise SystemExit("--val-loads: the task has no env.episode.rate_scales")
        cells += [(f, r, i) for i, r in enumerate(rates)]
    return cells


def val_workload(session, seed: int, resample: float, cell: ValCell) -> dict:
    """kvrl-eval's val job of ``seed`` (the same resample of the split) on ``cell``'s family, at the
    cell's rate scale when it has one (else the family's own)."""
    from kvrl.apps.eval import job_workload

    family, rate_scale, _ = cell
    workload = _family_workload(session, family)
    if rate_scale is not None:
        workload["rate_scale"] = rate_scale
    return job_workload(workload, "val", seed, resample)


def _score(task: tuple) -> float:
    """One (params, split, job seed, resample, val cell) of a generation: the job's goodput tok/s."""
    params, split, seed, resample, cell = task
    env = _ENVS[split]
    requests = _train_window(seed) if split == "train" else val_workload(env.session, seed, resample, cell)
    return serve(env, np.asarray(params), requests, seed)


def val_tasks(params: np.ndarray, seeds: list[int], resample: float, cells: list[ValCell]) -> list[tuple]:
    """The val jobs of one policy: every seed on every cell (seed-major)."""
    return [(params, "val", s, resample, c) for s in seeds for c in cells]


def val_gain_per_seed(scores: np.ndarray, base: np.ndarray, n_cells: int) -> np.ndarray:
    """Per val seed, the mean over its cells' jobs of the paired gain over the base (%)."""
    return _paired_gain(scores, base).reshape(-1, n_cells).mean(axis=1)


def gain_by(cells: list[ValCell], per_cell: np.ndarray, index: int) -> list[float]:
    """``per_cell`` gains (one per cell) averaged over the cells sharing a family (``index`` 0) or a
    training load (2: the same position among each family's rate scales), in first-seen order."""
    keys = list(dict.fromkeys(c[index] for c in cells))
    return [float(np.mean([g for c, g in zip(cells, per_cell) if c[index] == k])) for k in keys]


def _paired_gain(scores: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Per job, the gain over the base in % of the base's goodput."""
    return 100.0 * (scores - base) / np.maximum(base, 1e-9)


def save_agent(out: str, params: np.ndarray, task: str, overrides: list[str], summary: dict) -> None:
    """``params``'s policy as an SB3 DQN with a linear Q-network (see the module docs)."""
    import torch
    from stable_baselines3 import DQN

    from kvrl.envs.agent_io import write_meta

    env_id, cfg, env = _make_env(task, overrides, "train")
    k = env.action_space.n
    model = DQN("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": []})
    linear = [m for m in model.q_net.q_net if isinstance(m, torch.nn.Linear)]
    assert len(linear) == 1, "net_arch=[] gives one linear layer"
    idx = torch.arange(k, dtype=torch.float32)
    with torch.no_grad():
        linear[0].weight.copy_(idx[:, None] * torch.as_tensor(params[:-1], dtype=torch.float32)[None, :])
        linear[0].bias.copy_(idx * float(params[-1]) - idx ** 2 / 2)
    model.q_net_target.load_state_dict(model.q_net.state_dict())
    os.makedirs(out, exist_ok=True)
    model.save(os.path.join(out, "best_model.zip"))
    write_meta(out, "dqn", env_id, cfg)
    with open(os.path.join(out, "cem.json"), "w") as f:
        json.dump(summary, f, indent=2)


def constant_policy(n_obs: int, action: int, n_actions: int) -> np.ndarray:
    """The linear-rounded policy that always takes ``action`` (zero weights, the action as the bias)."""
    if not 0 <= action < n_actions:
        raise SystemExit(f"--references: {action} is not an action of the task (0..{n_actions - 1})")
    params = np.zeros(n_obs + 1)
    params[-1] = action
    return params


def base_action(actions, base: Optional[float], index: Optional[int]) -> int:
    """The base's action index: ``base``'s position among the task's bins, or ``index`` itself.
    A task whose actions are rules takes ``index`` only (its bins are not its actions)."""
    n = actions.space.n
    if actions.rules is not None:
        if index is None:
            raise SystemExit(f"the task's actions are rules {actions.rules}: give --base-action (0..{n - 1})")
    elif index is None:
        bins = [float(b) for b in actions.config.bins]
        if base not in bins:
            raise SystemExit(f"--base {base} is not one of the task's bins {bins}")
        return bins.index(base)
    if not 0 <= index < n:
        raise SystemExit(f"--base-action {index} is not an action of the task (0..{n - 1})")
    return index


def parse_init(text: str, names: list[str], free: np.ndarray) -> np.ndarray:
    """The starting ``(theta, b)`` from ``name=weight,...,bias=b`` (observation names; a name not
    given starts at 0); a weight on a feature outside ``--features`` is an error."""
    params = np.zeros(len(names) + 1)
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise SystemExit(f"--init: {item!r} is not name=value")
        if name == "bias":
            params[-1] = float(value)
        elif name not in names:
            raise SystemExit(f"--init: {name!r} is not among the task's observation {names}")
        elif not free[names.index(name)]:
            raise SystemExit(f"--init: {name!r} is not among --features")
        else:
            params[names.index(name)] = float(value)
    return params


def train(args) -> None:
    _, _, env = _make_env(args.task, args.overrides, "train")
    k, n_obs = env.action_space.n, env.observation_space.shape[0]
    base_index = base_action(env.actions, args.base, args.base_action)
    families: list[Optional[int]] = [None]
    if args.val_families:
        if env.session.config.episode.workloads is None:
            raise SystemExit("--val-families: the task has no env.episode.workloads")
        families = list(range(len(env.session.families)))
    cells = val_cells(env.session, families, args.val_loads)
    from kvrl.envs.features import engine_feature_names
    names = list(engine_feature_names(env.features))
    chosen = names if args.features is None else args.features.split(",")
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise SystemExit(f"--features: {unknown} are not among the task's observation {names}")
    free = np.array([n in chosen for n in names] + [True])       # searched weights (+ the bias); others stay 0
    base = np.zeros(n_obs + 1)
    base[-1] = base_index
    start = base if args.init is None else parse_init(args.init, names, free)
    rng = np.random.default_rng(args.seed)
    mean, std = start.copy(), np.full(n_obs + 1, args.init_std)
    std[-1] = args.init_std_bias
    std[~free] = 0.0
    val_seeds = [int(s) for s in args.val_seeds.split(",")]
    history = []
    t0 = time.time()
    refs = [base] + [constant_policy(n_obs, a, k) for a in args.references]
    with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(args.task, args.overrides)) as pool:
        val_refs = np.asarray([list(pool.map(_score, val_tasks(r, val_seeds, args.resample, cells))) for r in refs])
        val_ref = val_refs.max(axis=0)                          # per val job, the best reference's goodput
        val_start = val_refs[0] if args.init is None else \
            np.asarray(list(pool.map(_score, val_tasks(start, val_seeds, args.resample, cells))))
        start_gain = float(val_gain_per_seed(val_start, val_ref, len(cells)).mean())
        print(json.dumps({"generation": -1, "start": args.init or "base", "val_gain_pct": round(start_gain, 3)}),
              flush=True)
        best = {"val_gain_pct": start_gain, "params": start.tolist(), "generation": -1}   # replaced only if beaten
        for gen in range(args.generations):
            windows = rng.integers(2**31, size=args.windows).tolist()
            cands = [mean + std * rng.standard_normal(n_obs + 1) for _ in range(args.population)]
            cands[0] = mean.copy()                                  # the mean itself is scored too
            tasks = [(p, "train", w, None, None) for p in [*refs, *cands] for w in windows]
            scores = np.asarray(list(pool.map(_score, tasks, chunksize=1))).reshape(len(refs) + len(cands), len(windows))
            fitness = _paired_gain(scores[len(refs):], scores[:len(refs)].max(axis=0)).mean(axis=1)
            elite = np.argsort(fitness)[::-1][:args.elite]
            mean = np.mean([cands[i] for i in elite], axis=0)
            std = np.maximum(np.std([cands[i] for i in elite], axis=0) * args.smoothing
                             + std * (1 - args.smoothing), args.min_std) * free
            val = np.asarray(list(pool.map(_score, val_tasks(mean, val_seeds, args.resample, cells))))
            val_gain = val_gain_per_seed(val, val_ref, len(cells))
            per_cell = _paired_gain(val, val_ref).reshape(-1, len(cells)).mean(axis=0)
            row = {"generation": gen, "train_fitness_best": round(float(fitness.max()), 3),
                   "train_fitness_mean_policy": round(float(fitness[0]), 3),
                   "train_fitness_elite_mean": round(float(fitness[elite].mean()), 3),
                   "val_gain_pct": round(float(val_gain.mean()), 3),
                   "val_gain_per_seed": [round(float(g), 2) for g in val_gain],
                   "val_gain_per_family": [round(g, 2) for g in gain_by(cells, per_cell, 0)],
                   **({"val_gain_per_load": [round(g, 2) for g in gain_by(cells, per_cell, 2)]} if args.val_loads else {}),
                   "std_mean": round(float(std.mean()), 4), "wall_s": round(time.time() - t0, 1)}
            history.append(row)
            print(json.dumps(row), flush=True)
            if val_gain.mean() > best["val_gain_pct"]:
                best = {"val_gain_pct": float(val_gain.mean()), "params": mean.tolist(), "generation": gen}
            summary = {"best": best, "history": history, "val_cells": cells, "val_reference_goodput": val_refs.tolist(), "features": chosen,
                       "args": {k_: v for k_, v in vars(args).items() if k_ != "func"}}
            save_agent(args.out, np.asarray(best["params"]), args.task, args.overrides, summary)  # kept if cut off
            if args.max_wall_s is not None and time.time() - t0 > args.max_wall_s:
                break
    print(json.dumps({"out": args.out, "best_generation": best["generation"],
                      "best_val_gain_pct": round(best["val_gain_pct"], 3)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", required=True)
    base = ap.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", type=float, help="the val-picked constant (a bin of the task)")
    base.add_argument("--base-action", type=int, help="the base as an action index (tasks whose actions are rules)")
    ap.add_argument("--references", type=lambda t: [int(a) for a in t.split(",")], default=[],
                    help="more reference actions (indices, each held throughout): a job's gain is measured against "
                    "the best of the base and these on that job, in training and on val (e.g. 0,1 on "
                    "throttle_planner: the rule or never throttling, whichever serves the window better)")
    ap.add_argument("--val-families", action="store_true", help="select on every family of env.episode.workloads "
                    "(each val seed's gain is the mean over the families' val splits)")
    ap.add_argument("--val-loads", action="store_true", help="serve each val job at every rate scale the "
                    "training episodes draw (env.episode.rate_scales), not only at the family's own rate")
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--population", type=int, default=24)
    ap.add_argument("--elite", type=int, default=6)
    ap.add_argument("--windows", type=int, default=6, help="training windows per generation (shared by all candidates)")
    ap.add_argument("--init-std", type=float, default=1.0, help="initial std of theta (bins per unit of a feature)")
    ap.add_argument("--init-std-bias", type=float, default=1.0)
    ap.add_argument("--min-std", type=float, default=0.05)
    ap.add_argument("--smoothing", type=float, default=0.7)
    ap.add_argument("--val-seeds", default="0,1,2,3,4")
    ap.add_argument("--resample", type=float, default=0.8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", default=None, help="comma-separated observation names the score may weigh "
                    "(default: all)")
    ap.add_argument("--init", default=None, help="start the search at this linear policy instead of the base "
                    "constant: name=weight,...,bias=b (bins; e.g. a rule written as a score); kept unless a "
                    "generation beats it on val")
    ap.add_argument("--max-wall-s", type=float, default=None, help="stop after the generation that passes this")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    train(ap.parse_args())


if __name__ == "__main__":
    main()
