"""Is an agent's scenario the one it is evaluated on? The keys of two run configs that change the
task, and the newest saved agent of a scenario.

The task is what the agent faces: the workload (split and seed aside: each evaluation job sets
its own), the engine's pool and batch sizes, the SLOs, the model, the device, the sim's step-time
profile (when both run in the sim) and the plugins around the agent (scheduler, prefix cache, and
the watermark or eviction slot the agent does not drive). Not the task: the executor backend (a
sim-trained agent may run live; said in a note, not flagged), seeds, and the engine's harness keys
(``engine.pause_gc``, ``engine.seed``, ``engine.policy_errors``). A key that one side lacks
(added to kvrl after the agent was saved, or removed since) counts at its default where a schema
gives one (engine, device, SLOs, workload, plugin parameters) and is not compared otherwise.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

log = logging.getLogger("kvrl.scenario")

TASK_SECTIONS = ("workload", "engine", "slo", "model", "device", "scheduler", "prefix_cache", "watermark",
                 "eviction")
NOT_TASK_KEYS = frozenset({"workload.split", "workload.seed", "engine.pause_gc", "engine.seed",
                           "engine.policy_errors"})
PLUGIN_SECTIONS = ("scheduler", "prefix_cache", "watermark", "eviction")


@dataclass(frozen=True)
class Difference:
    """A task key whose value differs: as trained (the agent's ``agent.json``) and here."""

    key: str
    trained: Any
    here: Any

    def __str__(self) -> str:
        return f"{self.key} (trained {_short(self.trained)}, here {_short(self.here)})"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _with_defaults(section: str, node: Any) -> Any:
    """``node`` with the defaults of its schema filled in (unchanged where none applies or the node
    does not validate: then its keys are compared as they are)."""
    if not isinstance(node, Mapping):
        return node
    node = dict(node)
    try:
        if section == "workload":
            from kvrl.workloads import resolve_config
            return resolve_config(node)
        if section in ("engine", "device", "slo"):
            from kvrl.apps.schema import SLOConfig
            from kvrl.engine.config import EngineConfig
            from kvrl.executors.hardware import DeviceSpec
            cls = {"engine": EngineConfig, "device": DeviceSpec, "slo": SLOConfig}[section]
            names = {f.name for f in dataclasses.fields(cls)}
            filled = dataclasses.asdict(cls(**{k: v for k, v in node.items() if k in names}))
            return {**node, **filled}
        if section in PLUGIN_SECTIONS and "name" in node:
            from kvrl import plugins
            params = plugins.make_params(section, node["name"], **{k: v for k, v in node.items() if k != "name"})
            return {"name": node["name"], **dataclasses.asdict(params)}
    except (TypeError, ValueError, KeyError) as exc:
        log.debug("%s: compared as given (%s)", section, exc)
    return node


def _differ(a: Any, b: Any, key: str) -> list[Difference]:
    if key in NOT_TASK_KEYS:
        return []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if "name" in a and "name" in b and a["name"] != b["name"]:
            return [Difference(f"{key}.name", a["name"], b["name"])]
        return [d for k in sorted(set(a) & set(b)) for d in _differ(a[k], b[k], f"{key}.{k}")]
    return [] if a == b else [Difference(key, a, b)]


def task_differences(trained: Mapping[str, Any], here: Mapping[str, Any], role: str) -> list[Difference]:
    """The task keys (module docs) whose values differ between the run config an agent was
    trained on (``trained``) and ``here``; ``role`` is the plugin slot the agent drives."""
    out = []
    for section in TASK_SECTIONS:
        if section != role:
            out += _differ(_with_defaults(section, trained.get(section)), _with_defaults(section, here.get(section)),
                           section)
    a, b = trained.get("backend") or {}, here.get("backend") or {}
    if a.get("name") == b.get("name") == "sim" and a.get("profile") != b.get("profile"):
        out.append(Difference("backend.profile", a.get("profile"), b.get("profile")))
    return out


def agent_differences(meta: Mapping[str, Any], run: Mapping[str, Any], role: str) -> list[Difference]:
    """:func:`task_differences` between the scenario of a saved agent (its ``agent.json``, ``meta``)
    and ``run``, and ``env.episode.workloads`` when the agent was trained on a mixture of workload
    families: a policy trained on several families is not one trained on this scenario alone, even
    where the scenario is one of them."""
    out = task_differences(meta["env"]["run"], run, role)
    families = (meta["env"].get("episode") or {}).get("workloads")
    if families is not None:
        out.append(Difference("env.episode.workloads", families, None))
    return out


def newest_agent(env_id: str, run: Mapping[str, Any], train_dir: Path, role: str) -> Path:
    """The model zip of the newest run under ``train_dir`` (by its model file's time) trained on
    ``env_id`` in the scenario ``run`` (no :func:`task_differences`). ``FileNotFoundError`` says
    there is none, and what the newest agent of ``env_id`` on another scenario differs in."""
    from kvrl.envs.agent_io import META_NAME, AgentNotFound, model_path

    same, other = [], []
    for meta_file in Path(train_dir).rglob(META_NAME):
        try:
            meta = json.loads(meta_file.read_text())
            model = model_path(meta_file.parent)
        except (OSError, ValueError, AgentNotFound):
            continue                           # a run still without a model, or an unreadable agent.json
        if meta.get("env_id") != env_id:
            continue
        diff = agent_differences(meta, run, role)
        (other if diff else same).append((model.stat().st_mtime, str(model), diff))
    if same:
        return Path(max(same)[1])
    hint = ""
    if other:
        _, path, diff = max(other, key=lambda t: t[:2])
        hint = (f"; {len(other)} agent(s) of {env_id} there were trained on other scenarios (the newest, {path}, "
                f"differs in: {', '.join(map(str, diff))})")
    raise FileNotFoundError(f"agents=[latest]: no agent trained on {env_id} in this scenario under {train_dir}{hint} "
                            f"(run kvrl-train on this scenario, set train_dir, or list agents=[<run dir>, ...])")


def describe_differences(diff: list[Difference], limit: Optional[int] = None) -> str:
    """``key (trained x, here y), ...`` (the first ``limit``, and how many more)."""
    shown = diff if limit is None else diff[:limit]
    more = f", and {len(diff) - len(shown)} more" if len(shown) < len(diff) else ""
    return ", ".join(map(str, shown)) + more
