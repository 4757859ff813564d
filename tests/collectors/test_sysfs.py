"""Reading the driver's sysfs tree from fixture trees: documented and relocated layouts, counters in
both forms, unreadable nodes reported (not zeroed), and the inventory built from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors import inventory, sysfs
from tests.fixtures.sysfs import make_sysfs


@pytest.fixture
def trn1(tmp_path):
    return make_sysfs(tmp_path)


def test_documented_layout(trn1):
    devices = sysfs.read_devices(trn1)
    assert [d.index for d in devices] == list(range(16))
    d0 = devices[0]
    assert d0.layout == "pre-2.31" and d0.errors == []
    assert d0.core_count == 2 and d0.connected == (12, 3, 4, 1)
    assert (d0.device_name, d0.instance_type, d0.arch_type) == ("Trainium1", "Trn1", "NCv2")
    assert d0.serial_number == f"{0x1000:016x}"
    assert d0.hw_counters == {
        "mem_ecc_uncorrected": 0,
        "sram_ecc_uncorrected": 0,
        "mem_ecc_repairable_uncorrected": 0,
    }
    assert d0.host_memory == {"application_memory": 4096, "dma_buffers": 8192}
    assert d0.power == {
        "status": "POWER_STATUS_VALID",
        "timestamp": "1795239660",
        "min_power": "31.25",
        "max_power": "47.80",
        "avg_power": "39.12",
    }
    assert (d0.pci_bdf, d0.numa_node, d0.cpu_affinity) == ("0000:10:00.0", 0, "0-31,64-95")
    assert devices[15].numa_node == 1
    core = d0.cores[1]
    assert core.memory == {"constants": 1 << 30, "tensors": 1 << 29, "dma_rings": 1 << 20}
    assert core.memory_peak["tensors"] == 1 << 30
    assert core.status == {"success": 101, "execute_failed_to_queue": 1}  # old spelling normalised
    assert core.other == {"flop_count": 10**12, "nc_time_in_use": 5000}  # directory and plain file
    assert core.monitor_memory() == {
        "constants": 1 << 30,
        "model_code": 0,
        "model_shared_scratchpad": 0,
        "runtime_memory": 1 << 20,
        "tensors": 1 << 29,
    }


def test_relocated_nodes_are_found_by_name(tmp_path):
    tree = make_sysfs(tmp_path, devices=2, relocated=True)
    d0 = sysfs.read_device(0, tree / "neuron0")
    assert d0.layout == "relocated"
    assert d0.device_name == "Trainium1" and "mem_ecc_uncorrected" in d0.hw_counters
    assert d0.cores[0].other["flop_count"] == 10**12
    assert d0.power is not None  # stats/power/utilization, not the kernel's power/ directory


def test_unreadable_nodes_are_errors_not_zeros(trn1, monkeypatch):
    import os

    original = os.open
    secret = trn1 / "neuron3" / "stats" / "hardware" / "mem_ecc_uncorrected"

    def guarded(path, *args, **kwargs):
        if Path(path) == secret:
            raise PermissionError(13, "Permission denied")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)  # the tests run as root, so chmod would not do
    d3 = sysfs.read_device(3, trn1 / "neuron3")
    assert "mem_ecc_uncorrected" not in d3.hw_counters
    assert d3.errors == [f"open {secret}: permission denied"]


def test_root_comes_from_the_environment(tmp_path, monkeypatch):
    tree = make_sysfs(tmp_path, devices=1)
    monkeypatch.setenv("NEURON_SYSFS_ROOT", str(tree))
    assert sysfs.sysfs_root() == tree and sysfs.present()
    monkeypatch.setenv("NEURON_SYSFS_ROOT", str(tmp_path / "nothing"))
    assert not sysfs.present()


def test_inventory_from_sysfs_trn1(trn1, tmp_path):
    inv = inventory.from_sysfs(trn1, dmi=tmp_path / "no-dmi")
    assert inv.source == "sysfs" and inv.instance_type == "trn1.32xlarge" and inv.topology == "torus-4x4"
    assert len(inv.devices) == 16 and inv.cores_per_device == 2 and inv.error == ""
    assert inv.devices[5].connected == (1, 4, 9, 6)
    assert inv.devices[1].core_ids == (2, 3) and inv.devices[1].short_bdf == "11:00.0"
    dmi = tmp_path / "product_name"
    dmi.write_text("trn1n.32xlarge\n")
    assert inventory.from_sysfs(trn1, dmi=dmi).instance_type == "trn1n.32xlarge"
    info = inv.hardware_info()
    assert info == {
        "neuron_device_type": "trainium",
        "neuron_device_version": "v2",
        "neuroncore_version": "v2",
        "neuron_device_count": 16,
        "neuron_device_memory_size": 34359738368,
        "neuroncore_per_device_count": 2,
        "logical_neuroncore_config": 1,
        "error": "",
    }


def test_inventory_from_sysfs_inf2_and_trn2(tmp_path, monkeypatch):
    inf2 = inventory.from_sysfs(
        make_sysfs(tmp_path / "a", devices=12, device_name="Inferentia2", family="Inf2"),
        dmi=tmp_path / "none",
    )
    assert inf2.instance_type == "inf2.48xlarge" and inf2.topology == "ring"
    assert inf2.devices[0].connected == (1, 11) and inf2.hardware_info()["neuron_device_version"] == "v3"
    trn2_tree = make_sysfs(
        tmp_path / "b", devices=16, cores=8, device_name="Trainium2", family="Trn2", arch="NCv3"
    )
    trn2 = inventory.from_sysfs(trn2_tree, dmi=tmp_path / "none")
    assert trn2.lnc == 2 and trn2.cores_per_device == 4 and trn2.devices[1].core_ids == (4, 5, 6, 7)
    assert trn2.hardware_info()["neuroncore_version"] == "v3d"
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert inventory.from_sysfs(trn2_tree, dmi=tmp_path / "none").cores_per_device == 8


def test_no_devices_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(inventory.InventoryError, match="no Neuron devices"):
        inventory.from_sysfs(tmp_path / "empty")


def test_discover_prefers_real_devices_unless_an_instance_is_asked_for(trn1, monkeypatch):
    monkeypatch.setenv("NEURON_SYSFS_ROOT", str(trn1))
    assert inventory.discover().source == "sysfs"
    assert inventory.discover("inf2.xlarge").source == "simulated"
    with pytest.raises(inventory.InventoryError, match=r"unknown instance type 'p5\.48xlarge'"):
        inventory.discover("p5.48xlarge")


# -- hostile trees (issue 14): errors for the node, never a hang or a MemoryError -------------------


def test_a_fifo_node_is_an_error_not_a_hang(trn1):
    import os

    ecc = trn1 / "neuron0" / "stats" / "hardware" / "mem_ecc_uncorrected"
    ecc = ecc / "total" if ecc.is_dir() else ecc
    arch = trn1 / "neuron0" / "info" / "architecture" / "arch_type"
    for node in (trn1 / "neuron0" / "core_count", ecc, arch):
        node.unlink()
        os.mkfifo(node)
    device = sysfs.read_device(0, trn1 / "neuron0")  # opening a FIFO for reading used to wait forever
    assert sum("not a regular file" in e for e in device.errors) == 3
    assert "mem_ecc_uncorrected" not in device.hw_counters and device.core_count == len(device.cores)


@pytest.mark.parametrize("text", [str(10**12), "-1", "1e3", "9" * 5000, "\x00"],
                         ids=["1e12", "negative", "float", "5000-digits", "nul"])
def test_an_impossible_core_count_is_an_error(trn1, text):
    (trn1 / "neuron0" / "core_count").write_text(text)
    device = sysfs.read_device(0, trn1 / "neuron0")
    assert any("is not a core count" in e for e in device.errors) and device.core_count == 2
    inventory.from_sysfs(trn1, dmi=trn1 / "missing")  # and the inventory builds without a MemoryError


@pytest.mark.parametrize("text", ["9" * 5000, "-5", "18446744073709551616", "nan"],
                         ids=["5000-digits", "negative", "2**64", "nan"])
def test_counters_outside_u64_are_errors(trn1, text):
    node = trn1 / "neuron0" / "stats" / "hardware" / "mem_ecc_uncorrected"
    (node / "total" if node.is_dir() else node).write_text(text)
    device = sysfs.read_device(0, trn1 / "neuron0")
    assert "mem_ecc_uncorrected" not in device.hw_counters
    assert any("not a counter" in e for e in device.errors)


def test_huge_nodes_and_bad_connected_devices(trn1):
    (trn1 / "neuron0" / "info" / "architecture" / "arch_type").write_text("x" * (1 << 20))
    (trn1 / "neuron0" / "connected_devices").write_text(", ".join(["99999999"] * 10))
    device = sysfs.read_device(0, trn1 / "neuron0")
    assert any("over 65,536 bytes" in e for e in device.errors)
    assert device.connected is None and any("connected_devices" in e for e in device.errors)


def test_device_and_core_indices_beyond_any_instance_are_ignored(trn1):
    (trn1 / f"neuron{10**9}").mkdir()
    (trn1 / "neuron0" / "neuron_core999999").mkdir()
    assert [d.index for d in sysfs.read_devices(trn1)] == list(range(16))
    assert len(sysfs.read_device(0, trn1 / "neuron0").cores) == 2
