"""Recording inside a program started by ``neuron-profile capture -- CMD``: the env-var handshake.

The wrapper sets, for its child:

* ``NEURONSCOPE_PROFILE_DIR``: where device profiles go (``collectors.profile`` layout);
* ``NEURONSCOPE_PROFILE_NTH_EXEC``: profile only each model's nth execution per core (0: none);
* ``NEURONSCOPE_EVENTS_FILE``: where the child writes its runtime API events (JSON lines) at exit,
  for the wrapper to fold into the system profile.

This module is advertised under the ``neuronscope.sink_listeners`` entry points, so the execution
core attaches it to its event sink the first time the child makes an ``Instance``, without any
change to the child's code. With none of the variables set it does nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

PROFILE_DIR = "NEURONSCOPE_PROFILE_DIR"
NTH_EXEC = "NEURONSCOPE_PROFILE_NTH_EXEC"
EVENTS_FILE = "NEURONSCOPE_EVENTS_FILE"


def install(sink: Any) -> None:
    """Attach the recorders the environment asks for to ``sink``; they finish at interpreter exit."""
    from collectors.device_profile import DeviceProfileCollector
    from collectors.system import RuntimeEventLog

    out_dir = os.environ.get(PROFILE_DIR)
    if out_dir:
        nth = os.environ.get(NTH_EXEC)
        collector = DeviceProfileCollector(out_dir, nth_exec=int(nth) if nth else None)
        unsubscribe = sink.subscribe(collector)

        def finish_profiles() -> None:
            unsubscribe()
            try:
                collector.close()
            except Exception as exc:  # at exit: say it, keep what was written
                print(f"neuronscope: device profile incomplete: {exc}", file=sys.stderr)

        atexit.register(finish_profiles)
    events_file = os.environ.get(EVENTS_FILE)
    if events_file:
        log = RuntimeEventLog(os.uname().nodename)
        sink.subscribe(log)
        atexit.register(log.write_jsonl, events_file)


__all__ = ["EVENTS_FILE", "NTH_EXEC", "PROFILE_DIR", "install"]
