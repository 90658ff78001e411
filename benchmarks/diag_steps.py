"""Why do some live steps take longer inside an engine run than the profile measured?

Serves one kvrl-fidelity workload live under one of its policies (``--policy``, default ``vllm``: fcfs /
fixed 0.01 / lifo / hash_lru) and, for a sample
of the mixed (decode + prefill) and decode steps, re-executes the very same batch three more times
right after the engine applied it (an engine callback; idempotent: the same K/V is written to the same slots). The first execution is
the step as the engine runs it; the repeats are the step back to back, as a profile times it.
Runs with Python's garbage collector as is, with it frozen after warm-up, and as is again
(``--modes``).

``--twins``: after the run, each re-executed step's *twin* is timed the same way: a batch of
:class:`~kvrl.profiling.batches.BatchFactory` (as ``kvrl-profile`` builds its grid) with the same
items (each one's start and query tokens) on consecutive blocks of the then idle pool. The twin has
the step's features (all but ``dec_shared``), so twin vs repeated step separates what a step's
features miss (the twin costs what the step costs) from what the batch's content adds (block
placement, prefix-cache sharing, token ids, the K/V the engine wrote). Both are priced by the
shipped profile.

    python benchmarks/diag_steps.py [--workload poisson] [--policy vllm] [--model qwen3-0.6b] [--modes 3] [--twins]
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np
from kvrl import plugins
from kvrl.builder import warm_up
from kvrl.apps.live_schema import compose_fidelity
from kvrl.fidelity.pairs import pair_engine, shared_engine, workload_engine, workload_requests
from kvrl.executors.live_build import build_live
from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.request import SeqStatus
from kvrl.executors.profile import batch_features


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
            shape = [(s.start, s.num_tokens) for s in batch.seqs]
            self.rows.append((kind, event.execute_wall_s, float(np.median(reps)), shape, batch_features(batch)))
        else:
            self.rows.append((kind, event.execute_wall_s, float("nan"), None, None))
        return True


def time_twins(live, rows: list, model) -> list[dict]:
    """Time each re-executed step's twin (see the module docstring) back to back and print, per
    step kind, the in-engine, repeated and twin times and their profile prices. Returns a record
    per twin: kind, items (start, query tokens), the step's features, in-engine, repeated and twin
    seconds."""
    from kvrl.profiling.batches import BatchFactory

    bs = live.block_size
    factory = BatchFactory(live.num_blocks, bs, live.vocab_size, live.max_model_len, seed=0)
    records = []
    for kind in ("decode", "mixed"):
        out = []
        for _, first, rep, shape, feats in (r for r in rows if r[0] == kind and r[3] is not None):
            if sum(-(-(st + k) // bs) for st, k in shape) > live.num_blocks:
                continue                       # the twin's private blocks would not fit the pool
            twin = factory.batch(decode_lens=[st + 1 for st, k in shape if k == 1],
                                 prefills=[(k, st) for st, k in shape if k > 1])
            reps = []
            for _ in range(4):
                t1 = time.perf_counter()
                live.execute(twin)
                reps.append(time.perf_counter() - t1)
            price = (lambda f: model.predict_features(f, kind == "decode")) if model is not None else (lambda f: np.nan)
            out.append((first, rep, float(np.median(reps[1:])), price(feats), price(batch_features(twin))))
            records.append({"kind": kind, "items": shape, "features": feats, "in_engine_s": first, "repeated_s": rep,
                            "twin_s": out[-1][2], "twin_features": batch_features(twin)})
        if out:
            a = np.asarray(out)
            print(f"  {kind} twins ({len(a)}): in engine {a[:, 0].mean() * 1e3:.2f} ms, repeated {a[:, 1].mean() * 1e3:.2f}, "
                  f"twin {a[:, 2].mean() * 1e3:.2f}; median repeated / twin {np.median(a[:, 1] / a[:, 2]):.3f}; "
                  f"priced: step {a[:, 3].mean() * 1e3:.2f}, twin {a[:, 4].mean() * 1e3:.2f}; median repeated / price "
                  f"{np.median(a[:, 1] / a[:, 3]):.3f}, twin / price {np.median(a[:, 2] / a[:, 4]):.3f}")
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="poisson")
    ap.add_argument("--policy", default="vllm", help="a policy of conf/fidelity.yaml (vllm, sjf_swap)")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--modes", type=int, default=3, help="how many of the three GC modes to run, in order")
    ap.add_argument("--twins", action="store_true", help="also time each re-executed step's twin (see above)")
    ap.add_argument("--profile", default="auto", help="the profile that prices the twins")
    ap.add_argument("--out", default="", help="write the twins' records (JSON)")
    args = ap.parse_args()
    plugins.load_entry_points()
    cfg = compose_fidelity([f"model={args.model}"])
    live = build_live(cfg["model"], cfg["live"])
    w = cfg["workloads"][args.workload]
    # the modes below set the collector up themselves: the engine must not pause it
    ecfg = dict(workload_engine(shared_engine(cfg, live), w), pause_gc=False)
    reqs = workload_requests(w, args.max_requests, live.vocab_size, live.max_model_len)
    warm_up(live, ecfg, 256 if live.device.type == "cuda" else 4, seed=101)
    pol = cfg["policies"][args.policy]
    model = None
    if args.twins:
        from kvrl.executors.sim import SimExecutor
        sim = SimExecutor(live.cost_model.model, live.cost_model.device, 0, profile=args.profile, cuda_graphs=True)
        model = sim.profile.model if sim.profile is not None else None   # none: times only, prices NaN
        print(f"profile: {sim.cost_source}")
    for mode in ("gc as is", "gc frozen", "gc as is again")[:args.modes]:
        if mode == "gc frozen":
            gc.collect()
            gc.freeze()
        else:
            gc.unfreeze()
        probe = Probe(live)
        pair_engine(ecfg, live, pol, cfg["slo"]).run(reqs, callbacks=[probe])
        print(f"\n{args.workload} / {args.policy}, {mode}: {len(probe.rows)} steps")
        for kind in ("decode", "mixed"):
            rows = [r for r in probe.rows if r[0] == kind]
            firsts = np.asarray([r[1] for r in rows])
            pairs = np.asarray([(r[1], r[2]) for r in rows if not np.isnan(r[2])])
            if len(pairs):
                print(f"  {kind}: {len(rows)} steps, mean {firsts.mean() * 1e3:.2f} ms; sampled {len(pairs)}: "
                      f"in engine {pairs[:, 0].mean() * 1e3:.2f} ms vs repeated {pairs[:, 1].mean() * 1e3:.2f} ms "
                      f"(median ratio {np.median(pairs[:, 0] / pairs[:, 1]):.3f})")
        if args.twins:
            records = time_twins(live, probe.rows, model)
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump({"workload": args.workload, "policy": args.policy, "mode": mode, "twins": records}, fh)


if __name__ == "__main__":
    main()
