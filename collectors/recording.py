"""The one shape every recorder's ``with`` block has: listen, then finish whole or keep it marked."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from neuroncore.events import EventBatch


class Finishable(Protocol):
    def __call__(self, batch: EventBatch) -> None: ...

    def close(self) -> Any: ...

    def abort(self, reason: str) -> Any: ...


R = TypeVar("R", bound=Finishable)


def default_sink(sink: Any) -> Any:
    """``sink``, or the execution core's process-wide one (imported only when needed)."""
    if sink is not None:
        return sink
    from neuroncore.events import sink as core_sink

    return core_sink


@contextlib.contextmanager
def recording(recorder: R, sink: Any = None, *, started: Callable[[], None] | None = None) -> Iterator[R]:
    """Subscribe ``recorder`` to ``sink`` for the block. On normal exit it is closed (complete); on
    any exception, ``KeyboardInterrupt`` included, it is aborted with the exception as the reason
    (what was recorded is kept, marked incomplete) and the exception goes on."""
    unsubscribe = default_sink(sink).subscribe(recorder)
    if started is not None:
        started()
    try:
        yield recorder
    except BaseException as exc:
        unsubscribe()
        recorder.abort(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        raise
    unsubscribe()
    recorder.close()


__all__ = ["Finishable", "default_sink", "recording"]
