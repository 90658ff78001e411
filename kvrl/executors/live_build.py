"""The one builder of live executors (:func:`build_live`): a checkpoint, the random checkpoint
``kvrl-run backend=live`` writes, or random weights drawn in device memory; and what it resolves
on the way (:func:`resolve_device`, :func:`resolve_dtype`, :func:`random_checkpoint_for`).

Kept apart from :mod:`kvrl.executors.live`, whose source the shipped sim profiles are
fingerprinted against (:mod:`kvrl.executors.fingerprint`): building an executor is not timed.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from kvrl.executors.live import LiveExecutor
from kvrl.executors.sampling import SamplingConfig
from kvrl.model import load_model

log = logging.getLogger(__name__)


def build_live(model_cfg: Mapping[str, Any], backend_cfg: Mapping[str, Any], seed: int = 0,
               weights: str = "memory") -> LiveExecutor:
    """A :class:`~kvrl.executors.live.LiveExecutor` for ``model_cfg`` (a ``conf/model`` entry) on
    ``backend_cfg`` (``conf/backend/live.yaml``: device, dtype, cuda_graphs, sampling; ``name`` and
    ``weights`` are ignored here).

    ``model_cfg.checkpoint`` set: that checkpoint. Else ``weights``: ``memory`` (the default) draws
    random weights directly on the device (no checkpoint written; step times do not depend on
    weight values); ``disk`` loads the random checkpoint written for the model's shape (what
    ``kvrl-run backend=live`` uses); any other value is a checkpoint directory."""
    backend = {k: v for k, v in backend_cfg.items() if k not in ("name", "weights")}
    model_cfg = dict(model_cfg)
    if weights not in ("memory", "disk") and not model_cfg.get("checkpoint"):
        model_cfg["checkpoint"] = str(weights)
    if model_cfg.get("checkpoint") or weights == "disk":
        return build_live_executor(backend, model_cfg, seed=seed)
    from kvrl.model import CausalLM, ModelConfig
    from kvrl.model.random_checkpoint import PRESETS, preset_config

    device = resolve_device(backend.get("device", "auto"))
    dtype = resolve_dtype(backend.get("dtype", "auto"), device)
    name = model_cfg.get("name", "tiny")
    mml = model_cfg.get("max_model_len")
    if name in PRESETS:
        hf = preset_config(name, **({"max_position_embeddings": mml} if mml else {}))
    else:
        keys = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
                "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
                "tie_word_embeddings": "tie_word_embeddings", "max_model_len": "max_position_embeddings"}
        hf = preset_config("tiny", model_cfg.get("family", "qwen3"),
                           **{v: model_cfg[k] for k, v in keys.items() if k in model_cfg})
    raw = hf.to_dict()
    raw["architectures"] = list(hf.architectures)
    config = dataclasses.replace(ModelConfig.from_dict(raw), dtype=dtype)
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    std = float(getattr(hf, "initializer_range", 0.02))
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=gen)
            elif "norm" in pname:
                p.fill_(1.0)
            else:
                p.zero_()
    sampling = SamplingConfig(backend.get("temperature", 0.0), backend.get("top_p", 1.0), backend.get("top_k", 0))
    log.info("live executor: %s on %s (%s), random weights in memory", config.architecture, device, dtype)
    return LiveExecutor(model.eval(), config, device, dtype, sampling, bool(backend.get("cuda_graphs", True)), seed,
                        step_graphs=_step_graphs(backend))


def _step_graphs(backend_cfg: Mapping[str, Any]) -> Optional[bool]:
    """``backend.step_graphs`` (default on) as :class:`LiveExecutor` takes it: None (whole-step
    graphs wherever CUDA graphs run) or False (off, also when ``backend.cuda_graphs`` is off)."""
    on = bool(backend_cfg.get("cuda_graphs", True)) and bool(backend_cfg.get("step_graphs", True))
    return None if on else False


def resolve_device(name: str) -> torch.device:
    """``backend.device``: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda[:i]``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("backend.device=cuda but no CUDA device is available; use backend.device=cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``backend.dtype``: ``auto`` (bfloat16 on CUDA, float32 on CPU), ``bfloat16``, ``float16``, ``float32``."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
    except KeyError:
        raise ValueError(f"backend.dtype must be auto, bfloat16, float16 or float32, got {name!r}") from None


def random_checkpoint_for(model_cfg: dict, dtype: torch.dtype, root: str = "runs/.checkpoints") -> str:
    """A random-weight checkpoint of the shape in ``model_cfg`` (written once, then reused).

    Written into a private directory and renamed into place, so processes that start together
    (one ``kvrl-eval`` per GPU) never load a half-written checkpoint; the first rename wins."""
    from kvrl.model import make_random_checkpoint
    from kvrl.model.random_checkpoint import PRESETS

    name = model_cfg["name"]
    dtype_name = str(dtype).removeprefix("torch.")
    path = Path(root) / f"{name}-{dtype_name}-seed{model_cfg.get('seed', 0)}"
    if (path / "config.json").exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    if name in PRESETS:
        make_random_checkpoint(tmp, preset=name, dtype=dtype_name)
    else:
        shape_keys = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "num_heads": "num_attention_heads",
                      "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
                      "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
                      "tie_word_embeddings": "tie_word_embeddings", "max_model_len": "max_position_embeddings"}
        overrides = {hf: model_cfg[k] for k, hf in shape_keys.items() if k in model_cfg}
        make_random_checkpoint(tmp, family=model_cfg.get("family", "qwen3"), preset="tiny", dtype=dtype_name,
                               **overrides)
    try:
        os.rename(tmp, path)
    except OSError:                 # another process renamed its copy first: use that one
        if not (path / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


def build_live_executor(backend_cfg: dict, model_cfg: dict, seed: int = 0) -> LiveExecutor:
    """From ``conf/backend/live.yaml`` and a ``conf/model`` entry (``checkpoint`` or a random one)."""
    device = resolve_device(backend_cfg.get("device", "auto"))
    dtype = resolve_dtype(backend_cfg.get("dtype", "auto"), device)
    checkpoint = model_cfg.get("checkpoint") or random_checkpoint_for(model_cfg, dtype)
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"model.checkpoint={checkpoint!r} is not a directory")
    model, config = load_model(checkpoint, dtype=dtype, device=device)
    sampling = SamplingConfig(backend_cfg.get("temperature", 0.0), backend_cfg.get("top_p", 1.0),
                              backend_cfg.get("top_k", 0))
    log.info("live executor: %s on %s (%s), checkpoint %s", config.architecture, device, dtype, checkpoint)
    return LiveExecutor(model, config, device, dtype, sampling, bool(backend_cfg.get("cuda_graphs", True)), seed,
                        step_graphs=_step_graphs(backend_cfg))
