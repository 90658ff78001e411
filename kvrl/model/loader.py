"""Load a Hugging Face safetensors checkpoint directory into a :class:`CausalLM`.

The directory holds ``config.json`` and either ``model.safetensors`` or a
``model.safetensors.index.json`` naming its shards. HF tensor ``model.<name>`` fills kvrl
parameter ``<name>`` (``lm_head.weight`` stays as is); the rows of each fused projection are
filled from its sibling HF projections (``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``,
``gate_proj``/``up_proj`` -> ``gate_up_proj``). Checkpoint tensors kvrl has no parameter for
(``lm_head.weight`` of a tied model, stale ``rotary_emb.inv_freq`` buffers) are ignored; any other
unused tensor (a ``config.json`` with fewer layers than the checkpoint) is an error naming them, and so
is a tensor with a NaN or infinite value.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import replace
from typing import Optional, Union

import torch
from safetensors import safe_open

from kvrl.model.config import DTypeLike, ModelConfig, resolve_dtype
from kvrl.model.layers import PackedLinear
from kvrl.model.model import CausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint's tensors do not match the model its config describes."""


def checkpoint_tensor_files(path: Union[str, os.PathLike]) -> dict[str, str]:
    """Map every tensor name of the checkpoint at ``path`` to the file that holds it.

    Raises ``FileNotFoundError`` naming a shard listed in the index but absent, or when neither
    ``model.safetensors`` nor its index exists.
    """
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        for shard in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(path, shard)):
                raise FileNotFoundError(
                    f"checkpoint shard {shard!r} listed in {INDEX_FILE} is missing from {os.fspath(path)!r}"
                )
        return {name: os.path.join(path, shard) for name, shard in weight_map.items()}
    single = os.path.join(path, SINGLE_FILE)
    if not os.path.isfile(single):
        raise FileNotFoundError(f"neither {SINGLE_FILE} nor {INDEX_FILE} in {os.fspath(path)!r}")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def _parameter_sources(model: CausalLM) -> list[tuple[torch.Tensor, str]]:
    """(destination view of a kvrl parameter, HF tensor name) for every slice to fill."""
    sources = []
    for module_name, module in model.named_modules():
        hf_module = module_name if module_name == "lm_head" else f"model.{module_name}"
        for param_name, param in module.named_parameters(recurse=False):
            if not isinstance(module, PackedLinear):
                sources.append((param.data, f"{hf_module}.{param_name}"))
                continue
            parent = hf_module.rpartition(".")[0]
            offset = 0
            for shard, rows in module.shards.items():
                sources.append((param.data[offset:offset + rows], f"{parent}.{shard}.{param_name}"))
                offset += rows
    return sources


def load_model(
    path: Union[str, os.PathLike],
    dtype: Optional[DTypeLike] = None,
    device: Union[str, torch.device] = "cpu",
) -> tuple[CausalLM, ModelConfig]:
    """Build a :class:`CausalLM` from the checkpoint directory ``path``.

    Args:
        path: directory with ``config.json`` and safetensors weights.
        dtype: parameter dtype; defaults to the dtype recorded in ``config.json``.
        device: where the parameters live.

    Returns:
        ``(model, config)`` with the model in eval mode; ``config.dtype`` is the dtype used.

    Raises:
        ValueError: unsupported architecture (from :class:`ModelConfig`).
        FileNotFoundError: missing config, weights file or shard.
        CheckpointError: a tensor the model needs is missing, has the wrong shape or a NaN/inf value;
            or the checkpoint has tensors the model does not use (other than the ignorable ones).
    """
    config = ModelConfig.from_pretrained(path)
    if dtype is not None:
        config = replace(config, dtype=resolve_dtype(dtype))
    files = checkpoint_tensor_files(path)
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to(config.dtype).to_empty(device=device)

    by_file: dict[str, list[tuple[torch.Tensor, str]]] = defaultdict(list)
    for dest, name in _parameter_sources(model):
        if name not in files:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint at {os.fspath(path)!r}")
        by_file[files[name]].append((dest, name))
    used = {name for entries in by_file.values() for _, name in entries}
    unused = sorted(n for n in files if n not in used and not _ignorable(n, config))
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise CheckpointError(
            f"{len(unused)} tensor(s) of the checkpoint at {os.fspath(path)!r} are not used by the model "
            f"config.json describes ({config.num_layers} layers): {unused[:5]}{more}; "
            f"config.json does not match the weights")
    with torch.no_grad():
        for file, entries in by_file.items():
            with safe_open(file, framework="pt") as f:
                for dest, name in entries:
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(dest.shape):
                        raise CheckpointError(
                            f"tensor {name!r} in {os.path.basename(file)!r} has shape {list(shape)}, "
                            f"expected {list(dest.shape)} from config.json"
                        )
                    dest.copy_(f.get_tensor(name))
                    if dest.is_floating_point() and not bool(torch.isfinite(dest).all()):
                        raise CheckpointError(
                            f"tensor {name!r} in {os.path.basename(file)!r} has NaN or infinite values "
                            f"(after conversion to {dest.dtype}); the checkpoint is corrupted")
    return model.eval(), config


def _ignorable(name: str, config: ModelConfig) -> bool:
    """Checkpoint tensors kvrl has no parameter for, by design."""
    return name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and config.tie_word_embeddings)
