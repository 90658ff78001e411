"""The profile file format: its name and versions, the key a profile is valid for (a device and
a model shape), and the error of an unusable profile. See :mod:`kvrl.executors.profile`.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Union

from kvrl.executors.hardware import DeviceSpec, ModelShape


FORMAT = "kvrl-step-profile"


VERSION = 1


FIT_VERSION = 13


#: stored models of these fit versions load as they are (version 5 lacks ``pre_max_ctx`` and
#: ``token_sizes``, versions 5-6 lack the ``dec_shared`` terms, versions 5-7 the host-work terms,
#: versions 5-8 ``mixed_dec`` and the host terms of the previous step's prefill tokens and of swaps,
#: versions 5-9 ``mixed_shared``, versions 5-10 ``per_wait_step``: those then price as zero / no
#: padding / as private KV tokens / as ``dec_shared`` / as zero, and the old predictions are unchanged;
#: versions 5-11 price every prefix-cache token of a decode as shared, version 12 the co-read ones only;
#: versions 5-12 have no path term: a mixed step on a split whole-step graph is priced as on the plain one)
LOADABLE_FIT_VERSIONS = (5, 6, 7, 8, 9, 10, 11, 12, 13)


SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "vocab_size", "dtype_bytes")


class ProfileError(ValueError):
    """A profile file that cannot be used (wrong format, missing fields)."""


def device_key(name: str) -> str:
    """Normalised device name: ``h200``/``h100``/``a100`` for those GPUs (as the live executor's
    :func:`_device_spec` maps them), ``cpu``, or a slug of any other name."""
    low = name.lower()
    for key in ("h200", "h100", "a100"):
        if key in low:
            return key
    if low in ("cpu", "") or low.startswith("cpu"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", low).strip("-")


@dataclass(frozen=True)
class ProfileKey:
    """What a profile is valid for: a device and a model shape."""

    device: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int

    @classmethod
    def of(cls, shape: ModelShape, device: Union[DeviceSpec, str]) -> "ProfileKey":
        name = device.name if isinstance(device, DeviceSpec) else device
        return cls(device_key(name), *(int(getattr(shape, f)) for f in SHAPE_FIELDS))

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileKey":
        try:
            return cls(device_key(str(d["device"])), *(int(d[f]) for f in SHAPE_FIELDS))
        except KeyError as exc:
            raise ProfileError(f"profile key lacks {exc.args[0]!r}") from None

    def describe(self) -> str:
        return (f"device={self.device} layers={self.num_layers} hidden={self.hidden_size} heads={self.num_heads}/"
                f"{self.num_kv_heads}x{self.head_dim} inter={self.intermediate_size} vocab={self.vocab_size} "
                f"dtype_bytes={self.dtype_bytes}")

    def mismatch(self, other: "ProfileKey") -> list[str]:
        """Fields that differ, as ``name: mine != theirs``."""
        return [f"{k}: {v} != {getattr(other, k)}" for k, v in asdict(self).items() if getattr(other, k) != v]


def round_floats(x: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits (keeps profile files small)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: round_floats(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [round_floats(v, digits) for v in x]
    return x
