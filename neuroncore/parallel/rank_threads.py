"""Running one body per rank on its own thread, the way every multi-rank execution of the core runs
(tensor-parallel inference, data-parallel and ZeRO-1 training): ranks meet in their collectives at a
barrier, so a rank that fails must abort it, or the others would wait for it forever."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_ranks(ranks: int, body: Callable[[int], None], barrier: threading.Barrier, label: str) -> None:
    """``body(rank)`` for every rank on a thread named ``<label>-rank-<r>``; waits for all of them.

    A rank that raises aborts ``barrier`` (the others then fail with ``BrokenBarrierError``); the
    first real error is raised here, a ``BrokenBarrierError`` only if nothing else went wrong."""
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            body(rank)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), name=f"{label}-rank-{r}") for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
