"""Listeners other packages attach to every process that runs compiled models, by name only.

The core must not import the packages that record what it does (collectors, formats), yet a process
started under ``neuron-profile capture`` or watched by ``neuron-top`` has to record without any code
change. So the core looks up the Python entry points of group ``neuronscope.sink_listeners`` the
first time an :class:`~neuroncore.runtime.Instance` is made, and calls each with the event sink it
reports to. A listener that fails to load is reported once as a warning and never stops the model.
``NEURONSCOPE_PLUGINS=0`` turns the lookup off.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from importlib.metadata import entry_points

from neuroncore.events import EventSink
from neuronscope import settings

GROUP = "neuronscope.sink_listeners"
_activated: weakref.WeakSet[EventSink] = weakref.WeakSet()  # ids would be reused after a sink dies
_lock = threading.Lock()


def activate(sink: EventSink) -> list[str]:
    """Attach every advertised listener to ``sink`` (once per sink); returns the names attached."""
    try:
        wanted = settings.PLUGINS.get()
    except settings.SettingError as exc:  # a bad setting must not stop the model: say so, use the default
        warnings.warn(f"{exc}; listeners stay on", RuntimeWarning, stacklevel=2)
        wanted = True
    if not wanted:
        return []
    with _lock:
        if sink in _activated:
            return []
        _activated.add(sink)
    attached: list[str] = []
    for entry in entry_points(group=GROUP):
        try:
            entry.load()(sink)
            attached.append(entry.name)
        except Exception as exc:  # a recorder's failure must never stop the model
            warnings.warn(f"neuronscope listener {entry.name!r} ({entry.value}) not attached: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
    return attached


__all__ = ["GROUP", "activate"]
