"""The engine's own Python between steps, timed on this CPU with the sim executor, against the profile's host terms:
does the host model under-count the engine's work on some workloads? The engine code between two steps (apply,
schedule, prefix cache, policies) is the same live and in the sim, so its wall time here, relative to what the
profile's host terms price for the same steps, ranks the workloads by unpriced host work without a GPU.

    python scripts/fidelity_host_cpu.py --run docs/results/fidelity_same_host/run61_qwen_fwd \\
        --run docs/results/fidelity_same_host/run62_qwen_rev --repeats 3 --out FILE
    python scripts/fidelity_host_cpu.py --table FILE

The first run's first share gives the workloads and policies for every pair (its ``replay.tar.xz`` holds the
kvrl-fidelity config; the runs are meant to serve one config, as runs 61-62 do), and each run its live replays (``fidelity.json``'s ``replay.by_kind.host``: the live engine's time between steps and
the profile's price of it). Every (workload, policy) pair any run served is served ``--repeats`` times in the sim
(the shape's shipped profile), the engine timed by a step callback: the wall seconds between two steps' ends minus
the time inside ``execute``. A pair keeps its fastest repeat (the least disturbed by this shared machine). Per pair:
``cpu_ratio``, that time over the host terms' price of the same sim steps, and each run's ``live_ratio``, its live
host time over its price. Both are relative measures (this CPU and the live host differ in speed); the table divides
each column by its median over the pairs. Wall times on a shared machine: seconds, and not bit-reproducible.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from scipy import stats

from kvrl.builder import build_executor
from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.loop import ServingLoop, collect_garbage
from kvrl.executors.profile import HOST_WORK, batch_features, host_work_rows
from kvrl.fidelity.pairs import pair_engine, workload_engine, workload_requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from fidelity_live_ceiling import emit, load_run  # noqa: E402


def run_config(run: Path) -> dict:
    """The kvrl-fidelity config of ``run``'s first share, from its ``replay.tar.xz``."""
    with tarfile.open(run / "replay.tar.xz") as t, tempfile.TemporaryDirectory() as tmp:
        member = next(m for m in t.getmembers() if m.name.endswith("pressure_0/.hydra/config.yaml"))
        t.extract(member, tmp, filter="data")
        return yaml.safe_load((Path(tmp) / member.name).read_text())


class StepClock(EngineCallback):
    """Keeps each step's end (wall clock), its seconds inside ``execute`` and its batch."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.inside: list[float] = []
        self.batches: list = []

    def on_step(self, event) -> bool:
        self.ends.append(time.perf_counter())
        self.inside.append(event.execute_wall_s)
        self.batches.append(event.batch)
        return True


def time_pair(cfg: dict, workload: str, policy: str) -> dict:
    """One sim run of ``workload`` x ``policy`` of config ``cfg``: steps, the engine's seconds between steps, and
    the profile's host price of those steps."""
    sim_cfg = OmegaConf.create({"backend": {"name": "sim", "profile": "auto"}, "seed": cfg["seed"],
                                "model": OmegaConf.load(ROOT / "conf/model" / f"{cfg['model']['name']}.yaml"),
                                "device": OmegaConf.load(ROOT / "conf/device/h200.yaml")})
    base = {k: v for k, v in cfg["engine"].items() if k != "cpu_device_num_blocks"}
    w = cfg["workloads"][workload]
    ecfg = workload_engine(base, w)
    requests = workload_requests(w, cfg["max_requests"], cfg["model"]["vocab_size"],
                                 ecfg.get("max_model_len") or cfg["model"]["max_model_len"])
    engine = pair_engine(ecfg, build_executor(sim_cfg), cfg["policies"][policy], cfg["slo"])
    clock = StepClock()
    collect_garbage()
    ServingLoop(engine, requests).run([clock])
    model = engine.executor.profile.model
    gaps = [b - a - inside for a, b, inside in zip(clock.ends, clock.ends[1:], clock.inside[1:])]
    price = 0.0
    for batch, work in list(zip(clock.batches, host_work_rows(clock.batches)))[1:]:
        f = {**batch_features(batch), **work}
        price += model.host_s(f["n_pre"] + f["n_dec"], f["n_pre"], *(f[k] for k in HOST_WORK))
    return {"steps": len(gaps), "cpu_host_s": sum(gaps), "price_s": price}


def measure(runs: list[Path], repeats: int) -> dict:
    """Per pair served by any of ``runs``: its fastest of ``repeats`` sim runs' engine time and price, and each
    run's live host time over its price."""
    lives = {run.name: load_run(run) for run in runs}
    cfg = run_config(runs[0])
    pairs = list(dict.fromkeys(p for results in lives.values() for p in results))
    out = {}
    for pair in pairs:
        workload, policy = pair.split("/")
        best = min((time_pair(cfg, workload, policy) for _ in range(repeats)), key=lambda r: r["cpu_host_s"])
        host = {name: results[pair]["replay"]["by_kind"]["host"] for name, results in lives.items() if pair in results}
        out[pair] = {**best, "cpu_ratio": best["cpu_host_s"] / best["price_s"],
                     "live_ratio": {name: h["live_s"] / h["sim_s"] for name, h in host.items()}}
        print(f"{pair}: cpu x{out[pair]['cpu_ratio']:.2f}, live " +
              ", ".join(f"{n} x{r:.2f}" for n, r in out[pair]["live_ratio"].items()), file=sys.stderr)
    return {"runs": [run.name for run in runs], "repeats": repeats, "pairs": out}


def table(path: Path) -> str:
    """An ``--out`` file as Markdown: per pair, the CPU engine time and each run's live host time over the host terms'
    price, each divided by its median over the pairs; then the rank correlation of the CPU column with each run's."""
    data = json.loads(path.read_text())
    pairs, runs = data["pairs"], data["runs"]
    cpu_med = statistics.median(p["cpu_ratio"] for p in pairs.values())
    live_med = {n: statistics.median(p["live_ratio"][n] for p in pairs.values() if n in p["live_ratio"]) for n in runs}
    lines = ["| pair | engine time on this CPU / price, over its median | "
             + " | ".join(f"{n}: live host time / price, over its median" for n in runs) + " |",
             "|---|---:|" + "---:|" * len(runs)]
    for pair, p in sorted(pairs.items(), key=lambda kv: -kv[1]["cpu_ratio"]):
        cells = [f"{p['live_ratio'][n] / live_med[n]:.2f}" if n in p["live_ratio"] else "-" for n in runs]
        lines.append(f"| {pair} | {p['cpu_ratio'] / cpu_med:.2f} | " + " | ".join(cells) + " |")
    rho = []
    for n in runs:
        both = [(p["cpu_ratio"], p["live_ratio"][n]) for p in pairs.values() if n in p["live_ratio"]]
        rho.append(f"{n} {stats.spearmanr(*zip(*both)).statistic:+.2f} ({len(both)} pairs)")
    lines += ["", "Spearman rank correlation of the CPU column with each run's live column: " + ", ".join(rho) + "."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, action="append", default=[], help="a committed kvrl-fidelity run directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, help="print this --out file as a Markdown table and stop")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    if not args.run:
        raise SystemExit("give --run DIR at least once (or --table FILE)")
    emit(measure(args.run, args.repeats), args.out)


if __name__ == "__main__":
    main()
