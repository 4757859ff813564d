"""Time one step of flows on a topology: each channel's bandwidth is split among the flows crossing it.

A *step* is a set of concurrent point-to-point flows (rank -> rank, bytes). Each flow follows its
route (``Topology.path``); on every channel it crosses it gets ``bandwidth / flows on the channel``
(its own step's flows plus, from a ``LinkLedger``, those of other collectives live at that time),
and it moves at the smallest of those shares. The step ends when its slowest flow has paid its
latency and moved its bytes:

    step_ns = max over flows (sum of its hops' latencies + bytes / min over its channels (B_c / n_c))

The latency is paid per hop (§6 publishes a per-hop latency, 1-2 us within a node): a flow that a
Mesh routes through intermediate chips pays one hop latency for each link it crosses, as a Ring's
neighbour-to-neighbour flow pays one.

This is the "slowest link share" bound: on the bottleneck channel every flow ends together, which is
what an equal-share fluid model gives there; flows elsewhere that could speed up when others finish
are not re-timed [assumption]. Everything is NumPy over a flow-channel incidence list, built once per
(topology, flow set) and reused for every message size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuroncore.collectives.record import LinkUsage
from neuroncore.topology import Topology


@dataclass(frozen=True, eq=False)
class Pattern:
    """The flows of one step as a flow x channel incidence; byte counts are ``weights x unit``."""

    weights: np.ndarray  # (F,) bytes of each flow per unit
    flow_kind: np.ndarray  # (F,) highest channel kind each flow crosses
    entry_kind: np.ndarray  # (E,) channel kind of each incidence (selects that hop's latency)
    entry_flow: np.ndarray  # (E,) flow of each incidence, grouped by flow
    entry_local: np.ndarray  # (E,) index into ``channels`` of each incidence
    flow_first_entry: np.ndarray  # (F,) first incidence of each flow (for np.minimum.reduceat)
    channels: np.ndarray  # (C,) topology channel ids the step uses, ascending
    bandwidth: np.ndarray  # (C,) bytes/s of those channels
    flows_per_channel: np.ndarray  # (C,) int32
    bytes_per_channel: np.ndarray  # (C,) per unit

    @property
    def empty(self) -> bool:
        return len(self.weights) == 0


def build_pattern(topo: Topology, src: np.ndarray, dst: np.ndarray, weights: np.ndarray) -> Pattern:
    """Route every flow ``src[i] -> dst[i]`` (ranks) carrying ``weights[i]`` bytes per unit.

    Flows between cores of one device take the sender's on-chip channel; others take their devices'
    route. Flows to oneself are dropped."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    keep = src != dst
    src, dst, weights = src[keep], dst[keep], weights[keep]
    per, n_dev = topo.cores_per_device, len(topo.devices)
    dev_a, dev_b = src // per, dst // per
    # one route per distinct device pair; key -1 (same device) stands for the on-chip channel
    key = np.where(dev_a == dev_b, -1, dev_a * n_dev + dev_b)
    distinct, which = np.unique(key, return_inverse=True)
    routes = [topo.route(int(k) // n_dev, int(k) % n_dev) if k >= 0 else (-1,) for k in distinct]
    lengths = np.array([len(r) for r in routes], dtype=np.int64)
    flat = np.array([c for r in routes for c in r], dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    counts = lengths[which]
    first = np.cumsum(counts) - counts  # first incidence of each flow
    entry_flow = np.repeat(np.arange(len(src)), counts)
    within = np.arange(len(entry_flow)) - first[entry_flow]
    entry_channel = flat[offsets[which][entry_flow] + within]
    entry_channel = np.where(entry_channel < 0, 2 * len(topo.links) + src[entry_flow], entry_channel)
    channels, entry_local = np.unique(entry_channel, return_inverse=True)
    kinds = topo.channel_kind_code[entry_channel]
    return Pattern(
        weights=weights,
        flow_kind=np.maximum.reduceat(kinds, first) if len(src) else np.zeros(0, np.int8),
        entry_kind=kinds,
        entry_flow=entry_flow,
        entry_local=entry_local,
        flow_first_entry=first,
        channels=channels,
        bandwidth=topo.channel_bytes_per_s[channels],
        flows_per_channel=np.bincount(entry_local, minlength=len(channels)).astype(np.int32),
        bytes_per_channel=np.bincount(entry_local, weights=weights[entry_flow], minlength=len(channels)),
    )


def step_ns(pattern: Pattern, unit_bytes: float, latency_by_kind_ns: np.ndarray,
            background_flows: np.ndarray | None = None) -> float:
    """Duration of one step of ``pattern`` moving ``weights x unit_bytes``, with ``background_flows``
    (aligned with ``pattern.channels``) of other collectives sharing its channels."""
    if pattern.empty:
        return 0.0
    sharing = pattern.flows_per_channel
    if background_flows is not None:
        sharing = sharing + background_flows
    share = pattern.bandwidth / sharing  # bytes/s each flow gets on each channel
    rate = np.minimum.reduceat(share[pattern.entry_local], pattern.flow_first_entry)
    seconds = pattern.weights * unit_bytes / rate
    latency = np.add.reduceat(latency_by_kind_ns[pattern.entry_kind], pattern.flow_first_entry)
    return float(np.max(latency + seconds * 1e9))


class LinkLedger:
    """Channel occupancy of collectives already timed, so later ones share the links with them.

    Each collective timed with a ledger reads the flows live on its channels during each of its steps
    and then adds its own usage. Sharing is first come, first served in one respect: collectives
    already in the ledger are not re-timed when a later one overlaps them [assumption]; the later one
    gets an equal share (B / (own + their flows)) for as long as they overlap.
    """

    def __init__(self) -> None:
        self._usages: list[LinkUsage] = []
        self._spans: list[tuple[float, float]] = []

    def __len__(self) -> int:
        return len(self._usages)

    def add(self, usage: LinkUsage) -> None:
        if usage.steps:
            self._usages.append(usage)
            self._spans.append((float(usage.step_start_ns[0]), float(usage.step_end_ns[-1])))

    def forget_before(self, t_ns: float) -> None:
        """Drop collectives that ended before ``t_ns`` (keeps long simulations' queries cheap)."""
        keep = [i for i, (_, end) in enumerate(self._spans) if end > t_ns]
        self._usages = [self._usages[i] for i in keep]
        self._spans = [self._spans[i] for i in keep]

    def flows(self, channels: np.ndarray, t0_ns: float, t1_ns: float) -> np.ndarray:
        """Most foreign flows on each of ``channels`` at any time in [t0, t1)."""
        out = np.zeros(len(channels), dtype=np.int32)
        for usage, (start, end) in zip(self._usages, self._spans):
            if start >= t1_ns or end <= t0_ns:
                continue
            live = usage.flows_in_window(t0_ns, t1_ns)
            where = np.searchsorted(usage.channels, channels)
            where = np.minimum(where, len(usage.channels) - 1)
            hit = usage.channels[where] == channels
            out = np.maximum(out, np.where(hit, live[where], 0))
        return out
