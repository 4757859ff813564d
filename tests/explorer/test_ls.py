"""neuron-ls through its console entry point: tables, topology drawings and JSON for several
instances (snapshots), processes from live state, real devices from a sysfs fixture, bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from collectors.inventory import simulated
from explorer.ls_model import gather
from tests.fixtures.live import PYTHON, REPO, holder, state_doc, write_state
from tests.fixtures.sysfs import make_sysfs

SNAPSHOTS = Path(__file__).parent / "snapshots"
REFERENCE_TORUS = (SNAPSHOTS / "torus_documented.txt").read_text()  # sys-tools.md §4.6, verbatim


def neuron_ls(*args: str, live_dir: Path, sysfs: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, NEURONSCOPE_LIVE_DIR=str(live_dir), NEURON_SYSFS_ROOT=str(sysfs or live_dir / "nosys")
    )
    env.pop("NEURONSCOPE_INSTANCE", None)
    return subprocess.run(
        [PYTHON, "-m", "explorer.ls", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "snapshot"),
    [
        (["--instance", "trn1.32xlarge"], "ls_trn1.32xlarge.txt"),
        (["--instance", "trn1.32xlarge", "-t"], "ls_trn1.32xlarge_topology.txt"),
        (["--instance", "inf2.48xlarge", "-t"], "ls_inf2.48xlarge_topology.txt"),
        (["--instance", "trn2.48xlarge"], "ls_trn2.48xlarge.txt"),
        (["--instance", "inf2.xlarge", "-t"], "ls_inf2.xlarge_topology.txt"),
    ],
)
def test_text_snapshots(tmp_path, args, snapshot):
    out = neuron_ls(*args, live_dir=tmp_path)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout == (SNAPSHOTS / snapshot).read_text()


def test_torus_drawing_is_the_documented_one(tmp_path):
    out = neuron_ls("--instance", "trn1.32xlarge", "-t", live_dir=tmp_path).stdout
    assert out.endswith("\n\n\n" + REFERENCE_TORUS)  # the table, two blank lines, the drawing


def test_inventory_table_columns_and_rows(tmp_path):
    lines = neuron_ls("--instance", "inf2.48xlarge", live_dir=tmp_path).stdout.splitlines()
    assert lines[0] == "instance-type: inf2.48xlarge"
    assert lines[2].split("|")[1:-1] == [
        " NEURON ",
        " NEURON ",
        "  NEURON  ",
        " NEURON ",
        " CONNECTED ",
        "     PCI      ",
        "      CPU      ",
        " NUMA ",
    ]
    assert [c.strip() for c in lines[3].split("|")[1:-1]] == [
        "DEVICE",
        "CORES",
        "CORE IDS",
        "MEMORY",
        "DEVICES",
        "BDF",
        "AFFINITY",
        "NODE",
    ]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[5:-1]]
    assert len(rows) == 12 and rows[0][:5] == ["0", "2", "0-1", "32 GB", "1, 11"]
    assert rows[11][2] == "22-23" and rows[11][7] == "1"  # second NUMA node
    assert all(line.startswith("+") for line in (lines[1], lines[4], lines[-1]))


def test_json_array_and_output_format(tmp_path):
    array = json.loads(neuron_ls("--instance", "inf2.48xlarge", "-j", live_dir=tmp_path).stdout)
    assert len(array) == 12
    assert array[0] == {
        "neuron_device": 0,
        "bdf": "10:00.0",
        "cpu_affinity": "0-47,96-143",
        "numa_node": "0",
        "connected_to": [1, 11],
        "nc_count": 2,
        "logical_neuroncore_config": 1,
        "memory_size": 34359738368,
        "neuroncore_ids": [0, 1],
        "neuron_processes": [],
    }
    single = json.loads(neuron_ls("--instance", "trn1.2xlarge", "-j", live_dir=tmp_path).stdout)
    assert single[0]["connected_to"] is None  # single-device instances
    document = json.loads(
        neuron_ls("--instance", "trn2.48xlarge", "--output-format", "json", live_dir=tmp_path).stdout
    )
    assert document["instance_type"] == "trn2.48xlarge" and document["logical_neuroncore_config"] == 2
    assert len(document["neuron_devices"]) == 16 and document["neuron_devices"][3]["neuroncore_ids"] == [
        12,
        13,
        14,
        15,
    ]


@pytest.fixture
def processes(tmp_path):
    procs = [holder(), holder(), holder()]
    long_command = "python -m my_server --model /models/llama-2-7b-chat --tensor-parallel 2 --port 8080"
    write_state(tmp_path, state_doc(procs[0].pid, cores={2: {}, 3: {}}, command=long_command))
    write_state(tmp_path, state_doc(procs[1].pid, cores={2: {}}, command="python bench.py"))
    write_state(tmp_path, state_doc(procs[2].pid, cores={6: {}}, command="python train.py"))
    yield [p.pid for p in procs], long_command
    for p in procs:
        p.kill()
        p.wait()


def test_processes_are_listed_per_device(tmp_path, processes):
    pids, long_command = processes
    out = neuron_ls("--instance", "trn1.32xlarge", live_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [c.strip() for c in lines[3].split("|")[1:-1]] == [
        "DEVICE",
        "CORES",
        "MEMORY",
        "DEVICES",
        "BDF",
        "",
        "",
        "VERSION",
    ]
    assert [c.strip() for c in lines[2].split("|")[1:-1]][5:] == ["PID", "COMMAND", "RUNTIME"]
    body = [line for line in lines[5:] if line.startswith("|")]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in body]
    assert cells[0] == ["0", "2", "32 GB", "12, 3, 4, 1", "10:00.0", "NA", "NA", "NA"]
    assert cells[1][:6] == ["1", "2", "32 GB", "13, 0, 5, 2", "1e:00.0", str(min(pids[:2]))]
    assert cells[2][:5] == [""] * 5 and cells[2][5] == str(max(pids[:2]))  # second process, same device
    command = next(c[6] for c in cells if c[5] == str(pids[0]))
    assert command == long_command[:37] + "..." and len(command) == 40
    assert next(c for c in cells if c[0] == "3")[5] == str(pids[2])
    assert sum(line.startswith("+") for line in lines) == 2 + 16  # a rule after every device group
    wide = neuron_ls("--instance", "trn1.32xlarge", "-w", live_dir=tmp_path).stdout
    assert long_command[:77] + "..." in wide


def test_processes_in_json(tmp_path, processes):
    pids, long_command = processes
    array = json.loads(neuron_ls("--instance", "trn1.32xlarge", "-j", live_dir=tmp_path).stdout)
    assert [p["pid"] for p in array[1]["neuron_processes"]] == sorted(pids[:2])
    first = next(p for p in array[1]["neuron_processes"] if p["pid"] == pids[0])
    assert first == {"pid": pids[0], "command": long_command[:37] + "...", "neuron_runtime_version": "0.1.0"}
    assert array[0]["neuron_processes"] == []


def test_show_all_without_processes_uses_the_process_layout(tmp_path):
    lines = neuron_ls("--instance", "inf2.24xlarge", "-a", live_dir=tmp_path).stdout.splitlines()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[5:-1]]
    assert len(rows) == 6 and all(r[5:] == ["NA", "NA", "NA"] for r in rows)


def test_real_devices_from_sysfs(tmp_path):
    tree = make_sysfs(tmp_path / "sys", devices=16)
    out = neuron_ls(live_dir=tmp_path / "live", sysfs=tree)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("instance-type: trn1")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[4:-1] if line.startswith("|")]
    assert rows[0] == ["0", "2", "0-1", "32 GB", "12, 3, 4, 1", "0000:10:00.0", "0-31,64-95", "0"]
    assert rows[15][5:] == ["0000:1f:00.0", "32-63,96-127", "1"]
    topo = neuron_ls("-t", live_dir=tmp_path / "live", sysfs=tree).stdout
    assert topo.endswith(REFERENCE_TORUS)


def test_device_holders_on_a_real_host(tmp_path):
    """Runtimes (libnrt mapped) are listed; other holders only with -a, their version NA."""
    tree = make_sysfs(tmp_path / "sys", devices=2)
    from collectors.inventory import from_sysfs

    proc = tmp_path / "proc"
    for pid, device, maps, command in (
        (101, 0, "7f00 r-xp /opt/aws/lib/libnrt.so.2.21.18\n", b"python\0serve.py"),
        (202, 1, "7f00 r-xp /usr/lib/libc.so.6\n", b"neuron-monitor"),
    ):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd" / "3").symlink_to(f"/dev/neuron{device}")
        (proc / str(pid) / "fd" / "4").symlink_to("/dev/null")
        (proc / str(pid) / "maps").write_text(maps)
        (proc / str(pid) / "cmdline").write_bytes(command)
    (proc / "self").mkdir()
    inv = from_sysfs(tree, dmi=tmp_path / "none")
    rows = gather(inv, live_dir=tmp_path / "live", proc_root=proc)
    assert [(p.pid, p.command, p.runtime_version) for p in rows[0].processes] == [
        (101, "python serve.py", "2.21.18")
    ]
    assert rows[1].processes == ()
    rows = gather(inv, show_all=True, live_dir=tmp_path / "live", proc_root=proc)
    assert [(p.pid, p.runtime_version) for p in rows[1].processes] == [(202, None)]


def test_simulated_processes_map_to_devices(tmp_path, processes):
    rows = gather(simulated("trn1.32xlarge"), live_dir=tmp_path)
    assert [len(r.processes) for r in rows][:4] == [0, 2, 0, 1]


def test_unknown_instance_is_one_line_and_exit_1(tmp_path):
    out = neuron_ls("--instance", "p5.48xlarge", live_dir=tmp_path)
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    assert (
        out.stderr.startswith("neuron-ls: unknown instance type 'p5.48xlarge'")
        and out.stderr.count("\n") == 1
    )
