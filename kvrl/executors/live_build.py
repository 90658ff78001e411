"""The one builder of live executors (:func:`build_live`): a checkpoint, the random checkpoint
``kvrl-run backend=live`` writes, or random weights drawn in device memory.

Kept apart from :mod:`kvrl.executors.live`, whose source the shipped sim profiles are
fingerprinted against (:mod:`kvrl.executors.fingerprint`): building an executor is not timed.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from kvrl.executors.live import LiveExecutor

log = logging.getLogger(__name__)


def build_live(model_cfg: Mapping[str, Any], backend_cfg: Mapping[str, Any], seed: int = 0,
               weights: str = "memory") -> "LiveExecutor":
    """A :class:`~kvrl.executors.live.LiveExecutor` for ``model_cfg`` (a ``conf/model`` entry) on
    ``backend_cfg`` (``conf/backend/live.yaml``: device, dtype, cuda_graphs, sampling; ``name`` and
    ``weights`` are ignored here).

    ``model_cfg.checkpoint`` set: that checkpoint. Else ``weights``: ``memory`` (the default) draws
    random weights directly on the device (no checkpoint written; step times do not depend on
    weight values); ``disk`` loads the random checkpoint written for the model's shape (what
    ``kvrl-run backend=live`` uses); any other value is a checkpoint directory."""
    import torch

    from kvrl.executors.live import (LiveExecutor, SamplingConfig, _resolve_device, _resolve_dtype,
                                     build_live_executor)

    backend = {k: v for k, v in backend_cfg.items() if k not in ("name", "weights")}
    model_cfg = dict(model_cfg)
    if weights not in ("memory", "disk") and not model_cfg.get("checkpoint"):
        model_cfg["checkpoint"] = str(weights)
    if model_cfg.get("checkpoint") or weights == "disk":
        return build_live_executor(backend, model_cfg, seed=seed)
    from kvrl.model import CausalLM, ModelConfig
    from kvrl.model.random_checkpoint import PRESETS, preset_config

    device = _resolve_device(backend.get("device", "auto"))
    dtype = _resolve_dtype(backend.get("dtype", "auto"), device)
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
    return LiveExecutor(model.eval(), config, device, dtype, sampling, bool(backend.get("cuda_graphs", True)), seed)
