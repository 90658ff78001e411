"""Renders the plugin reference (docs/plugins.md) from the registry: one section per kind, one
paragraph per built-in plugin (its docstring) with its parameters and defaults.

    python -m kvrl.plugins.docs > docs/plugins.md
"""
from __future__ import annotations

import dataclasses
import inspect

from kvrl import plugins
from kvrl.plugins.registry import OPTIONAL_KINDS

KIND_INTRO = {
    "scheduler": "Orders the waiting queue; the engine admits in that order while the token budget, "
                 "`engine.max_num_seqs` and the watermark allow.",
    "watermark": "How many free blocks must remain after an admission or a swap-in.",
    "eviction": "Victim and mode (swap or recompute) when a running sequence needs a block and none is free.",
    "prefix_cache": "How full blocks are matched by chained hash, and which freed cached blocks are reclaimed first.",
    "tier": "Whether a prefix block the GPU cache reclaims is offloaded to the CPU tier or dropped; used only with "
            "`engine.cpu_tier_blocks` > 0, optional in configs (absent = `offload_all`). See docs/tiers.md.",
}


CONTRACTS = """\
## Contracts, faults and cost

What the engine enforces for every plugin, built-in or third-party (issue #15):

- **Methods.** Each kind's required methods are abstract: `scheduler` `key`; `watermark`
  `reserved_blocks`; `eviction` `select`; `prefix_cache` `lookup`, `insert`, `on_release`,
  `on_acquire`, `evict`, `num_evictable`, `num_cached`; `tier` `offload`. A plugin that lacks one (or misspells it)
  fails at creation, naming it, before any request is served.
- **Bulk prefix-cache calls.** The block pool registers, releases and reclaims blocks in batches
  (a sequence's new full blocks, a finished sequence's blocks, an allocation's reclaims) through
  `insert_blocks(entries, now)` (entries `(block_hash, parent_hash, block_id)`; one truth value per
  entry), `on_release_blocks(block_ids, now)` and `evict_blocks(n)` (`n` distinct evictable blocks,
  or all that are left). Their defaults loop over `insert`, `on_release` and `evict`, so a plugin
  with only the per-block methods works unchanged; one that overrides a bulk method must answer as
  the per-block calls would. A subclass that overrides a per-block method but not its bulk one
  gets the default loop, so subclassing a built-in never bypasses the override. A bulk call that
  raises or answers outside its contract is one policy error and none of its answers is used.
- **Parameters.** A plugin's `Params` dataclass is validated from its declarations when the plugin
  is created, for third-party plugins exactly as for the built-ins: `Literal[...]` fields accept
  only the listed values (`mode: Literal["recompute", "swap"] = "recompute"` makes
  `eviction.mode=swapp` an error naming `eviction.mode`), `bool`/`int`/`float`/`str` fields only
  values of that type (`Optional[...]` also None), and `field(default=..., metadata={"range": (lo, hi)})`
  bounds a number. `__post_init__` checks run first and may add anything else.
- **Views.** Policies get read-only views (`kvrl/engine/views.py`): no attribute can be set, and
  the engine and sequences behind a view are not reachable through it (`view._seq` and
  `view._engine` do not exist).
- **Return values.** A victim must be one of the candidates; a reservation must be an integer
  count in `[0, num_blocks]` (out of range is an error, never clamped); `order()` must return a
  permutation of the waiting views; keys must compare with each other; a prefix cache's `lookup`
  must name a block registered under that hash and `evict` an evictable block (not one in use).
- **Faults.** `engine.policy_errors=isolate` (default): a policy call that raises or breaks its
  contract is a *policy error*, counted in `metrics.json` (`policy_errors`; one warning per policy
  kind and error type, with the totals logged at the end of the run) and replaced by a fallback
  that affects only the request concerned: a failing `key` queues that request FCFS behind the
  ranked ones, a failing `order` uses FCFS for the step, a failing watermark uses vLLM's
  `int(0.01 * num_blocks)` for the call (`admit` admits), a failing eviction aborts only the
  request whose sequence needed the block (its other samples leave the step's batch with their
  blocks freed), a failing prefix-cache call means no caching for that call (a miss, a private
  block, or the oldest evictable block reclaimed; nothing aborted), a failing hook drops the
  event. `engine.policy_errors=raise` stops the run at the first one (`PolicyError`), for debugging.
  Aborted requests count as failures in `slo_attainment`; a run with aborts or policy errors is
  not comparable with a clean one.
- **Cost.** Every policy call is timed (`policy_time_s` in `metrics.json`, wall seconds of the
  outermost calls). `engine.charge_policy_time=true` adds that time to the simulated clock, step by
  step, so a slow policy costs what it would cost a server (default false; the live executor
  ignores it, since its step times already include the engine's host time between steps, which it
  reports as `host_gap_s` and `long_host_gaps`, the gaps over 50 ms).
"""


def _default(f: dataclasses.Field):
    """A field's default value (built by its ``default_factory`` where it has one)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def render() -> str:
    lines = ["# Plugin reference", "",
             "Generated by `python -m kvrl.plugins.docs` from the registered plugins. Select a plugin with "
             "`<kind>=<name>` and set its parameters with `<kind>.<param>=<value>` on any kvrl Hydra app.", "",
             CONTRACTS]
    for kind in (*plugins.KINDS, *OPTIONAL_KINDS):
        lines += [f"## `{kind}`", "", KIND_INTRO[kind], ""]
        for name in plugins.available(kind):
            spec = plugins.get_spec(kind, name)
            if not spec.cls.__module__.startswith("kvrl.plugins."):
                continue   # third-party plugins document themselves
            params = [f"`{f.name}` = `{_default(f)!r}`" for f in dataclasses.fields(spec.params_cls)]
            lines += [f"### `{kind}={name}`", "", inspect.cleandoc(spec.cls.__doc__ or "(undocumented)"), "",
                      f"Parameters: {', '.join(params) if params else 'none'}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
