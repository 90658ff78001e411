"""Headroom of an adaptive admission order (issue 17): a clairvoyant rollout planner over schedulers.

Session 54 found the admission order a lever of about 30% on the multi-tenant task (``lpm`` over ``fcfs``) and
the best order per run, chosen with hindsight, a few percent over ``lpm`` (docs/rl.md, "The admission order").
Could an order that changes *during* a run do more? This planner serves kvrl-eval's own test job under the
``switch`` scheduler (kvrl/plugins/orders.py) holding the base order (``--orders``' first, ``lpm``) at the
fixed watermark ``--fraction``; every ``--epoch`` seconds of engine time it copies the whole serving state and
serves the rest of the job once per order, that order held for ``--hold`` seconds and then the base, and keeps
the order whose finished job has the best goodput. The copies hold the future (arrivals, output lengths), so
it bounds what any adaptive order can gain over the base; with the base among the candidates it is never
worse than the base on a deterministic sim job. ``--present`` and ``--blind`` take the foresight away: the
copies then hold no future arrivals, and output lengths guessed from the finished requests (``--samples``
guesses averaged), so the planner sees what a server sees and is a policy a server could run.

    python scripts/rl_order_headroom.py --task tenants --seeds 0,...,9 --workers 2 --out OUT.jsonl
    python scripts/rl_order_headroom.py --table OUT.jsonl
    python scripts/rl_order_headroom.py --task tenants --split val --serve \\
        lpm='scheduler=lpm' bandit='scheduler=order_bandit scheduler.epoch_s=1.0' ...

``--serve`` only serves each named scheduler configuration on the jobs (e.g. the ``order_bandit``'s
settings on the val split, to pick one) and prints the mean goodput of each. Jobs are kvrl-eval's (the task's
split, ``--resample`` share per seed, ``seed=<s>``): the base's goodput equals kvrl-eval's row for ``lpm``
at that constant (``--check`` compares with a kvrl-eval results.csv).
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time

from rl_rule_headroom import build_loop, check_against, serve_until   # scripts/ is on sys.path as a script


def switch_loop(task: str, orders: list[str], fraction: float, split: str, seed: int, resample: float,
                extra: list[str] = ()):
    """kvrl-eval's job on ``split`` at ``seed`` at the fixed watermark ``fraction``, served by a ``switch``
    scheduler over ``orders`` holding the first, as a serving loop not yet run."""
    overrides = ["scheduler=switch", f"scheduler.orders=[{','.join(orders)}]", "scheduler.choice=0", *extra]
    return build_loop(task, overrides, {"name": "fixed", "fraction": fraction}, split, seed, resample)


def finish_base(loop) -> float:
    """Serve ``loop`` to the end in the base order (``orders[0]``); the job's goodput tok/s."""
    loop.engine.scheduler.set_order(0)
    while not loop.done:
        loop.step()
    return float(loop.engine.metrics.summary()["goodput_tok_s"])


def plan(loop, epoch_s: float, hold_s: float, present: bool = False, blind_seed: int | None = None,
         samples: int = 1) -> tuple[float, list[int]]:
    """The rollout planner on ``loop`` (a :func:`switch_loop`): its goodput and the order index chosen at
    every decision (ties: the base). ``present``: the copies hold no request still to arrive (the planner
    ranks the orders on the work already there, as a server could); ``blind_seed`` set: the copies hold
    output lengths guessed from the finished requests (:func:`~kvrl.envs.guess.guessed_lengths`), not the
    true ones, ``samples`` guesses per decision (the same for every order) whose goodputs are averaged."""
    import numpy as np

    from kvrl.envs.guess import guessed_lengths, set_lengths

    rng = np.random.default_rng(blind_seed)
    orders = range(len(loop.engine.scheduler.schedulers))
    chosen = []
    while not loop.done:
        now = loop.engine.now
        scores = dict.fromkeys(orders, 0.0)
        for _ in range(samples if blind_seed is not None else 1):
            lengths = guessed_lengths(loop, [], rng)[0] if blind_seed is not None else None
            for i in orders:
                trial = copy.deepcopy(loop)
                if present:
                    trial.pending = trial.pending[:trial.next_index]
                if lengths is not None:
                    set_lengths(trial.engine, lengths)
                trial.engine.scheduler.set_order(i)
                serve_until(trial, now + hold_s)
                scores[i] += finish_base(trial)
        best = max(orders, key=lambda i: (scores[i], i == 0))
        chosen.append(best)
        loop.engine.scheduler.set_order(best)
        serve_until(loop, now + hold_s)
        loop.engine.scheduler.set_order(0)
        serve_until(loop, now + max(epoch_s, hold_s))
    return float(loop.engine.metrics.summary()["goodput_tok_s"]), chosen


def _job(args: tuple) -> dict:
    task, orders, fraction, split, seed, resample, epoch_s, hold_s, extra, present, blind, samples = args
    logging.disable(logging.WARNING)
    t = time.process_time()
    base = finish_base(switch_loop(task, orders, fraction, split, seed, resample, extra))
    goodput, chosen = plan(switch_loop(task, orders, fraction, split, seed, resample, extra), epoch_s, hold_s, present,
                           seed if blind else None, samples)
    return {"task": task, "seed": seed, "split": split, "orders": orders, "fraction": fraction, "epoch_s": epoch_s,
            "hold_s": hold_s, "extra": list(extra), "present": present, "blind": blind, "samples": samples,
            "rule": {"name": orders[0]}, "rule_goodput": base,
            "planner_goodput": goodput, "chosen": chosen, "cpu_s": time.process_time() - t}


def _serve(args: tuple) -> dict:
    task, name, overrides, fraction, split, seed, resample = args
    from rl_rule_headroom import finish

    logging.disable(logging.WARNING)
    loop = build_loop(task, overrides, {"name": "fixed", "fraction": fraction}, split, seed, resample)
    return {"name": name, "seed": seed, "goodput": finish(loop)}


def serve_config(text: str) -> tuple[str, list[str], float]:
    """``NAME=OVERRIDES`` of ``--serve`` as ``(name, task overrides, watermark)``: the overrides are
    space-separated, and a ``fraction=F`` among them is the job's fixed watermark (default 0.01)."""
    name, _, spec = text.partition("=")
    overrides = spec.split()
    fraction = [float(o.split("=", 1)[1]) for o in overrides if o.startswith("fraction=")]
    return name, [o for o in overrides if not o.startswith("fraction=")], fraction[-1] if fraction else 0.01


def summary(results: list[dict]) -> str:
    """The planner against its base order, paired over the jobs' seeds, in one line."""
    from kvrl.analysis.stats import paired_compare

    planner = {r["seed"]: r["planner_goodput"] for r in results}
    base = {r["seed"]: r["rule_goodput"] for r in results}
    c = paired_compare(planner, base, "goodput_tok_s")
    moved = sum(i != 0 for r in results for i in r["chosen"]) / max(sum(len(r["chosen"]) for r in results), 1)
    return (f"{results[0]['orders'][0]} {sum(base.values()) / len(base):,.1f}, planner "
            f"{sum(planner.values()) / len(planner):,.1f} goodput tok/s over {len(results)} seeds; planner - base = "
            f"{c.delta:+.1f} ± {c.delta_ci:.1f} tok/s ({c.pct_change:+.1f}%, p {c.p_value:.2g}); another order held at "
            f"{moved:.0%} of decisions")


def table(path: str) -> str:
    """Markdown of an ``--out`` file: per seed the base, the planner, their difference and the orders held."""
    with open(path) as f:
        results = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["seed"])
    orders = results[0]["orders"]
    lines = [f"| seed | {orders[0]} (goodput tok/s) | planner | planner − {orders[0]} | decisions | "
             + " | ".join(f"{o} held" for o in orders[1:]) + " |", "|---:|---:|---:|---:|---:|" + "---:|" * (len(orders) - 1)]
    for r in results:
        n = max(len(r["chosen"]), 1)
        lines.append(f"| {r['seed']} | {r['rule_goodput']:,.1f} | {r['planner_goodput']:,.1f} | "
                     f"{100 * (r['planner_goodput'] / r['rule_goodput'] - 1):+.1f}% | {len(r['chosen'])} | "
                     + " | ".join(f"{r['chosen'].count(i) / n:.0%}" for i in range(1, len(orders))) + " |")
    r0 = results[0]
    sees = ("the work already there" if r0.get("present") else "the job's future arrivals") + \
        (f", {r0.get('samples', 1)} guesses of the output lengths" if r0.get("blind") else ", the true output lengths")
    head = (f"{r0['task']} {r0['split']}, fixed {r0['fraction']:g}, decisions every {r0['epoch_s']:g} s, each order "
            f"held {r0['hold_s']:g} s then {orders[0]}; the copies see {sees}")
    return "\n".join([head, "", *lines, "", summary(results) + "."])


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="tenants")
    p.add_argument("--orders", default="lpm,fcfs,sjf", help="the schedulers to choose among; the first is the base")
    p.add_argument("--fraction", type=float, default=0.01, help="the fixed watermark of every job (lpm's val-best on tenants)")
    p.add_argument("--split", default="test")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--resample", type=float, default=0.8)
    p.add_argument("--epoch", type=float, default=1.0, help="engine seconds between decisions")
    p.add_argument("--hold", type=float, default=1.0, help="engine seconds a chosen order is held")
    p.add_argument("--present", action="store_true",
                   help="the copies hold no request still to arrive: the orders are ranked on the work already there")
    p.add_argument("--blind", action="store_true",
                   help="the copies hold output lengths guessed from the finished requests, not the true ones")
    p.add_argument("--samples", type=int, default=1, help="with --blind, guesses per decision (averaged)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--check", default=None, help="a kvrl-eval results.csv served under the base order")
    p.add_argument("--table", default=None, help="render a finished --out file as Markdown and exit (no sim)")
    p.add_argument("--serve", nargs="+", default=None, metavar="NAME='OVERRIDES'",
                   help="serve each named configuration (task overrides; fraction=F sets the watermark) on the jobs, "
                        "print each one's mean goodput and exit")
    p.add_argument("overrides", nargs="*", help="more task overrides for every job")
    a = p.parse_args()
    if a.table:
        print(table(a.table))
        return
    seeds = [int(s) for s in a.seeds.split(",")]
    from rl_rollout_oracle import run_jobs

    if a.serve:
        configs = [serve_config(text) for text in a.serve]
        jobs = [(a.task, name, ov + list(a.overrides), fraction, a.split, s, a.resample)
                for name, ov, fraction in configs for s in seeds]
        results = run_jobs(_serve, jobs, a.workers, a.out)
        for name, _, _ in configs:
            g = [r["goodput"] for r in results if r["name"] == name]
            print(json.dumps({"task": a.task, "split": a.split, "seeds": seeds, "name": name,
                              "goodput_mean": sum(g) / len(g)}))
        return
    orders = a.orders.split(",")
    jobs = [(a.task, orders, a.fraction, a.split, s, a.resample, a.epoch, a.hold, list(a.overrides), a.present,
             a.blind, a.samples) for s in seeds]
    results = run_jobs(_job, jobs, a.workers, a.out)
    if a.check:
        check_against(results, a.check, f"fixed(fraction={a.fraction})")
    print(f"\n{a.task}: {summary(results)}")


if __name__ == "__main__":
    main()
