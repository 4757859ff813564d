"""What a timed collective returns: a CcOp-shaped record and its link usage step by step."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from neuroncore.topology import Channel, Topology

ALL_REDUCE = "AllReduce"
ALL_GATHER = "AllGather"
REDUCE_SCATTER = "ReduceScatter"
ALL_TO_ALL = "AllToAll"
PERMUTE = "Permute"
OPERATIONS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, PERMUTE)


def bus_factor(operation: str, ranks: int) -> float:
    """nccom-test's busbw / algbw factor (neuroncore.md §6); 0 for a single rank (nothing moves)."""
    if operation == ALL_REDUCE:
        return 2 * (ranks - 1) / ranks
    if operation in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return (ranks - 1) / ranks
    if operation == PERMUTE:
        return 1.0
    raise ValueError(f"unknown collective {operation!r}; known: {', '.join(OPERATIONS)}")


def ranks_of(operation: str, groups: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """Every rank taking part, group after group (Permute: each rank once, in pair order)."""
    if operation == PERMUTE:
        return tuple(dict.fromkeys(r for pair in groups for r in pair))
    return tuple(r for group in groups for r in group)


@dataclass(frozen=True, eq=False)
class LinkUsage:
    """Bytes and concurrent flows on each used channel, step by step.

    Dense ``[step, channel]`` arrays over the channels the collective uses (``channels``, topology
    channel ids): a 32-rank ring all-reduce is 62 steps x 64-ish channels. A step's bytes are taken as
    spread evenly over the step (``bytes_in_window``), which is what sampling link counters needs.
    """

    channels: np.ndarray  # (C,) int64, ascending topology channel ids
    step_start_ns: np.ndarray  # (S,) float64
    step_end_ns: np.ndarray  # (S,) float64
    step_bytes: np.ndarray  # (S, C) float64
    step_flows: np.ndarray  # (S, C) int32: flows sharing the channel during the step

    @property
    def steps(self) -> int:
        return len(self.step_start_ns)

    def total_bytes(self) -> np.ndarray:
        """Bytes each channel carries over the whole collective, aligned with ``channels``."""
        return self.step_bytes.sum(axis=0)

    def bytes_in_window(self, t0_ns: float, t1_ns: float) -> np.ndarray:
        """Bytes each channel carries between t0 and t1 (per channel, aligned with ``channels``)."""
        length = self.step_end_ns - self.step_start_ns
        overlap = np.clip(np.minimum(self.step_end_ns, t1_ns) - np.maximum(self.step_start_ns, t0_ns),
                          0.0, None)
        fraction = np.divide(overlap, length, out=np.zeros_like(overlap), where=length > 0)
        return fraction @ self.step_bytes

    def flows_in_window(self, t0_ns: float, t1_ns: float) -> np.ndarray:
        """Most flows each channel carries at once between t0 and t1 (0 where idle)."""
        live = (self.step_start_ns < t1_ns) & (self.step_end_ns > t0_ns)
        if not live.any():
            return np.zeros(len(self.channels), dtype=np.int32)
        return self.step_flows[live].max(axis=0)


@dataclass(frozen=True, eq=False)
class CollectiveRecord:
    """One timed collective: everything a profile's ``CcOp`` row needs, plus link usage.

    Sizes are per rank. ``num_elements`` counts the larger of the input and output buffers, the size
    nccom-test reports and algbw divides by. ``start_ns`` is when the last rank of the op became
    ready: the CC-cores of a group synchronise before the first step [assumption], so each rank's
    wait from its own ready time to ``start_ns`` is its ``cc_trigger_start_delay``.
    """

    operation: str
    algorithm: str  # "Ring", "Mesh", "Direct" (Permute) or "Local" (nothing to move)
    topology: Topology
    replica_groups: tuple[tuple[int, ...], ...]  # Permute: the (source, target) pairs
    num_elements: int
    dtype: str
    input_bytes: int
    output_bytes: int
    ready_ns: tuple[float, ...]  # per rank, in the order of ``ranks``
    start_ns: float
    end_ns: float
    steps: int
    rings: int  # parallel rings (Ring algorithm), else 0
    link_usage: LinkUsage

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank taking part, group after group (Permute: each rank once, in pair order)."""
        return ranks_of(self.operation, self.replica_groups)

    @property
    def group_size(self) -> int:
        return 2 if self.operation == PERMUTE else len(self.replica_groups[0])

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def size_bytes(self) -> int:
        return max(self.input_bytes, self.output_bytes)

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.operation, self.group_size)

    @property
    def algbw_bytes_per_s(self) -> float:
        """max(input, output) / duration (§6); 0 when nothing took time."""
        return self.size_bytes / (self.duration_ns * 1e-9) if self.duration_ns > 0 else 0.0

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.bus_factor * self.algbw_bytes_per_s

    @property
    def replica_group_text(self) -> str:
        """As the profile writes ``CcOp.replica_group``: ``[[0, 1, 2, 3]]``."""
        return "[" + ", ".join("[" + ", ".join(str(r) for r in g) + "]" for g in self.replica_groups) + "]"

    def shifted(self, delta_ns: float) -> CollectiveRecord:
        """The same collective ``delta_ns`` later (a timed template placed on a device clock)."""
        usage = self.link_usage
        moved = replace(usage, step_start_ns=usage.step_start_ns + delta_ns,
                        step_end_ns=usage.step_end_ns + delta_ns)
        return replace(self, ready_ns=tuple(r + delta_ns for r in self.ready_ns),
                       start_ns=self.start_ns + delta_ns, end_ns=self.end_ns + delta_ns, link_usage=moved)

    def ready_of(self, rank: int) -> float:
        return self.ready_ns[self.ranks.index(rank)]

    def channel_bytes(self) -> dict[Channel, float]:
        """Total bytes per channel (only channels that carried something)."""
        totals = self.link_usage.total_bytes()
        return {self.topology.channels[int(c)]: float(b)
                for c, b in zip(self.link_usage.channels, totals) if b > 0}

    def ccop_row(self, rank: int | None = None) -> dict[str, object]:
        """The ``CcOp`` fields this model knows (profile-schema.md), seen from ``rank`` (default: the
        first). Ids (op, stream, replica group) and the trigger engine belong to the profile writer."""
        rank = self.ranks[0] if rank is None else rank
        ready = self.ready_of(rank)
        start, end = round(self.start_ns), round(self.end_ns)
        return {
            "start_ts": start,
            "end_ts": end,
            "duration_ns": end - start,
            "operation": self.operation,
            "algorithm": self.algorithm,
            "num_elements": self.num_elements,
            "dtype": self.dtype,
            "input_size": self.input_bytes,
            "output_size": self.output_bytes,
            "algorithm_bandwidth": self.algbw_bytes_per_s,
            "bus_bandwidth": self.busbw_bytes_per_s,
            "trigger_start_ts": round(ready),
            "cc_trigger_start_delay": start - round(ready),
            "replica_group": self.replica_group_text,
        }
