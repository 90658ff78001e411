"""kvrl-eval's live jobs share one executor: with engine.num_blocks=0 they keep the first pool."""
from omegaconf import OmegaConf


def test_live_jobs_keep_the_warm_pool_when_num_blocks_is_zero(monkeypatch):
    """engine.num_blocks=0 sizes the pool from free memory, which the warm-up's graphs reduce: before,
    each job sized it again, got a smaller pool, reallocated it and lost the captured graphs. Now
    every job of the process uses the warm-up's pool size (issue 19). The shrinking free memory is
    simulated on the CPU executor."""
    from hydra import compose, initialize_config_module

    from kvrl.apps import eval as ev
    from kvrl.apps.schema import register_schemas
    from kvrl.executors.live import LiveExecutor

    sizes = iter([64, 48, 40, 32, 24])
    monkeypatch.setattr(LiveExecutor, "kv_capacity_blocks", lambda self, block_size, utilization: next(sizes))
    monkeypatch.setattr(ev, "_LIVE", {})
    register_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        run = compose("run", overrides=["backend=live", "model=tiny", "backend.device=cpu", "engine.num_blocks=0",
                                        "workload.max_requests=3"])
    run = OmegaConf.to_container(run, resolve=True)

    def job(seed):
        return ev.Job(ev.Policy("fixed", "heuristic", {"name": "fixed", "fraction": 0.01}), "test", seed)

    first = ev.run_job(run, "watermark", job(0), None, live_warmup=2)
    pool = ev._LIVE["executor"].kv
    second = ev.run_job(run, "watermark", job(1), None, live_warmup=2)
    assert ev._LIVE["num_blocks"] == 64 and ev._LIVE["executor"].kv is pool
    assert first["finished"] + first.get("rejected", 0) == second["finished"] + second.get("rejected", 0) == 3
