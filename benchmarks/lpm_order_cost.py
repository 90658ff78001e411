"""What the ``lpm`` scheduler's ordering costs the engine per step on the multi-tenant task (env=tenants), by the
number of waiting requests: one test job served in the sim (the engine's own host work is the same Python live),
the wall seconds of each ``order`` call timed. ``--whole-match`` answers every prefix peek with a whole match
(the pool before session 55's kept peeks) for a paired before/after on one tree; the run's metrics are printed
too, and are the same either way (docs/fidelity.md, "Runs 68-69").

    python benchmarks/lpm_order_cost.py --seed 8 [--whole-match] [--watermark 0.01]
    farm-bench -n 5 --timeout 300 --vs 'python benchmarks/lpm_order_cost.py --seed 8 --whole-match' \\
        -- python benchmarks/lpm_order_cost.py --seed 8
"""
from __future__ import annotations

import argparse
import time

import numpy as np

BINS = ((0, 8), (8, 32), (32, 64), (64, 129), (129, 1 << 30))


def serve(seed: int, watermark: float, whole_match: bool) -> tuple[dict, list[tuple[int, float]]]:
    """The run's summary and ``(waiting requests, seconds)`` of each ``order`` call."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from kvrl.apps.eval import job_workload
    from kvrl.apps.rl_schema import register_rl_schemas
    from kvrl.builder import build_engine
    from kvrl.engine.prefix_identity import PrefixIdentityMixin
    from kvrl.envs.session import cached_workload
    from kvrl.plugins.schedulers import LongestPrefixMatch

    register_rl_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_container(compose("eval", overrides=["env=tenants", "scheduler=lpm"]), resolve=True)
    cfg.update(watermark={"name": "fixed", "fraction": watermark}, seed=seed)
    cfg["workload"] = job_workload(cfg["workload"], "test", seed, cfg["resample"])
    calls: list[tuple[int, float]] = []
    order = LongestPrefixMatch.order

    def timed(self, waiting):
        t0 = time.perf_counter()
        out = order(self, waiting)
        calls.append((len(waiting), time.perf_counter() - t0))
        return out
    LongestPrefixMatch.order = timed
    if whole_match:
        PrefixIdentityMixin.peek_cached_tokens = lambda self, seq: self.match_prefix(seq).num_tokens(self.block_size)
    engine = build_engine(OmegaConf.create(cfg), record_steps=False)
    requests = cached_workload(cfg["workload"], engine.executor.vocab_size, engine.config.max_model_len)
    return engine.run(requests), calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--watermark", type=float, default=0.01)
    ap.add_argument("--whole-match", action="store_true")
    a = ap.parse_args(argv)
    summary, calls = serve(a.seed, a.watermark, a.whole_match)
    c = np.asarray(calls, dtype=np.float64).reshape(-1, 2)
    print(f"env=tenants test seed {a.seed}, lpm, fixed {a.watermark}, peeks {'whole' if a.whole_match else 'kept'}: "
          f"{len(c)} order calls, {c[:, 1].sum():.2f} s; throughput {summary['throughput_tok_s']:.2f} tok/s, "
          f"goodput {summary['goodput_tok_s']:.2f}, preemptions {summary['preemptions']}")
    print("| waiting | calls | mean us per call |\n|---|---:|---:|")
    for lo, hi in BINS:
        m = (c[:, 0] >= lo) & (c[:, 0] < hi)
        if m.any():
            print(f"| [{lo}, {hi if hi < 1 << 30 else 'inf'}) | {int(m.sum())} | {1e6 * c[m, 1].mean():.0f} |")


if __name__ == "__main__":
    main()
