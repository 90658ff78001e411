"""Headroom over a rule: a clairvoyant rollout planner whose base is a watermark plugin (issue 17).

``scripts/rl_rollout_oracle.py`` bounds what an adaptive watermark can gain over the best
*constant*. Where a rule already beats every constant (``slo_mix`` on ``env=slo_shift``, docs/rl.md,
"A shifting SLO mix"), the question is what any policy could gain over the *rule*. This planner
serves kvrl-eval's own job with the rule as its base; every ``--epoch`` seconds of engine time it
copies the whole serving state and serves the rest of the job once per candidate: the rule itself,
or a constant watermark for ``--hold`` seconds then the rule, and keeps the candidate whose finished
job has the best goodput. The copies hold the future (arrivals, output lengths), so it is an upper
reference, not a policy; with the rule among the candidates it is never worse than the rule on a
deterministic sim job.

With ``--forecast W`` the copies do not hold the future arrivals: each copy's requests still to arrive
are replaced by a persistence forecast, the requests that arrived in the last ``W`` seconds arriving
again every ``W`` seconds until the job's last arrival (prompt token ids shifted, so the copies hit no
prefix the real ones cached). The planner then knows the present (the queue, and the admitted
requests' output lengths, which the sim needs) but not the future: what part of the headroom a
policy without foresight of arrivals could reach. ``--horizon H`` runs that forecast H seconds ahead,
past the job's end too (a forecast that stops with the job tells the copies when the traffic stops).
``--blind`` denies the copies the output lengths as well: they hold lengths guessed from the finished
requests (``--hints``: the requests' length hints), and ``--samples K`` ranks the candidates by their
mean goodput over K such guesses, the expectation a server could compute, instead of one guess;
``--poisson`` draws each guess's arrivals too, at the recent rate, instead of replaying the last window.

    python scripts/rl_rule_headroom.py --task slo_shift --seeds 0,1,2 --workers 2 workload.horizon_s=200

The rule's own row is served by the same loop without overrides and must equal kvrl-eval's row for
the job (``--check`` names a kvrl-eval results.csv to compare with). Prints one JSON line per job
and the paired summary (kvrl.analysis.stats); ``--table OUT.jsonl`` renders a finished run as Markdown;
``--sweep`` serves only the ``--constants`` on the jobs and names the best in hindsight (the base to plan over).
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import logging
import os
import time

from kvrl.envs.guess import draw_future, forecast, set_lengths


def parse_rule(text: str) -> dict:
    """``name:key=value,...`` -> a plugin config (a value written as an integer stays an int, as
    integer parameters such as ``token_ratio``'s ``clip_max_new_tokens`` require; others are floats)."""
    name, _, rest = text.partition(":")
    params = {k: int(v) if v.lstrip("-").isdigit() else float(v)
              for k, v in (kv.split("=") for kv in rest.split(",") if kv)}
    return {"name": name, **params}


def build_loop(task: str, overrides: list[str], rule: dict, split: str, seed: int, resample: float):
    """kvrl-eval's job for ``rule`` on ``split`` at ``seed``, as a :class:`ServingLoop` not yet run,
    with the engine's watermark able to be held at a constant (``watermark.held``; None: the rule)."""
    from omegaconf import OmegaConf

    from kvrl.apps.eval import Job, Policy, job_config
    from kvrl.builder import build_engine
    from kvrl.engine.loop import ServingLoop
    from kvrl.envs.config import load_task
    from kvrl.envs.session import cached_workload

    _, cfg = load_task(task, [f"seed={seed}", "engine.prefix_hash=xxh3", *overrides])   # xxh3: copyable
    run = copy.deepcopy(dict(cfg.run))
    job = job_config(run, "watermark", Job(Policy("rule", "heuristic", rule), split, seed), resample)
    engine = build_engine(OmegaConf.create(job))
    requests = cached_workload(job["workload"], engine.executor.vocab_size, engine.config.max_model_len)
    rule_cls = type(engine.watermark)

    class Held(rule_cls):
        """The rule, or a constant fraction while ``held`` is set (the rule keeps observing)."""

        held = None

        def reserved_blocks(self) -> int:
            if self.held is None:
                return super().reserved_blocks()
            return int(self.held * self.engine.num_blocks)

    engine.watermark.__class__ = Held
    return ServingLoop(engine, list(requests))


def serve_until(loop, end_s: float) -> None:
    """Step ``loop`` until its engine clock reaches ``end_s`` or it is done."""
    while not loop.done and loop.engine.now < end_s:
        loop.step()


def finish(loop) -> float:
    """Serve ``loop`` to the end under the rule; the job's goodput tok/s."""
    loop.engine.watermark.held = None
    while not loop.done:
        loop.step()
    return float(loop.engine.metrics.summary()["goodput_tok_s"])


def plan(loop, candidates: list, epoch_s: float, hold_s: float, forecast_s: float = 0.0,
         blind_seed: int | None = None, hints: bool = False, samples: int = 1,
         horizon_s: float | None = None, poisson: bool = False) -> tuple[float, list]:
    """The rollout planner on ``loop``: its goodput and the candidate chosen at every decision; with
    ``forecast_s`` > 0 each copy's future arrivals are :func:`forecast`'s, not the job's; with
    ``blind_seed`` set the copies hold guessed lengths (:func:`~kvrl.envs.guess.draw_future`; with ``hints``,
    the requests' length hints; else ``samples`` draws per decision, the same draws for every candidate,
    whose goodputs are averaged: the planner then ranks candidates by their expected outcome, not by one
    guessed future), not the requests' own output lengths; ``horizon_s``: :func:`forecast`'s. With
    ``poisson`` (blind guesses and ``horizon_s`` needed), every guessed future's arrivals are a
    :func:`~kvrl.envs.guess.poisson_forecast` of their own."""
    import numpy as np

    if samples < 1 or (samples > 1 and (blind_seed is None or hints)):
        raise ValueError("samples > 1 needs blind guesses (blind_seed set, hints off); hints and true lengths "
                         "are one fixed future")
    if poisson and (blind_seed is None or hints or horizon_s is None or forecast_s <= 0):
        raise ValueError("poisson needs blind guesses (blind_seed set, hints off), forecast_s and horizon_s")
    rng = np.random.default_rng(blind_seed)
    chosen = []
    while not loop.done:
        now = loop.engine.now
        scores = dict.fromkeys(candidates, 0.0)
        for _ in range(samples):
            if blind_seed is not None:      # no forecast: the job's own arrivals, their lengths guessed too
                lengths, future = draw_future(loop, forecast_s if forecast_s > 0 else None, horizon_s, poisson,
                                              rng, hints)
            else:
                lengths, future = None, forecast(loop, forecast_s, horizon_s) if forecast_s > 0 else None
            for cand in candidates:
                trial = copy.deepcopy(loop)
                if future is not None:
                    trial.pending = trial.pending[:trial.next_index] + copy.deepcopy(future)
                if lengths is not None:
                    set_lengths(trial.engine, lengths)
                trial.engine.watermark.held = cand
                serve_until(trial, now + hold_s)
                scores[cand] += finish(trial) / samples
        best = max(candidates, key=lambda c: (scores[c], c is None))   # ties: the rule
        chosen.append(best)
        loop.engine.watermark.held = best
        serve_until(loop, now + (hold_s if best is not None else epoch_s))
        loop.engine.watermark.held = None
        if best is not None and not loop.done:
            serve_until(loop, now + max(epoch_s, hold_s))
    return float(loop.engine.metrics.summary()["goodput_tok_s"]), chosen


def _job(args: tuple) -> dict:
    (task, overrides, rule, split, seed, resample, constants, epoch_s, hold_s, forecast_s, blind, hints, samples,
     horizon_s, poisson) = args
    logging.disable(logging.WARNING)
    t = time.process_time()
    out = {"task": task, "seed": seed, "split": split, "overrides": overrides, "rule": rule,
           "rule_goodput": finish(build_loop(task, overrides, rule, split, seed, resample))}
    goodput, chosen = plan(build_loop(task, overrides, rule, split, seed, resample), [None, *constants],
                           epoch_s, hold_s, forecast_s, seed if blind or hints else None, hints, samples,
                           horizon_s, poisson)
    out.update(planner_goodput=goodput, chosen=chosen, forecast_s=forecast_s, blind=blind, hints=hints,
               samples=samples, horizon_s=horizon_s, poisson=poisson, cpu_s=time.process_time() - t)
    return out


def sweep(task: str, overrides: list[str], split: str, seeds: list[int], resample: float,
          constants: list[float]) -> dict[float, dict[int, float]]:
    """Each constant watermark served as the rule on the jobs (goodput tok/s per seed): which constant
    is the best in hindsight on exactly these jobs, to be the planner's base."""
    return {c: {s: finish(build_loop(task, overrides, {"name": "fixed", "fraction": c}, split, s, resample))
                for s in seeds} for c in constants}


def check_against(results: list[dict], path: str, label_prefix: str) -> None:
    """Each job's rule goodput against kvrl-eval's row for the same policy, split and seed."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["policy"].startswith(label_prefix)]
    for r in results:
        match = [row for row in rows if row["split"] == r["split"] and int(row["seed"]) == r["seed"]]
        if not match:
            print(f"check: no kvrl-eval row for seed {r['seed']}")
            continue
        theirs = float(match[0]["goodput_tok_s"])
        print(f"check seed {r['seed']}: rule {r['rule_goodput']:.4f}, kvrl-eval {theirs:.4f} "
              f"({'same' if abs(theirs - r['rule_goodput']) < 1e-6 * max(theirs, 1) else 'DIFFERENT'})")


def summary(results: list[dict]) -> str:
    """The paired comparison of the planner with its rule over the jobs' seeds, in one line."""
    from kvrl.analysis.stats import paired_compare

    planner = {r["seed"]: r["planner_goodput"] for r in results}
    base = {r["seed"]: r["rule_goodput"] for r in results}
    cmp = paired_compare(planner, base, "goodput_tok_s")
    held = sum(c is not None for r in results for c in r["chosen"]) / max(sum(len(r["chosen"]) for r in results), 1)
    return (f"rule {sum(base.values()) / len(base):,.1f}, planner {sum(planner.values()) / len(planner):,.1f} goodput "
            f"tok/s over {len(results)} seeds; planner - rule = {cmp.delta:+.1f} ± {cmp.delta_ci:.1f} tok/s "
            f"({cmp.pct_change:+.1f}%, p {cmp.p_value:.2g}); a constant held at {held:.0%} of decisions")


def table(path: str) -> str:
    """Markdown of a ``--out`` file: per seed, the rule, the planner, their difference and the
    constants the planner held, then :func:`summary`."""
    with open(path) as f:
        results = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["seed"])
    lines = ["| seed | rule (goodput tok/s) | planner | planner − rule | decisions | a constant held | constants held |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        held = [c for c in r["chosen"] if c is not None]
        counts = ", ".join(f"{c:g} x{held.count(c)}" for c in sorted(set(held)))
        lines.append(f"| {r['seed']} | {r['rule_goodput']:,.1f} | {r['planner_goodput']:,.1f} | "
                     f"{100 * (r['planner_goodput'] / r['rule_goodput'] - 1):+.1f}% | {len(r['chosen'])} | "
                     f"{len(held) / max(len(r['chosen']), 1):.0%} | {counts or '-'} |")
    return "\n".join(lines + ["", summary(results) + "."])


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="slo_shift")
    p.add_argument("--rule", default="slo_mix:tight=0.3,loose=0.0,share=0.3",
                   help="the base watermark plugin, name:key=value,...")
    p.add_argument("--split", default="test")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--resample", type=float, default=0.8)
    p.add_argument("--constants", default="0.0,0.1,0.2,0.3", help="the constants a decision may hold instead")
    p.add_argument("--epoch", type=float, default=2.0, help="engine seconds between decisions")
    p.add_argument("--hold", type=float, default=2.0, help="engine seconds a chosen constant is held")
    p.add_argument("--forecast", type=float, default=0.0,
                   help="seconds of persistence forecast in place of the copies' future arrivals (0: clairvoyant)")
    p.add_argument("--horizon", type=float, default=None,
                   help="with --forecast, seconds ahead the forecast runs, past the job's end too (default: to the "
                        "job's last arrival, which tells the planner when the traffic stops)")
    p.add_argument("--poisson", action="store_true",
                   help="with --forecast W --horizon H --blind: each guessed future's arrivals are drawn as a Poisson "
                        "process at the last W seconds' rate (copies of those requests), not one replay of them")
    p.add_argument("--blind", action="store_true",
                   help="the copies do not know the requests' output lengths: guessed from finished ones")
    p.add_argument("--hints", action="store_true",
                   help="the copies hold the requests' output_len_hint instead (a length predictor's estimates; "
                        "give workload.length_hint_sigma=SIGMA)")
    p.add_argument("--samples", type=int, default=1,
                   help="with --blind, guessed futures per decision; each candidate is scored by its mean goodput "
                        "over them (the same draws for every candidate)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--check", default=None, help="a kvrl-eval results.csv with the rule's rows")
    p.add_argument("--check-label", default="slo_mix", help="the rule's policy label prefix in --check")
    p.add_argument("--table", default=None, help="render a finished --out file as Markdown and exit (no sim)")
    p.add_argument("--sweep", action="store_true",
                   help="serve only each of --constants as the rule on the jobs, print the mean goodput per "
                        "constant (the hindsight-best base for the planner) and exit")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    if a.table:
        print(table(a.table))
        return
    rule = parse_rule(a.rule)
    consts = [float(c) for c in a.constants.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.sweep:
        means = {c: sum(g.values()) / len(g) for c, g in sweep(a.task, list(a.overrides), a.split, seeds,
                                                                 a.resample, consts).items()}
        for c, m in means.items():
            print(json.dumps({"task": a.task, "split": a.split, "seeds": seeds, "constant": c, "goodput_mean": m}))
        print(f"best constant in hindsight: {max(means, key=means.get)}")
        return
    jobs = [(a.task, list(a.overrides), rule, a.split, s, a.resample, consts, a.epoch, a.hold, a.forecast, a.blind,
             a.hints, a.samples, a.horizon, a.poisson)
            for s in seeds]
    from rl_rollout_oracle import run_jobs     # scripts/ is on sys.path when run as a script

    results = run_jobs(_job, jobs, a.workers, a.out)
    if a.check:
        check_against(results, a.check, a.check_label)
    print(f"\n{a.task} {a.overrides}: {summary(results)}")


if __name__ == "__main__":
    main()
