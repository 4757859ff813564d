"""Tunable constants of the collective timing model, each from neuroncore.md §6 or stated as assumed."""

from __future__ import annotations

from dataclasses import dataclass

from neuroncore.hardware import EFA_HOP_LATENCY_NS
from neuroncore.topology import EFA, KIND_CODES, NEURONLINK, ON_CHIP


@dataclass(frozen=True)
class CollectiveParams:
    """Step latencies and algorithm choice. Change one with ``dataclasses.replace``.

    A step costs its latency plus its transfer time (§6: "time = step latency + transfer time"). The
    latency is the synchronisation and DMA start-up of a hop, paid for every link a flow crosses
    (§6 publishes it per hop): a Ring step between neighbours pays one, a Mesh flow routed through
    intermediate chips one per link, a flow over EFA the EFA hop latency.
    """

    hop_latency_ns: float = 1_500.0  # §6: 1-2 us per hop intra-node (depends on HBM load); midpoint
    efa_hop_latency_ns: float = EFA_HOP_LATENCY_NS  # §6, §1.4: ~15 us per inter-node hop
    # Between two cores of one chip: one DMA transfer's fixed cost, ~1.3 us (§5.1, §11) [assumption]
    on_chip_hop_latency_ns: float = 1_300.0
    # §6: Mesh below 1 MB (MB = 10^6 B, the reference's unit convention), Ring above.
    mesh_max_bytes: int = 1_000_000
    # Most disjoint rings a Ring algorithm may run in parallel (None: as many as the topology has).
    max_rings: int | None = None

    def latency_by_kind_ns(self) -> tuple[float, float, float]:
        """Step latency indexed by ``topology.KIND_CODES`` (on-chip, NeuronLink, EFA)."""
        out = [0.0, 0.0, 0.0]
        out[KIND_CODES[ON_CHIP]] = self.on_chip_hop_latency_ns
        out[KIND_CODES[NEURONLINK]] = self.hop_latency_ns
        out[KIND_CODES[EFA]] = self.efa_hop_latency_ns
        return out[0], out[1], out[2]


DEFAULT_PARAMS = CollectiveParams()
