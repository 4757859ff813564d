"""Hardware facts in neuroncore.hardware against shared/reference/neuroncore.md, and the user config."""

from __future__ import annotations

import pytest

from neuroncore import config, hardware
from neuroncore.hardware import (
    INSTANCE_TYPES,
    NC_V2,
    NC_V3,
    Engine,
    core_spec,
    with_overrides,
)

GHZ = 1e9
KIB = 1024
MIB = 1024 * 1024


# -- clocks (§2.2) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "clocks_ghz"),
    [
        (NC_V2, (2.8, 1.12, 1.4, 1.4, 1.4)),
        (NC_V3, (2.4, 0.96, 1.2, 1.2, 1.2)),
    ],
    ids=["NC-v2", "NC-v3"],
)
def test_engine_clocks(spec, clocks_ghz):
    pe, dve, act, pool, base = clocks_ghz
    assert spec.pe_clock_hz == pytest.approx(pe * GHZ)
    assert spec.vector_clock_hz == pytest.approx(dve * GHZ)
    assert spec.scalar_clock_hz == pytest.approx(act * GHZ)
    assert spec.gpsimd_clock_hz == pytest.approx(pool * GHZ)
    assert spec.base_clock_hz == pytest.approx(base * GHZ)
    # clock_hz() maps each sequencer to its clock; Sync runs at the base clock
    assert spec.clock_hz(Engine.TENSOR) == spec.pe_clock_hz
    assert spec.clock_hz(Engine.VECTOR) == spec.vector_clock_hz
    assert spec.clock_hz(Engine.SCALAR) == spec.scalar_clock_hz
    assert spec.clock_hz(Engine.GPSIMD) == spec.gpsimd_clock_hz
    assert spec.clock_hz(Engine.SYNC) == spec.base_clock_hz
    # "The PE clock is exactly twice the base clock on both generations" (§2.2)
    assert spec.pe_clock_hz == pytest.approx(2 * spec.base_clock_hz)


def test_generations():
    assert NC_V2.generation == 2 and NC_V3.generation == 3
    assert not NC_V2.vector_perf_modes and NC_V3.vector_perf_modes


# -- memories (§2.4) -------------------------------------------------------------------------------


def test_sbuf_geometry():
    assert NC_V2.partitions == NC_V3.partitions == 128
    assert NC_V2.sbuf_bytes_per_partition == 192 * KIB
    assert NC_V2.sbuf_bytes == 24 * MIB
    assert NC_V3.sbuf_bytes_per_partition == 224 * KIB
    assert NC_V3.sbuf_bytes == 28 * MIB


@pytest.mark.parametrize("spec", [NC_V2, NC_V3], ids=["NC-v2", "NC-v3"])
def test_psum_geometry(spec):
    assert spec.psum_bytes == 2 * MIB
    assert spec.psum_banks == 8
    assert spec.psum_bank_bytes_per_partition == 2 * KIB
    # one bank holds 512 FP32 values per partition = the moving free-size limit (§3.1)
    assert spec.psum_bank_bytes_per_partition // 4 == spec.max_moving_free == 512


@pytest.mark.parametrize("spec", [NC_V2, NC_V3], ids=["NC-v2", "NC-v3"])
def test_pe_limits(spec):
    assert (spec.pe_rows, spec.pe_cols) == (128, 128)
    assert spec.max_contraction == 128
    assert spec.max_stationary_free == 128
    assert spec.max_moving_free == 512
    assert spec.min_ii_cycles == 64 and spec.mm_init_latency_cycles == 64
    assert spec.fp32_matmul_factor == 4


# -- peak compute (§2.3) ---------------------------------------------------------------------------


def test_pe_peak_nc_v2():
    assert NC_V2.pe_peak_bf16_flops_per_s == pytest.approx(91.75e12, rel=1e-3)
    assert NC_V2.pe_peak_bf16_flops_per_s == 128 * 128 * 2 * 2.8e9
    assert NC_V2.pe_peak_fp32_flops_per_s == pytest.approx(22.9e12, rel=2e-3)


def test_pe_peak_nc_v3():
    assert NC_V3.pe_peak_bf16_flops_per_s == pytest.approx(78.6e12, rel=1e-3)
    assert NC_V3.pe_peak_fp32_flops_per_s == pytest.approx(19.7e12, rel=2e-3)


def test_chip_peaks_are_cores_times_core_peak():
    # the model uses clock x array size, not the marketing chip totals (§2.3)
    assert hardware.TRAINIUM1.peak_bf16_flops_per_s == pytest.approx(2 * 91.75e12, rel=1e-3)
    assert hardware.TRAINIUM2.peak_bf16_flops_per_s == pytest.approx(8 * 78.6e12, rel=1e-3)


# -- DMA (§5.1, §9.2) ------------------------------------------------------------------------------


def test_dma_nc_v2():
    assert NC_V2.dma_engines == 16 and NC_V2.dma_queues_per_engine == 16
    assert NC_V2.dma_engine_bytes_per_s == pytest.approx(17e9)  # 17 B/ns
    assert NC_V2.dma_engines * NC_V2.dma_engine_bytes_per_s == pytest.approx(272e9)
    # the per-core DMA ceiling binds before the ~410 GB/s HBM share on Trn1 (§5.1 note)
    assert NC_V2.hbm_bytes_per_s == pytest.approx(410e9)
    assert NC_V2.dma_bytes_per_s == pytest.approx(272e9)
    assert NC_V2.dma_fixed_latency_ns == pytest.approx(1300.0)


def test_dma_nc_v3():
    assert NC_V3.dma_engines == 16 and NC_V3.dma_queues_per_engine == 16
    assert NC_V3.dma_engine_bytes_per_s == pytest.approx(23e9)  # 23 B/ns
    assert NC_V3.dma_engines * NC_V3.dma_engine_bytes_per_s == pytest.approx(368e9)
    assert NC_V3.dma_fixed_latency_ns == pytest.approx(1300.0)
    # the aggregate ceiling is the smaller of all engines and the HBM share
    assert NC_V3.dma_bytes_per_s == pytest.approx(min(368e9, NC_V3.hbm_bytes_per_s))


@pytest.mark.parametrize("spec", [NC_V2, NC_V3], ids=["NC-v2", "NC-v3"])
def test_sync_state(spec):
    assert spec.semaphores == 256 and spec.events == 256


# -- chips and instances (§1.1, §1.2) --------------------------------------------------------------

INSTANCE_CORES = {
    "inf2.xlarge": 2,
    "inf2.8xlarge": 2,
    "inf2.24xlarge": 12,
    "inf2.48xlarge": 24,
    "trn1.2xlarge": 2,
    "trn1.32xlarge": 32,
    "trn1n.32xlarge": 32,
    "trn2.48xlarge": 128,
}


def test_instance_table_is_complete():
    assert set(INSTANCE_TYPES) == set(INSTANCE_CORES)


@pytest.mark.parametrize(("name", "cores"), sorted(INSTANCE_CORES.items()))
def test_instance_core_counts(name, cores):
    spec = INSTANCE_TYPES[name]
    assert spec.name == name
    assert spec.cores == cores
    assert spec.cores == spec.chips * spec.chip.cores_per_chip
    expected_core = NC_V3 if name.startswith("trn2") else NC_V2
    assert spec.chip.core is expected_core


@pytest.mark.parametrize(
    ("name", "chips", "vcpus", "host_gib"),
    [
        ("inf2.xlarge", 1, 4, 16),
        ("inf2.8xlarge", 1, 32, 128),
        ("inf2.24xlarge", 6, 96, 384),
        ("inf2.48xlarge", 12, 192, 768),
        ("trn1.2xlarge", 1, 8, 32),
        ("trn1.32xlarge", 16, 128, 512),
        ("trn1n.32xlarge", 16, 128, 512),
        ("trn2.48xlarge", 16, 192, 2048),
    ],
)
def test_instance_host_facts(name, chips, vcpus, host_gib):
    spec = INSTANCE_TYPES[name]
    assert spec.chips == chips
    assert spec.vcpus == vcpus
    assert spec.host_memory_bytes == host_gib * 2**30


def test_chip_facts():
    assert hardware.TRAINIUM1.cores_per_chip == hardware.INFERENTIA2.cores_per_chip == 2
    assert hardware.TRAINIUM2.cores_per_chip == 8
    assert hardware.TRAINIUM1.hbm_bytes == 32 * 2**30
    assert hardware.TRAINIUM2.hbm_bytes == 96 * 2**30
    # NeuronLink-v2: 2 links on Inferentia2, 4 on Trainium1
    assert hardware.INFERENTIA2.neuronlink_links == 2
    assert hardware.TRAINIUM1.neuronlink_links == 4


# -- core_spec resolution --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("trn1", NC_V2), ("inf2", NC_V2), ("v2", NC_V2),
        ("trn2", NC_V3), ("v3", NC_V3),
        ("trn1.2xlarge", NC_V2), ("inf2.48xlarge", NC_V2), ("trn1n.32xlarge", NC_V2),
        ("trn2.48xlarge", NC_V3),
    ],
)
def test_core_spec_resolution(name, expected):
    assert core_spec(name) is expected


def test_core_spec_passes_a_spec_through():
    custom = with_overrides(NC_V2, sbuf_bytes_per_partition=4096)
    assert core_spec(custom) is custom
    assert custom.sbuf_bytes == 128 * 4096
    assert NC_V2.sbuf_bytes == 24 * MIB  # the original is untouched


def test_core_spec_unknown_target():
    with pytest.raises(ValueError, match=r"unknown target 'trn9'") as info:
        core_spec("trn9")
    message = str(info.value)
    # the error lists what is known
    for known in ("trn1", "trn2", "inf2", "trn1.2xlarge"):
        assert known in message


def test_engine_labels():
    assert [e.label for e in Engine] == ["Tensor", "Vector", "Scalar", "GpSimd", "Sync"]


# -- default instance: environment, config file, fallback ------------------------------------------


@pytest.fixture
def clean_config(monkeypatch, tmp_path):
    """No NEURONSCOPE_INSTANCE, and a config path that does not exist (never the user's own)."""
    monkeypatch.delenv("NEURONSCOPE_INSTANCE", raising=False)
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(tmp_path / "missing.toml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_default_instance_fallback(clean_config):
    assert config.load_config() == {}
    assert config.default_instance() == hardware.DEFAULT_INSTANCE == "trn1.2xlarge"


def test_default_instance_from_env(clean_config, monkeypatch):
    monkeypatch.setenv("NEURONSCOPE_INSTANCE", "trn2.48xlarge")
    assert config.default_instance() == "trn2.48xlarge"


def test_default_instance_from_config_file(clean_config, monkeypatch):
    path = clean_config / "config.toml"
    path.write_text('instance = "inf2.24xlarge"\n')
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(path))
    assert config.config_path() == path
    assert config.default_instance() == "inf2.24xlarge"


def test_env_wins_over_config_file(clean_config, monkeypatch):
    path = clean_config / "config.toml"
    path.write_text('instance = "inf2.24xlarge"\n')
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(path))
    monkeypatch.setenv("NEURONSCOPE_INSTANCE", "trn1.32xlarge")
    assert config.default_instance() == "trn1.32xlarge"


def test_xdg_config_home_location(clean_config, monkeypatch):
    monkeypatch.delenv("NEURONSCOPE_CONFIG")
    path = clean_config / "xdg" / "neuronscope" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('instance = "trn1n.32xlarge"\n')
    assert config.config_path() == path
    assert config.default_instance() == "trn1n.32xlarge"


def test_instance_uses_the_configured_default(clean_config, monkeypatch):
    from neuroncore import Instance

    monkeypatch.setenv("NEURONSCOPE_INSTANCE", "inf2.48xlarge")
    inst = Instance()
    assert inst.name == "inf2.48xlarge"
    assert len(inst.cores) == 24


def test_bad_instance_in_env(clean_config, monkeypatch):
    monkeypatch.setenv("NEURONSCOPE_INSTANCE", "p4d.24xlarge")
    with pytest.raises(ValueError, match=r"'p4d\.24xlarge' is not a known type"):
        config.default_instance()


def test_bad_instance_in_config_file(clean_config, monkeypatch):
    path = clean_config / "config.toml"
    path.write_text('instance = "trn3.big"\n')
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(path))
    with pytest.raises(ValueError, match=r"'trn3\.big' is not a known type"):
        config.default_instance()


def test_malformed_config_file(clean_config, monkeypatch):
    path = clean_config / "config.toml"
    path.write_text("instance = \n")
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(path))
    with pytest.raises(ValueError, match=r"cannot read config"):
        config.default_instance()
