"""Fixed inputs for the neuron-top tests: recorded live state, a monitor stream, a frozen host.

* ``top_live_recorded.json``: three samples, one second apart, of two real publishers on
  trn1.32xlarge (``neuron-profile run`` bert-layer on cores 0-1, llama-decode tp=4 on cores 4-7,
  which moves bytes over NeuronLink), with pids, users and commands replaced by fixed values;
* ``top_monitor_trn1.jsonl``: the documented example report (sys-tools.md §1.11), then the same with
  utilisation raised by 10 %.

Sources read them with a frozen clock and a ``FixedHost``, so no machine's name, CPU count, memory
or time reaches a frame, and every frame (and snapshot) is the same on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path

from collectors.inventory import simulated
from collectors.livereader import ProcessState, parse_state
from explorer.top.host import FixedHost
from explorer.top.live_source import LiveSource
from explorer.top.model import Frame, SystemSnapshot
from explorer.top.monitor_source import MonitorSource

DATA = Path(__file__).parent / "data"
LIVE_RECORDING = DATA / "top_live_recorded.json"
MONITOR_STREAM = DATA / "top_monitor_trn1.jsonl"
VERSION = "0.1.0"
HOST_NAME = "neuron-host"
SYSTEM = SystemSnapshot(vcpu_user=12.5, vcpu_system=3.25, vcpu_count=128, memory_total=512 << 30,
                        memory_used=37 << 30, swap_total=0, swap_used=0)
MONITOR_CLOCK = 1_800_000_000.0


def recorded_samples() -> list[list[ProcessState]]:
    return [[parse_state(doc) for doc in sample] for sample in json.loads(LIVE_RECORDING.read_text())]


class Replay:
    """Hands out the recorded samples one per read (the last one again when they run out), with
    the clock at each sample's time."""

    def __init__(self, samples: list[list[ProcessState]]) -> None:
        self.samples = samples
        self.index = -1

    def clock(self) -> float:
        sample = self.samples[max(min(self.index + 1, len(self.samples) - 1), 0)]
        return max((s.sampled_at for s in sample), default=MONITOR_CLOCK) + 0.05

    def read(self, now: float) -> list[ProcessState]:
        self.index = min(self.index + 1, len(self.samples) - 1)
        return self.samples[self.index]


def live_source(samples: list[list[ProcessState]] | None = None) -> LiveSource:
    replay = Replay(recorded_samples() if samples is None else samples)
    return LiveSource(simulated("trn1.32xlarge"), host=FixedHost(SYSTEM, HOST_NAME), clock=replay.clock,
                      read_states=replay.read, live_dir=Path("/run/neuronscope-test"))


def live_frame(polls: int = 3) -> Frame:
    """The frame after ``polls`` reads of the recording (history filled, rates over 1 s)."""
    source = live_source()
    frame = None
    for _ in range(polls):
        frame = source.poll()
    assert frame is not None
    return frame


def idle_frame() -> Frame:
    """No publisher at all: the "no Neuron activity" state."""
    return live_source([[]]).poll()


def monitor_source(path: Path = MONITOR_STREAM) -> MonitorSource:
    return MonitorSource(str(path), clock=lambda: MONITOR_CLOCK)


def monitor_frame(path: Path = MONITOR_STREAM) -> Frame:
    frame = monitor_source(path).poll()
    assert frame is not None
    return frame
