"""Plugin contracts are abstract: a plugin that lacks a required method cannot be built."""
from __future__ import annotations

import pytest

from kvrl.plugins.evictions import ModeParams, _ByKey


def test_a_by_key_eviction_without_key_cannot_be_instantiated():
    class _NoKey(_ByKey):
        pass

    with pytest.raises(TypeError, match="abstract method.*key"):
        _NoKey(ModeParams())
