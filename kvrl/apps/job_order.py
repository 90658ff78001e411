"""The order in which kvrl-eval runs one seed's policies (``job_order``; docs/rl.md, "A third VM, and a control")."""
from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")

#: ``job_order``: the order of one seed's policies. ``listed``: as listed (baselines, then the val picks, then the
#: agents); ``rotate``: the ``i``-th seed's list rotated by ``i``, so each policy runs in every position equally often;
#: ``auto``: ``rotate`` on the live backend, ``listed`` in the sim (where order changes nothing)
JOB_ORDERS = ("auto", "listed", "rotate")


def job_order(policies: Sequence[T], seed_index: int, order: str, backend: str) -> list[T]:
    """One seed's policies in the order they run (:data:`JOB_ORDERS`). Live, the jobs of a seed run one after
    another on one host, whose speed drifts between jobs; in session 32 the first job of each seed ran on a
    1-2% faster host than the later ones (docs/rl.md, "A third VM, and a control"), so a fixed
    order would favour the policies listed first (the baselines) in every live comparison."""
    if order == "listed" or (order == "auto" and backend != "live") or not policies:
        return list(policies)
    k = seed_index % len(policies)
    return list(policies[k:]) + list(policies[:k])
