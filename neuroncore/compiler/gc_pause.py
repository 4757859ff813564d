"""Python's cyclic garbage collector held off while a program is compiled.

Lowering makes millions of small objects that live until the program is assembled (recorded
accesses, dependency lists, node records) and almost no reference cycles. With the collector on,
every 700 allocations start a young-generation pass, and the survivors are scanned again in the
older generations: on the 32-layer Llama-2-7B decode that was ~20-25 % of the compile's CPU time
(4.4-4.9 s with the collector off against 5.5-6.0 s on, same program). So a compile runs with the
collector paused and turns it back on as it found it. Nested compiles (a weight-prefetch pass
schedules the program once) and threads that compile at the same time are fine: the collector is
on again once the outermost pause ends, and a pause only switches it back on if it was on when the
pause began.

What a compile keeps (the program: ~580,000 tracked records on that decode) is long-lived, and a
compile leaves no reference cycle (`tests/neuroncore/test_compile_speed.py` checks decode, prefill
and BERT). Switched back on as it was, the collector would traverse all of it in its next
young-generation pass (0.15-0.25 CPU s on that decode, paid by the first allocation after the
pause) and again when the middle generation is collected, only to promote it. So the outermost
pause moves every tracked object into the oldest generation at once (`gc.freeze()` then
`gc.unfreeze()`: no object is traversed), as the young passes would have done; a cycle among them
would wait for the next full collection. If the process had frozen objects of its own
(`gc.get_freeze_count()`), nothing is moved: unfreezing would release them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with ``gc`` disabled (if it was enabled), restoring it afterwards."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                if gc.get_freeze_count() == 0:
                    _promote_survivors()
                gc.enable()


def _promote_survivors() -> None:
    """Move every object the collector tracks into its oldest generation without a pass."""
    gc.freeze()  # every generation into the permanent one (and the young count reset) ...
    gc.unfreeze()  # ... and the permanent one into the oldest: no object is traversed


__all__ = ["collector_paused"]
