"""The experiments' options (``attack.*`` of ``conf/attack.yaml``), each command's preset and the
defences: configs derived from the composed run config, never changing it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kvrl.attacks.common import deep_merge, plain


DEFAULT_WORKLOAD = {"prefix_probe": "prefix_probe", "fill_squeeze": "fill_and_squeeze",
                    "benign_cost": "multi_tenant"}


def _default_defences() -> dict:
    return {"undefended": {}}


@dataclass
class AttackOptions:
    """Options of the experiments (``attack.*``)."""

    scopes: List[str] = field(default_factory=lambda: ["tenant", "global"])
    probers: List[str] = field(default_factory=lambda: ["plain"])   # plain | forge | salt_spoof
    prefix_hashes: Optional[List[str]] = None   # engine.prefix_hash values to attack (null: the config's)
    accounts: str = "per_probe"        # per_probe | single: attacker accounts sending the probes
    threshold: str = "kmeans_log"      # the attacker's label-free rule: kmeans_log | kmeans
    resamples: int = 2000              # bootstrap and permutation resamples
    defences: Dict[str, Any] = field(default_factory=_default_defences)
    only: Optional[List[str]] = None   # run only these defences (names of attack.defences)
    baseline: str = "undefended"       # the defence whose no-attack run is the reference
    attacker: str = "attacker"         # tenant name of the attacker (fill-squeeze)
    fill_squeeze: Dict[str, Any] = field(default_factory=dict)   # workload preset of fill-squeeze
    prefix_probe: Dict[str, Any] = field(default_factory=dict)   # workload preset of prefix-probe
    benign_cost: Dict[str, Any] = field(default_factory=dict)    # workload preset of benign-cost
    plot_bin_s: float = 2.0            # time bin of the fill-squeeze goodput plot
    plot_defence: Optional[str] = "recommended"   # defence drawn over time (null or absent: the best)


PRESET_KEYS = ("workload", "engine", "slo")


def _explicit_keys() -> list[list[str]]:
    """Dotted keys under ``workload``/``engine``/``slo`` the user set on the command line."""
    try:
        from hydra.core.hydra_config import HydraConfig
        overrides = HydraConfig.get().overrides.task
    except Exception:
        return []
    keys = []
    for o in overrides:
        k = o.split("=", 1)[0].lstrip("+~")
        parts = k.split(".")
        if len(parts) > 1 and parts[0] in PRESET_KEYS:
            keys.append(parts)
    return keys


def preset_config(cfg: Any, command: str) -> Any:
    """``cfg`` with the command's preset ``attack.<command>`` (keys ``workload``, ``engine``, ``slo``)
    merged over it, except for the keys the user set explicitly on the command line. A workload
    preset applies only while ``workload`` is the command's default workload."""
    from omegaconf import OmegaConf
    preset = plain(cfg.attack.get(command) or {})
    unknown = sorted(set(preset) - set(PRESET_KEYS))
    if unknown:
        raise ValueError(f"attack.{command}: unknown key(s) {unknown}; known: {list(PRESET_KEYS)}")
    if preset.get("workload") and cfg.workload.name != DEFAULT_WORKLOAD[command]:
        preset.pop("workload")
    out = OmegaConf.create(plain(cfg))
    if not preset:
        return out
    before = plain(cfg)
    merged = deep_merge(before, preset)
    for path in _explicit_keys():
        src, dst = before, merged
        for part in path[:-1]:
            if not (isinstance(src, dict) and isinstance(dst, dict) and part in src and part in dst):
                break
            src, dst = src[part], dst[part]
        else:
            if isinstance(src, dict) and path[-1] in src and isinstance(dst, dict):
                dst[path[-1]] = src[path[-1]]
    return OmegaConf.create(merged)


def with_policy(cfg: Any, overrides: dict) -> Any:
    """A copy of ``cfg`` with policy/engine nodes replaced (a node with ``name``) or merged."""
    from omegaconf import OmegaConf
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    for key, node in (overrides or {}).items():
        if key not in ("scheduler", "watermark", "eviction", "prefix_cache", "engine", "slo"):
            raise ValueError(f"attack.defences: unknown key {key!r} (known: scheduler, watermark, eviction, "
                             f"prefix_cache, engine, slo)")
        node = plain(node)
        if isinstance(node, dict) and "name" in node and key != "engine":
            out[key] = node
        else:
            out[key] = deep_merge(plain(out[key]), node)
    return out


def selected_defences(cfg: Any) -> dict:
    defences = plain(cfg.attack.defences)
    only = plain(cfg.attack.only)
    if only:
        unknown = [d for d in only if d not in defences]
        if unknown:
            raise ValueError(f"attack.only: unknown defence(s) {unknown}; known: {sorted(defences)}")
        defences = {k: defences[k] for k in only}
    base = cfg.attack.baseline
    if base not in defences:
        all_defences = plain(cfg.attack.defences)
        if base not in all_defences:
            raise ValueError(f"attack.baseline={base!r} is not in attack.defences ({sorted(all_defences)})")
        defences = {base: all_defences[base], **defences}
    return defences


def policy_label(cfg: Any) -> str:
    def one(node):
        node = plain(node)
        name = node.pop("name")
        args = ", ".join(f"{k}={v}" for k, v in node.items() if v is not None)
        return f"{name}({args})" if args else name
    return f"{one(cfg.watermark)} / {one(cfg.eviction)}"
