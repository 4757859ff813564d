"""Everything that records: device profiles, system profiles, live state, sysfs, monitor streams.

Collectors subscribe to ``neuroncore.events.sink`` (or read real hardware sources); the core never
imports them.

    import collectors
    with collectors.profile("out/run", nth_exec=2):     # device profiles (collectors.device_profile)
        model(x)
    with collectors.system_profile("out/run/system"):   # host samples + runtime events (collectors.system)
        model(x)

Submodules load on first use: the live-state publisher that every model-running process attaches
must not pay for pyarrow.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"profile": "collectors.device_profile", "DeviceProfileCollector": "collectors.device_profile",
         "system_profile": "collectors.system", "SystemProfileCollector": "collectors.system"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'collectors' has no attribute {name!r}")


__all__ = sorted(_LAZY)
