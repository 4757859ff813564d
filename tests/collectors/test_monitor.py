"""neuron-monitor: reports in the documented structure, per-group periods, absent cores, LNC, sysfs
counters, and the console entry point (output and every bad-input exit)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from collectors import inventory, latency
from collectors.monitor import Monitor
from collectors.monitor_config import default_config, parse_config
from tests.fixtures.live import (
    PYTHON,
    REPO,
    example_report,
    holder,
    live_env,
    model_doc,
    report_problems,
    start_publisher,
    state_doc,
    wait_for,
    write_state,
)
from tests.fixtures.sysfs import make_sysfs, set_counter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def holders():
    procs = [holder(), holder()]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def make_monitor(live_dir, config=None, instance="trn1.32xlarge", inv=None):
    clock = Clock()
    inv = inv or inventory.simulated(instance)
    monitor = Monitor(
        config or default_config(),
        inv,
        live_dir=live_dir,
        clock=clock,
        instance_info={
            "instance_name": "",
            "instance_id": "",
            "instance_type": inv.instance_type,
            "instance_availability_zone": "",
            "instance_availability_zone_id": "",
            "instance_region": "",
            "ami_id": "",
            "subnet_id": "",
            "error": "",
        },
    )
    return monitor, clock


def test_the_checker_accepts_the_documented_example():
    assert report_problems(example_report()) == []


def test_report_follows_the_documented_structure(tmp_path, holders):
    a, b = holders
    t0 = time.time()
    write_state(
        tmp_path,
        state_doc(
            a.pid,
            tag="llama-ft",
            sampled_at=t0 - 5,
            sequence=1,
            cores={0: {}, 1: {}},
            models=[model_doc(1, 0), model_doc(2, 1)],
        ),
    )
    write_state(
        tmp_path, state_doc(b.pid, sampled_at=t0 - 5, sequence=1, cores={6: {}}, models=[model_doc(1, 6)])
    )
    monitor, clock = make_monitor(tmp_path)
    hist = {latency.bucket(3e6): 4}
    write_state(
        tmp_path,
        state_doc(
            a.pid,
            tag="llama-ft",
            sampled_at=t0,
            sequence=2,
            completed=4,
            total_hist=hist,
            device_hist=hist,
            cores={0: {"busy_ns": 2_500_000_000, "flops": 5 * 10**12}, 1: {}},
            models=[model_doc(1, 0), model_doc(2, 1)],
        ),
    )
    clock.now += 5.0
    report = monitor.report()
    assert report_problems(report) == []
    entries = {e["pid"]: e for e in report["neuron_runtime_data"]}
    assert set(entries) == {a.pid, b.pid} and entries[a.pid]["neuron_runtime_tag"] == "llama-ft"
    counters = entries[a.pid]["report"]["neuroncore_counters"]
    assert counters["period"] == pytest.approx(5.0)
    assert set(counters["neuroncores_in_use"]) == {"0", "1"}  # every other core is absent, not 0
    assert counters["neuroncores_in_use"]["0"]["neuroncore_utilization"] == pytest.approx(50.0)
    assert counters["neuroncores_in_use"]["0"]["flops"] == 10**12
    assert counters["neuroncores_in_use"]["1"]["neuroncore_utilization"] == 0  # listed, idle
    stats = entries[a.pid]["report"]["execution_stats"]
    assert stats["execution_summary"]["completed"] == 4
    assert stats["latency_stats"]["total_latency"]["p50"] == pytest.approx(3e-3, rel=0.006)
    idle = entries[b.pid]["report"]
    assert idle["execution_stats"]["latency_stats"] == {"total_latency": None, "device_latency": None}
    memory = idle["memory_used"]
    assert memory["neuron_runtime_used_bytes"]["neuron_device"] == 1296
    (loaded,) = memory["loaded_models"]
    assert loaded["subgraphs"]["sg_00"]["neuron_device_index"] == 3
    assert loaded["subgraphs"]["sg_00"]["neuroncore_index"] == 0  # local to the device
    assert set(report["system_data"]) == {"vcpu_usage", "memory_info", "neuron_hw_counters"}
    assert len(report["system_data"]["neuron_hw_counters"]["neuron_devices"]) == 16
    assert report["neuron_hardware_info"]["neuron_device_count"] == 16


def test_no_application_means_an_empty_list(tmp_path):
    monitor, clock = make_monitor(tmp_path / "none")
    clock.now += 5.0
    assert monitor.report()["neuron_runtime_data"] == []


def test_groups_are_written_when_due_and_applications_stay_listed(tmp_path, holders):
    write_state(tmp_path, state_doc(holders[0].pid, tag="train-a", cores={0: {}}))
    write_state(tmp_path, state_doc(holders[1].pid, tag="serve-b", cores={2: {}}))
    config = parse_config(
        {
            "period": "1s",
            "neuron_runtimes": [
                {
                    "tag_filter": "^train-",
                    "period": "2s",
                    "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used", "period": "4s"}],
                }
            ],
            "system_metrics": [{"type": "memory_info"}],
        }
    )
    monitor, clock = make_monitor(tmp_path, config)
    assert monitor.seconds_until_due() == pytest.approx(1.0)
    seen = []
    for _ in range(4):
        clock.now += 1.0
        report = monitor.report()
        assert report_problems(report) == []
        (entry,) = report["neuron_runtime_data"]  # serve-b matches no entry: not collected
        assert entry["neuron_runtime_tag"] == "train-a"
        seen.append((sorted(entry["report"]), sorted(report["system_data"])))
    assert seen == [
        ([], ["memory_info"]),
        (["neuroncore_counters"], ["memory_info"]),
        ([], ["memory_info"]),
        (["memory_used", "neuroncore_counters"], ["memory_info"]),
    ]
    assert monitor.report() is None  # nothing due until the next second


def test_trn2_logical_cores_and_their_physical_cores(tmp_path, holders):
    t0 = time.time()
    cores = {2: {"generation": 3, "device": 0, "busy_ns": 0}, 3: {"generation": 3, "device": 0, "busy_ns": 0}}
    write_state(
        tmp_path,
        state_doc(holders[0].pid, sampled_at=t0 - 1, sequence=1, cores=cores, instance_type="trn2.48xlarge"),
    )
    monitor, clock = make_monitor(tmp_path, instance="trn2.48xlarge")
    cores[2]["busy_ns"] = 10**9
    write_state(
        tmp_path,
        state_doc(
            holders[0].pid,
            sampled_at=t0,
            sequence=2,
            cores=cores,
            models=[model_doc(1, 2) | {"device": 0}],
            instance_type="trn2.48xlarge",
        ),
    )
    clock.now += 5.0
    report = monitor.report()
    assert report_problems(report) == []
    entry = report["neuron_runtime_data"][0]["report"]
    in_use = entry["neuroncore_counters"]["neuroncores_in_use"]
    assert set(in_use) == {"1"}  # physical 2 and 3 are logical core 1 at LNC=2
    assert in_use["1"]["neuroncore_utilization"] == pytest.approx(50.0)
    assert in_use["1"]["v3d"] == {
        "nc_v3.2": {"neuroncore_utilization": pytest.approx(100.0)},
        "nc_v3.3": {"neuroncore_utilization": 0.0},
    }
    assert set(
        entry["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]
    ) == {"1"}
    assert report["neuron_hardware_info"]["neuroncore_version"] == "v3d"


def test_hardware_counters_are_sysfs_deltas(tmp_path):
    tree = make_sysfs(tmp_path / "sys", devices=2)
    inv = inventory.from_sysfs(tree, dmi=tmp_path / "none")
    config = parse_config({"period": "1s", "system_metrics": [{"type": "neuron_hw_counters"}]})
    monitor, clock = make_monitor(tmp_path / "live", config, inv=inv)
    set_counter(tree, 1, "mem_ecc_uncorrected", 3)
    clock.now += 1.0
    first = monitor.report()["system_data"]["neuron_hw_counters"]
    assert first["error"] == "" and first["neuron_devices"][1]["mem_ecc_uncorrected"] == 3
    clock.now += 1.0
    assert (
        monitor.report()["system_data"]["neuron_hw_counters"]["neuron_devices"][1]["mem_ecc_uncorrected"] == 0
    )


# -- the console entry point ---------------------------------------------------------------------


def run_monitor(*args, env=None, timeout=30):
    return subprocess.run(
        [PYTHON, "-m", "collectors.monitor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def _completed(live_dir):
    """Completed executions the live-state files in ``live_dir`` report so far (0 while unreadable)."""
    total = 0
    for path in live_dir.glob("*.json"):
        try:
            total += json.loads(path.read_text())["execution_status"]["completed"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return total


def test_cli_reports_a_live_publisher(tmp_path):
    stop = tmp_path / "stop"
    publisher = start_publisher(tmp_path / "live", 4, stop, tag="bert-serve")
    try:
        # sample only once the publisher runs executions: on a loaded machine its start (imports,
        # compile) can outlast both 0.3 s reports, which then rightly count no completions
        wait_for(lambda: _completed(tmp_path / "live") >= 2, timeout=60)
        conf = tmp_path / "m.conf"
        conf.write_text(
            json.dumps(
                {
                    "period": "0.3s",
                    "neuron_runtimes": [
                        {
                            "tag_filter": "bert",
                            "metrics": [
                                {"type": t}
                                for t in (
                                    "neuroncore_counters",
                                    "execution_stats",
                                    "memory_used",
                                    "neuron_runtime_vcpu_usage",
                                )
                            ],
                        }
                    ],
                    "system_metrics": [
                        {"type": "vcpu_usage"},
                        {"type": "memory_info"},
                        {"type": "neuron_hw_counters"},
                    ],
                }
            )
        )
        out = run_monitor(
            "-c", str(conf), "--count", "2", "--instance", "trn1.32xlarge", env=live_env(tmp_path / "live")
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == 2
        for line in lines:
            report = json.loads(line)
            assert report_problems(report) == []
        (entry,) = json.loads(lines[-1])["neuron_runtime_data"]
        assert entry["pid"] == publisher.pid and entry["neuron_runtime_tag"] == "bert-serve"
        group = entry["report"]["neuroncore_counters"]
        assert list(group["neuroncores_in_use"]) == ["4"]
        # the measured period: never shorter than the configured 0.3 s; a loaded machine stretches it
        assert group["period"] >= 0.15
        stats = entry["report"]["execution_stats"]
        assert stats["execution_summary"]["completed"] > 0
        assert stats["latency_stats"]["device_latency"]["p50"] > 0
        assert entry["report"]["memory_used"]["loaded_models"][0]["name"].endswith("-tiny_4")
    finally:
        stop.write_text("")
        publisher.wait(timeout=20)


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (["-c", "{dir}/missing.conf"], None, "config file {dir}/missing.conf does not exist"),
        (["-c", "{dir}/m.conf"], "{not json", "m.conf: not valid JSON"),
        (
            ["-c", "{dir}/m.conf"],
            '{"neuron_runtimes": [{"tag_filter": "[a-"}]}',
            "neuron_runtimes[0].tag_filter: invalid regular expression",
        ),
        (
            ["-c", "{dir}/m.conf"],
            '{"system_metrics": [{"type": "gpu"}]}',
            "system_metrics[0].type: unknown metric",
        ),
        (["--instance", "p5.48xlarge"], None, "unknown instance type 'p5.48xlarge'"),
        (["--count", "0"], None, "--count must be at least 1"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, config, message):
    if config is not None:
        (tmp_path / "m.conf").write_text(config)
    out = run_monitor(*(a.format(dir=tmp_path) for a in args), env=live_env(tmp_path / "live"))
    assert out.returncode == 2
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and message.format(dir=tmp_path) in out.stderr


@pytest.mark.parametrize(("config", "message"), [
    ("{}", "m.conf: selects no metric group"),
    ('{"period": "' + "9" * 40 + 'h"}', "m.conf: period: period"),
    ('{"period": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deeply"),
    ('{"neuron_runtimes": [{"tag_filter": "' + "a" * 900_000 + '"}]}',
     "tag_filter: regular expression of 900,000 characters is over the 1,024 limit"),
    ('{"neuron_runtimes": [{"tag_filter": "(x+x+)+y"}]}', "repeats a repeat"),
    (" " * (10 << 20) + "{}", "limit"),
], ids=["empty", "huge-period", "deep", "big-regex", "nested-repeat", "10MB-file"])
def test_cli_hostile_configs_are_one_line_and_exit_2(tmp_path, config, message):
    (tmp_path / "m.conf").write_text(config)
    out = run_monitor("-c", str(tmp_path / "m.conf"), env=live_env(tmp_path / "live"))
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr


def test_cli_legacy_names_warn_on_stderr_and_still_run(tmp_path):
    (tmp_path / "m.conf").write_text('{"period": "0.1s", "system_metrics": [{"type": "hw_counters"}]}')
    out = run_monitor("-c", str(tmp_path / "m.conf"), "--count", "1", env=live_env(tmp_path / "live"))
    assert out.returncode == 0
    assert "'hw_counters' is the old name of 'neuron_hw_counters'" in out.stderr
    assert "neuron_hw_counters" in json.loads(out.stdout)["system_data"]


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("collectors.monitor", ["--bogus"], "neuron-monitor: unrecognized arguments: --bogus"),
        ("collectors.monitor", ["--verbose", "9"], "neuron-monitor: argument --verbose: invalid choice"),
        (
            "collectors.prometheus",
            ["--port", "abc"],
            "neuron-monitor-prometheus: argument -p/--port: invalid int",
        ),
        ("explorer.ls", ["--output-format", "xml"], "neuron-ls: argument --output-format: invalid choice"),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2(tmp_path, module, args, message):
    out = subprocess.run(
        [PYTHON, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env=live_env(tmp_path),
        input="",
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(message)
