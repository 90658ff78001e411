"""``kvrl-attack``: isolation experiments against the engine (docs/security.md).

Commands (the first argument; the rest are Hydra overrides of ``conf/attack.yaml``)::

    kvrl-attack prefix-probe [backend=live model=tiny] [workload.num_probes=200] ...
    kvrl-attack fill-squeeze [attack.only=[undefended,all]] [engine.num_blocks=2048] ...
    kvrl-attack benign-cost  [workload=multi_tenant] [engine.num_blocks=1024] ...

* ``prefix-probe``: an attacker tenant sends candidate prefixes of a victim tenant's system prompt
  (the ``prefix_probe`` workload: some correct, some wrong) and infers "correct" from its own
  time to first token (a prefix-cache hit is fast). The attacker's threshold is chosen without
  the labels (2-means on the TTFTs, fast cluster = hit); the harness then scores it against the
  labels: reconstruction accuracy (Wilson 95% interval, Fisher's exact test of prediction vs
  label), the TTFT gap wrong - correct (mean, bootstrap 95% interval, permutation test) and the
  AUC, once per ``attack.scopes`` value of ``engine.prefix_cache_scope`` (tenant, global).
  By default every probe comes from its own attacker account (``attack.accounts=per_probe``), so
  a probe can only hit the victim's cache, never the attacker's own earlier probes.
* ``fill-squeeze``: the ``fill_and_squeeze`` workload (attack strength from ``attack.fill_squeeze``)
  with and without the attacker's requests, once per defence of ``attack.defences``; reports the
  benign tenants' goodput (SLO-meeting output tokens per second of their arrival span), its
  fraction of the undefended no-attack baseline, SLO attainment, p99 TTFT and preemptions per
  benign request, and plots them.
* ``benign-cost``: every defence on a workload without an attacker (default ``multi_tenant``):
  goodput, throughput, p99 TTFT and preemptions relative to the undefended engine.

Each writes ``<command>.json`` and ``<command>.md`` (and a PNG or CSV) into the Hydra run
directory, ``runs/attack/<command>/<date>/<time>`` by default, and prints the Markdown table.
The experiments are library code, one module each in :mod:`kvrl.attacks`; this app composes the
config and calls them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kvrl.attacks.benign_cost import run_benign_cost
from kvrl.attacks.config import DEFAULT_WORKLOAD, AttackOptions
from kvrl.attacks.fill_squeeze import run_fill_squeeze
from kvrl.attacks.prefix_probe import run_prefix_probe

COMMANDS = {"prefix-probe": "prefix_probe", "fill-squeeze": "fill_squeeze", "benign-cost": "benign_cost"}


def register_attack_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from kvrl.apps.schema import RunSchema

    @dataclass
    class AttackSchema(RunSchema):
        command: str = "prefix_probe"
        attack: AttackOptions = field(default_factory=AttackOptions)

    ConfigStore.instance().store(name="attack_schema", node=AttackSchema)


RUNNERS = {"prefix_probe": run_prefix_probe, "fill_squeeze": run_fill_squeeze, "benign_cost": run_benign_cost}


def run(cfg: Any, out_dir: Path) -> dict:
    if cfg.command not in RUNNERS:
        raise ValueError(f"command must be one of {sorted(RUNNERS)}, got {cfg.command!r}")
    return RUNNERS[cfg.command](cfg, Path(out_dir))


def _hydra_entry() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from kvrl import plugins
    from kvrl.apps.outputs import atomic_write
    from kvrl.apps.schema import register_schemas, validate_config

    plugins.load_entry_points()
    plugins.available("scheduler")
    register_schemas()
    register_attack_schema()

    @hydra.main(config_path="pkg://kvrl.conf", config_name="attack", version_base="1.3")
    def _main(cfg) -> None:
        validate_config(cfg)             # every key checked before any experiment runs
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)))
        run(cfg, out_dir)
        print((out_dir / f"{cfg.command}.md").read_text())
        print(f"-> {out_dir}")

    _main()


USAGE = """usage: kvrl-attack COMMAND [hydra overrides...]

commands:
  prefix-probe   cross-tenant prefix-cache timing attack, per engine.prefix_cache_scope
  fill-squeeze   fill-and-squeeze memory attack, benign goodput per defence
  benign-cost    the defences on a workload without an attacker

e.g.  kvrl-attack prefix-probe workload.num_probes=200
      kvrl-attack fill-squeeze attack.only=[undefended,all]
      kvrl-attack benign-cost workload=azure_code engine.num_blocks=1024
See docs/security.md and conf/attack.yaml."""


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command = args.pop(0)
    if command not in COMMANDS:
        print(f"kvrl-attack: unknown command {command!r}; known commands: {', '.join(COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    key = COMMANDS[command]
    extra = [f"command={key}"]
    if not any(a.split("=", 1)[0].lstrip("+~") == "workload" for a in args):
        extra.append(f"workload={DEFAULT_WORKLOAD[key]}")
    sys.argv = [sys.argv[0], *extra, *args]
    _hydra_entry()
    return 0


if __name__ == "__main__":
    sys.exit(main())
