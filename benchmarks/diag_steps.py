"""Why do some live steps take longer inside an engine run than the profile measured?

Serves one kvrl-fidelity workload live (fcfs / fixed 0.01 / lifo / hash_lru) and, for a sample
of the mixed (decode + prefill) and decode steps, re-executes the very same batch three more times
right after the engine applied it (an engine callback; idempotent: the same K/V is written to the same slots). The first execution is
the step as the engine runs it; the repeats are the step back to back, as a profile times it.
Runs with Python's garbage collector as is, with it frozen after warm-up, and as is again.

    python benchmarks/diag_steps.py [--workload poisson] [--model qwen3-0.6b]
"""
from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from kvrl import plugins
from kvrl.builder import warm_up
from kvrl.apps.live_schema import compose_fidelity
from kvrl.fidelity.pairs import pair_engine, shared_engine, workload_engine, workload_requests
from kvrl.executors.live_build import build_live
from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.request import SeqStatus


class Probe(EngineCallback):
    """Engine callback: keeps every step's time inside ``execute`` and re-runs sampled steps back
    to back on ``live``. It runs after the engine applied the step, so a step whose sequences did
    not all stay running (one finished or failed and released its blocks) is not re-run."""

    def __init__(self, live, every: int = 5) -> None:
        self.live, self.every, self.rows = live, every, []

    def on_step(self, event) -> bool:
        batch = event.batch
        kind = "decode" if all(s.num_tokens == 1 for s in batch.seqs) else "mixed"
        if any(s.num_tokens == 1 for s in batch.seqs) and not (batch.swap_in or batch.swap_out or batch.copies) \
                and all(s.seq.status is SeqStatus.RUNNING for s in batch.seqs) \
                and (kind == "mixed" or len(self.rows) % self.every == 0):
            reps = []
            for _ in range(3):
                t1 = time.perf_counter()
                self.live.execute(batch)
                reps.append(time.perf_counter() - t1)
            self.rows.append((kind, event.execute_wall_s, float(np.median(reps))))
        else:
            self.rows.append((kind, event.execute_wall_s, float("nan")))
        return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="poisson")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--max-requests", type=int, default=0)
    args = ap.parse_args()
    plugins.load_entry_points()
    cfg = compose_fidelity([f"model={args.model}"])
    live = build_live(cfg["model"], cfg["live"])
    w = cfg["workloads"][args.workload]
    # the modes below set the collector up themselves: the engine must not pause it
    ecfg = dict(workload_engine(shared_engine(cfg, live), w), pause_gc=False)
    reqs = workload_requests(w, args.max_requests, live.vocab_size, live.max_model_len)
    warm_up(live, ecfg, 256 if live.device.type == "cuda" else 4, seed=101)
    pol = cfg["policies"]["vllm"]
    for mode in ("gc as is", "gc frozen", "gc as is again"):
        if mode == "gc frozen":
            gc.collect()
            gc.freeze()
        else:
            gc.unfreeze()
        probe = Probe(live)
        pair_engine(ecfg, live, pol, cfg["slo"]).run(reqs, callbacks=[probe])
        print(f"\n{args.workload} / vllm, {mode}: {len(probe.rows)} steps")
        for kind in ("decode", "mixed"):
            rows = [r for r in probe.rows if r[0] == kind]
            firsts = np.asarray([r[1] for r in rows])
            pairs = np.asarray([(r[1], r[2]) for r in rows if not np.isnan(r[2])])
            if len(pairs):
                print(f"  {kind}: {len(rows)} steps, mean {firsts.mean() * 1e3:.2f} ms; sampled {len(pairs)}: "
                      f"in engine {pairs[:, 0].mean() * 1e3:.2f} ms vs repeated {pairs[:, 1].mean() * 1e3:.2f} ms "
                      f"(median ratio {np.median(pairs[:, 0] / pairs[:, 1]):.3f})")


if __name__ == "__main__":
    main()
