"""Model configuration parsed from a Hugging Face checkpoint's ``config.json``.

Only the decoder-only families kvrl implements are accepted (see :data:`SUPPORTED_ARCHITECTURES`);
they share one layer structure and differ in a few switches (attention biases, q/k norm, rope
scaling), which :class:`ModelConfig` records explicitly.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

#: HF architecture name -> kvrl family name.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

#: Rope types kvrl computes frequencies for.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

_DTYPE_ALIASES = {
    "fp32": torch.float32, "float": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "half": torch.float16, "float16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}

DTypeLike = Union[torch.dtype, str]


def resolve_dtype(dtype: DTypeLike) -> torch.dtype:
    """``torch.float32`` / ``"float32"`` / ``"fp32"`` (and the fp16/bf16 spellings) -> torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_ALIASES)}")
    return _DTYPE_ALIASES[name]


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters.

    Attributes:
        theta: base wavelength.
        rope_type: ``"default"``, ``"linear"`` (positions divided by ``factor``) or ``"llama3"``
            (Llama 3.1 frequency-dependent scaling).
        factor: scaling factor (linear, llama3); 1.0 for default.
        low_freq_factor / high_freq_factor / original_max_position_embeddings: llama3 parameters.
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "RopeConfig":
        """Read transformers 5's ``rope_parameters`` or the older ``rope_theta`` + ``rope_scaling``."""
        params = dict(raw.get("rope_parameters") or {})
        params.update({k: v for k, v in (raw.get("rope_scaling") or {}).items() if k not in params})
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope type {rope_type!r}; kvrl supports {SUPPORTED_ROPE_TYPES}")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported")
        if rope_type == "default":
            return cls(theta=float(theta))
        try:
            if rope_type == "linear":
                return cls(theta=float(theta), rope_type=rope_type, factor=float(params["factor"]))
            return cls(
                theta=float(theta),
                rope_type=rope_type,
                factor=float(params["factor"]),
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            )
        except KeyError as e:
            raise ValueError(f"rope type {rope_type!r} needs parameter {e.args[0]!r}") from None


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a supported decoder-only causal LM.

    Attributes:
        architecture: HF class name, e.g. ``"Qwen3ForCausalLM"``.
        family: ``"llama" | "mistral" | "qwen2" | "qwen3"``.
        hidden_size / intermediate_size / vocab_size: model widths.
        num_layers / num_heads / num_kv_heads / head_dim: attention geometry (GQA when
            ``num_kv_heads < num_heads``; ``head_dim`` may differ from ``hidden_size // num_heads``).
        rms_norm_eps: RMSNorm epsilon.
        rope: rotary embedding parameters.
        qkv_bias / o_bias / mlp_bias: whether those projections carry a bias.
        qk_norm: per-head RMSNorm on queries and keys before rope (Qwen3).
        tie_word_embeddings: the LM head reuses the input embedding matrix.
        max_position_embeddings: longest position the checkpoint was configured for.
        sliding_window: attention window of the checkpoint, None when attention is global.
            kvrl always attends globally, so it is exact only up to :attr:`max_model_len`.
        dtype: parameter dtype stored in the checkpoint config (float32 when absent).
    """

    architecture: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: Optional[int]
    dtype: torch.dtype

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike]) -> "ModelConfig":
        """Parse ``<path>/config.json``; raises ``FileNotFoundError`` if it is absent."""
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"no config.json in checkpoint directory {os.fspath(path)!r}")
        with open(config_path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Parse a ``config.json`` dict (also what ``PretrainedConfig.to_dict()`` returns).

        Raises ``ValueError`` for an unsupported architecture, rope type or activation.
        """
        archs = raw.get("architectures") or []
        architecture = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ValueError(
                f"unsupported architecture {archs or raw.get('model_type')!r}; "
                f"kvrl supports {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        family = SUPPORTED_ARCHITECTURES[architecture]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported activation {act!r}; kvrl implements silu-gated MLPs")
        num_heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        # Mistral always applies its window; Qwen2/3 only with use_sliding_window; Llama never.
        windowed = family == "mistral" or bool(raw.get("use_sliding_window", False))
        dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        return cls(
            architecture=architecture,
            family=family,
            hidden_size=raw["hidden_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(raw),
            qkv_bias=family == "qwen2" or (family in ("llama", "qwen3") and attention_bias),
            o_bias=family in ("llama", "qwen3") and attention_bias,
            mlp_bias=family == "llama" and bool(raw.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            sliding_window=raw.get("sliding_window") if windowed else None,
            dtype=resolve_dtype(dtype),
        )

    @property
    def q_size(self) -> int:
        """Query projection width, ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Key (or value) projection width, ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def max_model_len(self) -> int:
        """Longest context kvrl serves exactly: ``max_position_embeddings`` capped by the sliding window."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    def kv_bytes_per_token(self, dtype: Optional[DTypeLike] = None) -> int:
        """Bytes of K and V cache one token occupies across all layers (cache dtype defaults to ``dtype``)."""
        itemsize = resolve_dtype(self.dtype if dtype is None else dtype).itemsize
        return 2 * self.num_layers * self.kv_size * itemsize

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count (a tied LM head counts once).

        ``include_embeddings=False`` leaves out the input embedding table only (the LM head, which
        costs matmul FLOPs, stays), which is the count a per-token FLOP model wants.
        """
        h, d = self.hidden_size, self.head_dim
        qkv_out = self.q_size + 2 * self.kv_size
        attn = h * qkv_out + self.q_size * h
        attn += qkv_out * self.qkv_bias + h * self.o_bias + 2 * d * self.qk_norm
        mlp = 3 * h * self.intermediate_size + (2 * self.intermediate_size + h) * self.mlp_bias
        per_layer = attn + mlp + 2 * h
        table = self.vocab_size * h
        body = self.num_layers * per_layer + h + table  # layers, final norm, LM head
        if not include_embeddings:
            return body
        return body if self.tie_word_embeddings else body + table
