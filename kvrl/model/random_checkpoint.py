"""Random-weight Hugging Face checkpoints of real model shapes (no hub access needed).

``make_random_checkpoint`` writes ``config.json`` + safetensors the way ``save_pretrained`` does,
so kvrl and ``transformers`` load the very same weights. Presets are either ``"tiny"`` (one per
family, fast enough for CPU tests) or a named real model shape, which fixes the family.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch
import transformers

from kvrl.model.config import SUPPORTED_ARCHITECTURES, DTypeLike, resolve_dtype

# transformers 5 renamed `torch_dtype` to `dtype`.
_DTYPE_KWARG = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

_ARCHITECTURES = {family: arch for arch, family in SUPPORTED_ARCHITECTURES.items()}
_CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}

_TINY_BASE: dict[str, Any] = dict(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-6,
    # Larger than HF's 0.02 so that the top-1 logit margins of a random model are well above fp32
    # rounding and greedy decoding is reproducible across implementations.
    initializer_range=0.1,
)

#: "tiny" shape per family; each exercises that family's distinctive switches.
TINY: dict[str, dict[str, Any]] = {
    # Llama 3.1-style frequency scaling with a short original context so all three bands occur.
    "llama": dict(_TINY_BASE, rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
    "mistral": dict(_TINY_BASE, rope_theta=1e6, sliding_window=None),
    "qwen2": dict(_TINY_BASE, rope_theta=1e6, tie_word_embeddings=True),  # qkv bias is implied
    "qwen3": dict(_TINY_BASE, rope_theta=1e6, tie_word_embeddings=True),
}

_LLAMA31_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192)

#: Named real model shapes: preset -> (family, HF config kwargs).
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6b": ("qwen3", dict(
        num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
        rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6)),
    "qwen3-8b": ("qwen3", dict(
        num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6)),
    "qwen2.5-0.5b": ("qwen2", dict(
        num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
        max_position_embeddings=32768, rms_norm_eps=1e-6)),
    "qwen2.5-7b": ("qwen2", dict(
        num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False, rope_theta=1e6,
        max_position_embeddings=32768, rms_norm_eps=1e-6)),
    "llama-3.2-1b": ("llama", dict(
        num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_SCALING, factor=32.0),
        max_position_embeddings=131072, rms_norm_eps=1e-5)),
    # Llama 3.1 8B shape (Llama 3.0 8B differs only by no rope scaling and an 8k context).
    "llama-3-8b": ("llama", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=_LLAMA31_SCALING, max_position_embeddings=131072,
        rms_norm_eps=1e-5)),
    "mistral-7b": ("mistral", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32768, tie_word_embeddings=False,
        rope_theta=1e6, sliding_window=None, max_position_embeddings=32768, rms_norm_eps=1e-5)),
}


def preset_config(
    preset: str = "tiny", family: Optional[str] = None, **overrides: Any
) -> transformers.PretrainedConfig:
    """The HF config of ``preset`` (with ``overrides`` applied), without building any weights.

    ``family`` picks the tiny variant (default ``"qwen3"``); for a named preset it may be omitted
    and must match if given. Raises ``ValueError`` for an unknown preset or family.
    """
    if preset == "tiny":
        family = family or "qwen3"
        if family not in TINY:
            raise ValueError(f"unknown family {family!r}; known: {sorted(TINY)}")
        kwargs = TINY[family]
    elif preset in PRESETS:
        preset_family, kwargs = PRESETS[preset]
        if family not in (None, preset_family):
            raise ValueError(f"preset {preset!r} is a {preset_family} model, not {family}")
        family = preset_family
    else:
        raise ValueError(f"unknown preset {preset!r}; known: {['tiny', *PRESETS]}")
    config = getattr(transformers, _CONFIG_CLASSES[family])(**{**kwargs, **overrides})
    config.architectures = [_ARCHITECTURES[family]]
    return config


def make_random_checkpoint(
    path: Union[str, os.PathLike],
    family: Optional[str] = None,
    preset: str = "tiny",
    seed: int = 0,
    dtype: DTypeLike = "float32",
    max_shard_size: Union[int, str, None] = None,
    **overrides: Any,
) -> str:
    """Write a random-weight checkpoint of ``preset`` to ``path`` and return ``path``.

    Weights use HF's own initialisation seeded by ``seed`` (normal with std ``initializer_range``,
    norms at 1), so equal arguments give identical tensors. ``dtype`` (e.g. ``"float32"``,
    ``"bfloat16"``) is both the stored tensor dtype and the config's dtype. ``max_shard_size``
    (e.g. ``"200KB"``) splits the weights into shards with an index file. ``overrides`` are HF
    config kwargs (e.g. ``num_hidden_layers=4``, ``attention_bias=True``).
    """
    config = preset_config(preset, family, **overrides)
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, **{_DTYPE_KWARG: resolve_dtype(dtype)})
    shard_kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **shard_kwargs)  # safetensors is the default format
    return os.fspath(path)
