"""How far the guessed-lengths leak that session 48 fixed reaches (docs/rl.md, "A second fix").

Before the first request of a job finished, :func:`kvrl.envs.guess.guessed_lengths` left the requests
to come with the true output lengths they carry. Only a decision taken before that first finish, with a
non-empty guessed future, could see them. Three checks:

    python scripts/guess_leak_reach.py decisions --task throttle --rule token_ratio:clip_max_new_tokens=4096,min_ratio=0.05 \
        --epoch 1 --forecast 5 --seeds 0,1,...,19
    python scripts/guess_leak_reach.py episodes --task throttle_planner --episodes 20 env.episode.window_s=20
    python scripts/guess_leak_reach.py diff OLD.jsonl NEW.jsonl

``decisions``: on the rule's own trajectory of each test job (scripts/rl_rule_headroom.py's loop), the
decisions (one every ``--epoch`` s from the start) taken before the first request finished, and those of
them whose guessed future is not empty (``--forecast 0``: the job's own arrivals to come; else the
arrivals of the last ``--forecast`` s, which a forecast copies). ``episodes``: the engine seconds from
the start of each of ``--episodes`` environment episodes (reset seeds 1000, 1001, ...; the first
action held) to the first finished request, what expert iteration's ``--skip_s`` must exceed.
``diff``: the seeds of two rl_rule_headroom.py runs whose first decision, or goodput, differ.
"""
from __future__ import annotations

import argparse
import json


def decisions(task: str, rule: str, epoch_s: float, forecast_s: float, seeds: list[int]) -> list[tuple[int, int, int]]:
    """Per seed: (seed, decisions before the first finish, of them with a non-empty guessed future)."""
    from rl_rule_headroom import build_loop, parse_rule, serve_until   # scripts/ is on sys.path

    from kvrl.envs.guess import recent_arrivals

    out = []
    for seed in seeds:
        loop = build_loop(task, [], parse_rule(rule), "test", seed, 0.8)
        before = exposed = 0
        while not loop.engine.metrics.finished_output_lens and not loop.done:
            future = loop.pending[loop.next_index:] if forecast_s == 0 else recent_arrivals(loop, forecast_s)
            before, exposed = before + 1, exposed + bool(future)
            serve_until(loop, loop.engine.now + epoch_s)
        out.append((seed, before, exposed))
    return out


def episodes(task: str, count: int, overrides: list[str]) -> list[float]:
    """Per episode: engine seconds from its start to its first finished request."""
    from rl_rcpi import _env

    _, _, env = _env(task, overrides, copyable=True)
    out = []
    for k in range(count):
        env.reset(seed=1000 + k)
        engine, ended = env.driver.loop.engine, False
        start = engine.now
        while not engine.metrics.finished_output_lens and not ended:
            _, _, terminated, truncated, _ = env.step(0)
            ended = terminated or truncated
        out.append(engine.now - start if engine.metrics.finished_output_lens else float("nan"))
    return out


def diff(old_path: str, new_path: str) -> dict[str, list[int]]:
    """The seeds whose first decision differs, and those whose planner goodput differs, between two runs."""
    old, new = ({r["seed"]: r for r in map(json.loads, open(p))} for p in (old_path, new_path))
    common = sorted(set(old) & set(new))
    return {"seeds": common,
            "first_decision_differs": [s for s in common if old[s]["chosen"][:1] != new[s]["chosen"][:1]],
            "goodput_differs": [s for s in common if old[s]["planner_goodput"] != new[s]["planner_goodput"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decisions")
    d.add_argument("--task", required=True)
    d.add_argument("--rule", required=True, help="name:key=value,... as rl_rule_headroom.py's --rule")
    d.add_argument("--epoch", type=float, required=True)
    d.add_argument("--forecast", type=float, default=0.0)
    d.add_argument("--seeds", required=True)
    e = sub.add_parser("episodes")
    e.add_argument("--task", required=True)
    e.add_argument("--episodes", type=int, default=20)
    e.add_argument("overrides", nargs="*")
    f = sub.add_parser("diff")
    f.add_argument("old")
    f.add_argument("new")
    a = p.parse_args()
    if a.what == "decisions":
        rows = decisions(a.task, a.rule, a.epoch, a.forecast, [int(s) for s in a.seeds.split(",")])
        print(json.dumps({"seed_before_exposed": rows, "exposed": sum(r[2] for r in rows)}))
    elif a.what == "episodes":
        times = episodes(a.task, a.episodes, a.overrides)
        print(json.dumps({"first_finish_s": [round(t, 2) for t in times], "max_s": round(max(times), 2)}))
    else:
        print(json.dumps(diff(a.old, a.new)))


if __name__ == "__main__":
    main()
