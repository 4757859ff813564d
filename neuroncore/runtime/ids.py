"""Model and execution ids: who hands them out, and over what scope they are unique.

Scope: the process. One process may hold several ``Instance`` objects, each with its own sink or the
shared default one, and a tensor-parallel group loads one program on many cores; a profile, the live
state and ``neuron-top`` join records by these ids, so two models or two executions of one process
never share an id, whichever instance, core or sink they belong to. Ids start at 1 and only grow;
a forked child continues its parent's sequence (its records carry its own pid).

The one ``IdSource`` of the process is ``PROCESS_IDS``; the runtime takes ids from it and from
nowhere else.
"""

from __future__ import annotations

import itertools
import threading


class IdSource:
    """Thread-safe counters of model ids and execution ids (each from 1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models = itertools.count(1)
        self._executions = itertools.count(1)

    def next_model_id(self) -> int:
        """The id of a program newly loaded onto a core."""
        with self._lock:
            return next(self._models)

    def next_execution_id(self) -> int:
        """The id of an execution, taken when it is put on its core's clock."""
        with self._lock:
            return next(self._executions)


PROCESS_IDS = IdSource()
"""The process's id source (see the module docstring for why the scope is the process)."""

__all__ = ["PROCESS_IDS", "IdSource"]
