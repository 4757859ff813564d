"""Hardware facts of NeuronCore-v2 / NeuronCore-v3 and the instances built from them.

Every number here comes from ``shared/reference/neuroncore.md`` (section in the comment); this is the
only place the project keeps them. Units are in the names. Where the public sources disagree the
choice is stated and the value is a field, so a caller can override it with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

# declared in neuroncore.enums; re-exported here for callers that import them with the specs
from neuroncore.enums import ENGINE_LABELS as ENGINE_LABELS
from neuroncore.enums import Engine as Engine


@dataclass(frozen=True)
class CoreSpec:
    """One physical NeuronCore. Clocks in Hz, sizes in bytes, rates in bytes per second."""

    name: str
    generation: int  # 2 = NC-v2 (Trn1/Inf2), 3 = NC-v3 (Trn2)
    # §2.2 clocks
    pe_clock_hz: float
    vector_clock_hz: float
    scalar_clock_hz: float
    gpsimd_clock_hz: float
    base_clock_hz: float  # profiler "NeuronCore base clock"; also used for the Sync sequencer
    # §2.4 / §3.1 geometry
    pe_rows: int = 128
    pe_cols: int = 128
    partitions: int = 128
    sbuf_bytes_per_partition: int = 192 * 1024
    psum_banks: int = 8
    psum_bank_bytes_per_partition: int = 2 * 1024
    max_contraction: int = 128  # K <= 128 (partition dim)
    max_stationary_free: int = 128  # M <= 128
    max_moving_free: int = 512  # N <= 512 (one PSUM bank of fp32)
    vector_sbuf_free_limit: int = 64 * 1024  # elements per partition per instruction reading SBUF
    vector_psum_free_limit: int = 4 * 1024  # ... reading PSUM
    # §4.1 / §11 per-instruction costs, in cycles of the engine that runs the instruction
    min_ii_cycles: int = 64
    mm_init_latency_cycles: int = 64
    ls_speedup: int = 4  # fast LoadStationary: free elements / 4 cycles
    fp32_matmul_factor: int = 4
    gpsimd_start_cycles: int = 150
    dependent_vector_penalty_cycles: int = 100  # DVE instruction reading the previous one's output
    dependent_scalar_ii_cycles: int = 264  # back-to-back dependent ACT instructions (189 ns on v2)
    sbuf_access_init_cycles: int = 60
    sync_instruction_cycles: int = 64  # DMA trigger / semaphore write on a sequencer [unverified]
    # §5 DMA
    dma_engines: int = 16
    dma_queues_per_engine: int = 16
    dma_engine_bytes_per_s: float = 17e9  # practical per-engine ceiling (17 B/ns on NC-v2)
    dma_fixed_latency_ns: float = 1300.0  # per-transfer fixed cost when triggered by another engine
    dma_descriptor_overhead_ns: float = 30.0  # per contiguous row; makes < 2 KiB rows inefficient
    hbm_bytes_per_s: float = 410e9  # this core's share of its chip's HBM bandwidth
    hbm_bytes: int = 16 * 2**30  # HBM visible to the core
    # §2.9 sync state
    semaphores: int = 256
    events: int = 256
    # NC-v3 only: DVE performance modes (§2.6)
    vector_perf_modes: bool = False
    # NC-v3 only: FP8 "double-row" matmuls, K up to 256 per MultiplyMoving in the time of a K=128
    # BF16 one (§3.1; the 4x128 FP8 input path of §2.2): FP8 runs at 2x the BF16 rate (158 TFLOPS).
    # NC-v2 runs FP8 (cFP8) at the BF16 rate (§1.1, §2.3).
    fp8_double_row: bool = False
    # NC-v3 (Trainium2) only: power throttling. When the Tensor engine's utilisation stays under
    # ``throttle_utilisation`` for ``throttle_window_ns`` the next burst of matmuls runs at
    # ``throttle_rate`` of full speed until the power controller ramps back up
    # (round2-facts.md, neuron-explorer troubleshooting "Active FLOPS Throttling Detected":
    # "under 50 % for about 3 us ... the next burst runs at about 50 % until it ramps").
    # The ramp time is not published: ``throttle_ramp_ns`` = the detection window is an assumption.
    # ``power_throttling=False`` turns it off (what-if comparisons; docs/execution-core.md).
    power_throttling: bool = False
    throttle_window_ns: float = 3000.0
    throttle_utilisation: float = 0.5
    throttle_rate: float = 0.5
    throttle_ramp_ns: float = 3000.0

    @property
    def sbuf_bytes(self) -> int:
        return self.partitions * self.sbuf_bytes_per_partition

    @property
    def psum_bytes(self) -> int:
        return self.partitions * self.psum_banks * self.psum_bank_bytes_per_partition

    @property
    def pe_peak_bf16_flops_per_s(self) -> float:
        """Dense BF16 peak = rows x cols x 2 FLOP/MAC x PE clock (§2.3)."""
        return self.pe_rows * self.pe_cols * 2 * self.pe_clock_hz

    @property
    def pe_peak_fp8_flops_per_s(self) -> float:
        """FP8 peak: twice BF16 with double-row matmuls (NC-v3, 157 TFLOPS), else the BF16 rate."""
        return self.pe_peak_bf16_flops_per_s * (2 if self.fp8_double_row else 1)

    @property
    def pe_peak_fp32_flops_per_s(self) -> float:
        return self.pe_peak_bf16_flops_per_s / self.fp32_matmul_factor

    @property
    def dma_bytes_per_s(self) -> float:
        """Aggregate DMA ceiling of the core: all engines, capped by the HBM share (§5.1, §9.2)."""
        return min(self.dma_engines * self.dma_engine_bytes_per_s, self.hbm_bytes_per_s)

    def clock_hz(self, engine: Engine) -> float:
        return self._engine_clocks[engine]

    @cached_property
    def _engine_clocks(self) -> dict[Engine, float]:
        """Built once per spec: the compiler asks for a clock on every instruction it costs."""
        return {
            Engine.TENSOR: self.pe_clock_hz,
            Engine.VECTOR: self.vector_clock_hz,
            Engine.SCALAR: self.scalar_clock_hz,
            Engine.GPSIMD: self.gpsimd_clock_hz,
            Engine.SYNC: self.base_clock_hz,
        }


NC_V2 = CoreSpec(
    name="NeuronCore-v2",
    generation=2,
    pe_clock_hz=2.8e9,
    vector_clock_hz=1.12e9,
    scalar_clock_hz=1.4e9,
    gpsimd_clock_hz=1.4e9,
    base_clock_hz=1.4e9,
    sbuf_bytes_per_partition=192 * 1024,
    dma_engine_bytes_per_s=17e9,
    hbm_bytes_per_s=410e9,
    hbm_bytes=16 * 2**30,
)

NC_V3 = CoreSpec(
    name="NeuronCore-v3",
    generation=3,
    pe_clock_hz=2.4e9,
    vector_clock_hz=0.96e9,
    scalar_clock_hz=1.2e9,
    gpsimd_clock_hz=1.2e9,
    base_clock_hz=1.2e9,
    sbuf_bytes_per_partition=224 * 1024,
    dma_engine_bytes_per_s=23e9,
    dma_fixed_latency_ns=1300.0,
    hbm_bytes_per_s=362e9,  # one 725 GB/s stack shared by a core pair, on average (§1.1)
    hbm_bytes=12 * 2**30,  # half of a 24 GiB stack per physical core
    vector_perf_modes=True,
    fp8_double_row=True,
    power_throttling=True,
)


@dataclass(frozen=True)
class ChipSpec:
    """One Neuron device (chip): its cores and chip-level resources (§1.1)."""

    name: str
    core: CoreSpec
    cores_per_chip: int
    hbm_bytes: int
    hbm_bytes_per_s: float
    cc_cores: int
    neuronlink_links: int

    @property
    def peak_bf16_flops_per_s(self) -> float:
        return self.cores_per_chip * self.core.pe_peak_bf16_flops_per_s


INFERENTIA2 = ChipSpec("Inferentia2", NC_V2, 2, 32 * 2**30, 820e9, 6, 2)
TRAINIUM1 = ChipSpec("Trainium1", NC_V2, 2, 32 * 2**30, 820e9, 6, 4)
TRAINIUM2 = ChipSpec("Trainium2", NC_V3, 8, 96 * 2**30, 2.9e12, 20, 4)


@dataclass(frozen=True)
class InstanceSpec:
    """An EC2 instance type: chips, host size, chip topology and its wires (§1.2, §1.4).

    The graph built from these facts (devices, links, routes) lives in ``neuroncore.topology``.
    ``neuronlink_bytes_per_s_per_chip`` is the published per-chip figure, i.e. the sum over the chip's
    links; whether it counts one direction or both is not published (§1.4), so the topology builder
    takes that reading as a parameter.
    """

    name: str
    chip: ChipSpec
    chips: int
    vcpus: int
    host_memory_bytes: int
    topology: str  # "none", "ring", "torus-4x4"
    target: str = field(default="")  # neuronx-cc --target value
    neuronlink_bytes_per_s_per_chip: float = 0.0  # 0 on single-chip instances (§1.2)
    efa_bits_per_s: float = 0.0  # whole instance; 0 where the table lists no EFA (§1.2)
    lnc_choices: tuple[int, ...] = ()  # Logical NeuronCore settings; empty: no LNC (§1.3)
    default_lnc: int = 1

    @property
    def cores(self) -> int:
        """Physical NeuronCores (what ``Instance`` builds); logical cores are ``cores // lnc``."""
        return self.chips * self.chip.cores_per_chip

    @property
    def efa_bytes_per_s_per_chip(self) -> float:
        """The instance's EFA bandwidth split evenly over its chips (§1.4 "Network (EFA) per chip")."""
        return self.efa_bits_per_s / 8 / self.chips


_GIB = 2**30
_GBIT = 1e9

# NeuronLink per chip, as published (§1.2 instance table, §1.4). Units differ by family (§1.6).
NEURONLINK_V2_INF2_BYTES_PER_S_PER_CHIP = 192 * _GIB  # headed "GiB/sec/chip": read as GiB (§1.6)
NEURONLINK_V2_TRN1_BYTES_PER_S_PER_CHIP = 384e9  # the unlabelled "384" column, GB/s (§1.2 note)
NEURONLINK_V2_TRN1N_BYTES_PER_S_PER_CHIP = 768e9  # trn1n's unlabelled "768", unexplained [ambiguous]
NEURONLINK_V3_TRN2_BYTES_PER_S_PER_CHIP = 1024e9  # inside one server (§1.2, §1.4)
# EFA per instance (§1.2 EFA column, Gbps = 10^9 bit/s): trn1.2xl "up to 25", trn1.32xl 800,
# trn1n 1,600, trn2 3,200; Inf2 lists none. Per chip = / chips (§1.4).
# Inter-node latency of one EFA hop, HBM to HBM, ~15 us (§1.4 ib_write_lat, §6).
EFA_HOP_LATENCY_NS = 15_000.0

INSTANCE_TYPES: dict[str, InstanceSpec] = {
    s.name: s
    for s in [
        InstanceSpec("inf2.xlarge", INFERENTIA2, 1, 4, 16 * _GIB, "none", "inf2"),
        InstanceSpec("inf2.8xlarge", INFERENTIA2, 1, 32, 128 * _GIB, "none", "inf2"),
        InstanceSpec("inf2.24xlarge", INFERENTIA2, 6, 96, 384 * _GIB, "ring", "inf2",
                     NEURONLINK_V2_INF2_BYTES_PER_S_PER_CHIP),
        InstanceSpec("inf2.48xlarge", INFERENTIA2, 12, 192, 768 * _GIB, "ring", "inf2",
                     NEURONLINK_V2_INF2_BYTES_PER_S_PER_CHIP),
        InstanceSpec("trn1.2xlarge", TRAINIUM1, 1, 8, 32 * _GIB, "none", "trn1",
                     efa_bits_per_s=25 * _GBIT),  # "up to 25 Gbps"
        InstanceSpec("trn1.32xlarge", TRAINIUM1, 16, 128, 512 * _GIB, "torus-4x4", "trn1",
                     NEURONLINK_V2_TRN1_BYTES_PER_S_PER_CHIP, 800 * _GBIT),
        InstanceSpec("trn1n.32xlarge", TRAINIUM1, 16, 128, 512 * _GIB, "torus-4x4", "trn1n",
                     NEURONLINK_V2_TRN1N_BYTES_PER_S_PER_CHIP, 1600 * _GBIT),
        InstanceSpec("trn2.48xlarge", TRAINIUM2, 16, 192, 2048 * _GIB, "torus-4x4", "trn2",
                     NEURONLINK_V3_TRN2_BYTES_PER_S_PER_CHIP, 3200 * _GBIT,
                     lnc_choices=(1, 2), default_lnc=2),  # LNC=2 is the default (§1.3)
    ]
}

DEFAULT_INSTANCE = "trn1.2xlarge"

CORE_SPECS: dict[str, CoreSpec] = {"v2": NC_V2, "v3": NC_V3, "trn1": NC_V2, "inf2": NC_V2, "trn2": NC_V3}


def core_spec(name: str | CoreSpec) -> CoreSpec:
    """Resolve ``"trn1"``, ``"inf2"``, ``"trn2"``, ``"v2"``, ``"v3"`` or an instance type to a core spec."""
    if isinstance(name, CoreSpec):
        return name
    if name in CORE_SPECS:
        return CORE_SPECS[name]
    if name in INSTANCE_TYPES:
        return INSTANCE_TYPES[name].chip.core
    known = ", ".join(sorted(CORE_SPECS) + sorted(INSTANCE_TYPES))
    raise ValueError(f"unknown target {name!r}; known: {known}")


def with_overrides(spec: CoreSpec, **changes: Any) -> CoreSpec:
    """A copy of ``spec`` with some facts changed (tests shrink SBUF to force spills this way).

    An unknown field is a TypeError (``dataclasses.replace``); code the checker should see through
    calls ``dataclasses.replace`` itself, which mypy checks field by field."""
    return replace(spec, **changes)
