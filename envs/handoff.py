"""Hand decisions taken inside an engine step to an environment's ``step()`` and back.

The engine asks its eviction policy for a victim in the middle of a step, while Gymnasium wants
``step(action)`` to return with the next decision's observation. :class:`Handoff` runs the
serving loop in a worker thread that blocks in :meth:`Handoff.ask` until the environment replies;
exactly one of the two threads runs at any time, so episodes stay deterministic. Abandoning an
episode (reset, close) unwinds the worker with :class:`EpisodeAbandoned`, a ``BaseException``
so that the engine's policy-fault isolation (which catches ``Exception``) lets it through.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional


class EpisodeAbandoned(BaseException):
    """Raised inside the serving thread when its episode is abandoned."""


_ABANDON = object()


class Handoff:
    """One serving thread at a time, and the two queues between it and the environment."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._to_env: "queue.SimpleQueue[tuple[str, Any]]" = queue.SimpleQueue()
        self._to_engine: "queue.SimpleQueue[Any]" = queue.SimpleQueue()

    def start(self, serve: Callable[[], None]) -> tuple[str, Any]:
        """Run ``serve`` in a new thread (abandoning any previous one) and wait for its first
        message: ``("decide", payload)`` or ``("end", None)``."""
        self.abandon()
        self._thread = threading.Thread(target=self._run, args=(serve,), name="kvrl-env-engine", daemon=True)
        self._thread.start()
        return self._wait()

    def _run(self, serve: Callable[[], None]) -> None:
        try:
            serve()
            self._to_env.put(("end", None))
        except EpisodeAbandoned:
            pass
        except BaseException as exc:   # handed to the environment, which raises it
            self._to_env.put(("error", exc))

    def _wait(self) -> tuple[str, Any]:
        kind, value = self._to_env.get()
        if kind == "error":
            self._thread.join()
            raise value
        if kind == "end":
            self._thread.join()
        return kind, value

    def ask(self, payload: Any) -> Any:
        """Serving thread: hand ``payload`` to the environment and block until it replies."""
        self._to_env.put(("decide", payload))
        reply = self._to_engine.get()
        if reply is _ABANDON:
            raise EpisodeAbandoned
        return reply

    def reply(self, answer: Any) -> tuple[str, Any]:
        """Environment: answer the pending :meth:`ask` and wait for the next message."""
        if not self.waiting:
            raise RuntimeError("no decision is pending (the episode ended; call reset())")
        self._to_engine.put(answer)
        return self._wait()

    @property
    def waiting(self) -> bool:
        """Whether the serving thread is blocked in :meth:`ask`."""
        return self._thread is not None and self._thread.is_alive()

    def abandon(self) -> None:
        """Unwind a serving thread blocked in :meth:`ask` (no-op when there is none)."""
        if self.waiting:
            self._to_engine.put(_ABANDON)
            self._thread.join()
        self._thread = None
