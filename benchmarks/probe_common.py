"""What the step-time probes share (``decode_shape_probe.py``, ``kv_content_probe.py``,
``shared_degree_probe.py``, ``step_path_probe.py``): the live executor they time, the step model that prices
its batches, and a zeroed pool with its batch factory.
Imported as ``probe_common`` (the probes run as scripts, so ``benchmarks/`` is on ``sys.path``)."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

BLOCK_SIZE = 16


class Probe(NamedTuple):
    """A probe's live executor, the step model that prices its batches (None where no profile
    matches, as on a CPU: the probe then times only), the pool ``kvrl-profile`` would take (blocks;
    2,048 on a CPU) and the sim's cost source (which profile file)."""

    executor: Any
    model: Optional[Any]
    pool_blocks: int
    cost_source: str


def live_probe(model_name: str, profile: str = "auto") -> Probe:
    """kvrl-fidelity's live executor for ``model_name`` and the fitted model of ``profile``
    (``auto``: the shipped one of this device and shape), as a :class:`Probe`; prints the cost source."""
    from kvrl.apps.live_schema import compose_fidelity
    from kvrl.executors.live_build import build_live
    from kvrl.executors.sim import SimExecutor

    cfg = compose_fidelity([f"model={model_name}"])
    ex = build_live(cfg["model"], cfg["live"])
    sim = SimExecutor(ex.cost_model.model, ex.cost_model.device, 0, profile=profile, cuda_graphs=True)
    print(f"profile: {sim.cost_source}")
    full = ex.kv_capacity_blocks(BLOCK_SIZE, 0.9) if ex.device.type == "cuda" else 2048
    return Probe(ex, sim.profile.model if sim.profile is not None else None, full, sim.cost_source)


def zeroed_pool(executor, pool_blocks: int, max_decodes: int):
    """Allocate ``pool_blocks`` KV blocks (and 64 CPU blocks) on ``executor``, zero them, capture the decode
    graphs up to ``max_decodes`` sequences, and return the seeded ``BatchFactory`` over that pool."""
    from kvrl.profiling.batches import BatchFactory
    from kvrl.profiling.timing import warm_graphs

    executor.allocate_kv(pool_blocks, 64, BLOCK_SIZE)
    executor.kv.zero_()
    factory = BatchFactory(pool_blocks, BLOCK_SIZE, executor.vocab_size, executor.max_model_len, seed=0)
    warm_graphs(executor, factory, max_decodes)
    return factory
