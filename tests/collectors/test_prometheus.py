"""neuron-monitor-prometheus: the AWS script's exposition for the documented report, its update rules,
malformed input skipped and counted, and a real pipeline (publisher -> neuron-monitor -> exporter)
scraped over HTTP on an ephemeral port."""

from __future__ import annotations

import copy
import io
import json
import socket
import subprocess
import urllib.request

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from collectors.prometheus import Exporter
from tests.fixtures.live import PYTHON, REPO, example_report, live_env, start_publisher, wait_for

AZ = 'availability_zone="us-west-2d"'
IDS = 'instance_id="i-0a1b2c3d4e5f67890",instance_name="ml-trn1-node-a",instance_type="trn1.32xlarge"'
INSTANCE = f"{AZ},{IDS}"
SUBNET = 'subnet_id="subnet-0fedcba987654321f"'

# sample lines of sys-tools.md §2.7, produced there by the AWS script's logic on the §1.11 report
DOCUMENTED = [
    f'neuroncore_utilization_ratio{{{INSTANCE},neuroncore="0",region="us-west-2",runtime_tag="llama-ft",'
    f"{SUBNET}}} 0.7841925231000001",
    f'neuroncore_utilization_ratio{{{INSTANCE},neuroncore="1",region="us-west-2",runtime_tag="llama-ft",'
    f"{SUBNET}}} 0.7690314576999999",
    f'execution_errors_total{{{AZ},error_type="generic",{IDS},region="us-west-2",'
    f'runtime_tag="llama-ft",{SUBNET}}} 0.0',
    f'execution_status_total{{{INSTANCE},region="us-west-2",runtime_tag="llama-ft",status_type="completed",'
    f"{SUBNET}}} 3.0",
    f'execution_latency_seconds{{{INSTANCE},percentile="p0",region="us-west-2",runtime_tag="llama-ft",'
    f"{SUBNET}}} 0.305114746",
    f'neuron_runtime_memory_used_bytes{{{INSTANCE},memory_location="host",region="us-west-2",'
    f'runtime_tag="llama-ft",{SUBNET}}} 2.23879168e+09',
    f'neuron_runtime_memory_used_bytes{{{INSTANCE},memory_location="neuron_device",region="us-west-2",'
    f'runtime_tag="llama-ft",{SUBNET}}} 4.2245029888e+10',
    f'neuroncore_memory_usage_tensors{{{INSTANCE},memory_location="None",neuroncore="0",region="us-west-2",'
    f'runtime_tag="llama-ft",{SUBNET}}} 6.442450944e+09',
    f'neuron_runtime_vcpu_usage_ratio{{{INSTANCE},region="us-west-2",runtime_tag="llama-ft",{SUBNET},'
    f'usage_type="user"}} 0.0387',
    f'hardware_ecc_events_total{{{AZ},event_type="mem_ecc_corrected",{IDS},'
    f'neuron_device_index="0",region="us-west-2",{SUBNET}}} 0.0',
    f'system_vcpu_count{{{INSTANCE},region="us-west-2",{SUBNET}}} 128.0',
    f'system_vcpu_usage_ratio{{{INSTANCE},region="us-west-2",{SUBNET},usage_type="user"}} 0.0602',
    f'system_vcpu_usage_ratio{{{INSTANCE},region="us-west-2",{SUBNET},usage_type="system"}} 0.0103',
    f'system_memory_total_bytes{{{INSTANCE},region="us-west-2",{SUBNET}}} 5.32517261312e+11',
    f'instance_info{{{INSTANCE},region="us-west-2",{SUBNET}}} 1.0',
    f'neuron_hardware_info{{{INSTANCE},neuron_device_count="16",neuroncore_per_device_count="2",'
    f'region="us-west-2",{SUBNET}}} 1.0',
]


def scrape(exporter: Exporter) -> str:
    return generate_latest(exporter.registry).decode()


@pytest.fixture
def exporter():
    return Exporter(CollectorRegistry(), err=io.StringIO())


def test_documented_report_gives_the_documented_exposition(exporter):
    assert exporter.process_line(json.dumps(example_report()))
    text = scrape(exporter)
    lines = set(text.splitlines())
    for line in DOCUMENTED:
        assert line in lines, line
    assert "# HELP execution_errors_created Execution errors total" in text
    assert "# TYPE neuron_hardware_info gauge" in text
    for name in ("flops", "device_latency", "v3d"):  # runtime data the script does not export
        assert name not in text
    # the 48990 process failed its vcpu group only: that group is skipped, its other groups are not
    assert 'runtime_tag="48990",subnet_id="subnet-0fedcba987654321f",usage_type="user"' not in text
    assert 'neuroncore="6"' in text
    assert (
        "Error getting neuron_runtime_vcpu_usage for runtime tag 48990: "
        "open /proc/48990/stat: no such file or directory"
    ) in exporter.err.getvalue()
    assert exporter.malformed == 0


def test_counters_add_deltas_and_null_latency_keeps_the_gauge(exporter):
    report = example_report()
    exporter.process_line(json.dumps(report))
    quiet = copy.deepcopy(report)
    stats = quiet["neuron_runtime_data"][0]["report"]["execution_stats"]
    stats["latency_stats"] = {"total_latency": None, "device_latency": None}
    exporter.process_line(json.dumps(quiet))
    text = scrape(exporter)
    assert f'runtime_tag="llama-ft",status_type="completed",{SUBNET}}} 6.0' in text
    assert f'percentile="p0",region="us-west-2",runtime_tag="llama-ft",{SUBNET}}} 0.305114746' in text


def test_a_report_without_applications_clears_the_runtime_series(exporter):
    report = example_report()
    exporter.process_line(json.dumps(report))
    exporter.process_line(json.dumps({**report, "neuron_runtime_data": []}))
    text = scrape(exporter)
    assert "runtime_tag=" not in text
    assert f'system_vcpu_count{{{INSTANCE},region="us-west-2",{SUBNET}}} 128.0' in text  # refilled
    assert "hardware_ecc_events_total{" in text


def test_malformed_input_is_skipped_counted_and_survived(exporter):
    good = example_report()
    bad_group = copy.deepcopy(good)
    bad_group["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"] = [1, 2]
    no_driver = copy.deepcopy(good)
    no_driver["system_data"]["neuron_hw_counters"]["neuron_devices"] = None
    inputs = [
        "not json at all",
        "[1, 2, 3]",
        json.dumps(bad_group),
        json.dumps(no_driver),
        "",
        json.dumps(good),
    ]
    results = [exporter.process_line(line) for line in inputs]
    assert results == [False, False, False, False, True, True]
    assert exporter.malformed == 4 and exporter.lines == 5
    err = exporter.err.getvalue()
    assert "Unable to decode JSON" in err and "not a neuron-monitor report" in err
    assert "neuroncore_counters: neuroncores_in_use is not an object" in err
    assert "neuron_devices is null" in err
    text = scrape(exporter)
    assert "neuronscope_exporter_malformed_lines_total 4.0" in text
    assert f'neuroncore="0",region="us-west-2",runtime_tag="llama-ft",{SUBNET}}} 0.7841925231000001' in text


# -- the console entry point ---------------------------------------------------------------------


def start_exporter(*args: str, stdin=subprocess.PIPE) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [PYTHON, "-m", "collectors.prometheus", "--port", "0", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    first = proc.stdout.readline()
    assert first.startswith("Running HTTP prometheus server at port "), first + proc.stderr.read()
    return proc, int(first.rsplit(" ", 1)[1])


def get_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_pipeline_from_a_live_publisher_scraped_over_http(tmp_path):
    live_dir, stop = tmp_path / "live", tmp_path / "stop"
    publisher = start_publisher(live_dir, 2, stop, tag="bert-serve")
    monitor = exporter = None
    try:
        wait_for(lambda: list(live_dir.glob("*.json")))
        conf = tmp_path / "m.conf"
        conf.write_text(
            json.dumps(
                {
                    "period": "0.2s",
                    "neuron_runtimes": [
                        {
                            "metrics": [
                                {"type": "neuroncore_counters"},
                                {"type": "execution_stats"},
                                {"type": "memory_used"},
                            ]
                        }
                    ],
                    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}],
                }
            )
        )
        monitor = subprocess.Popen(
            [PYTHON, "-m", "collectors.monitor", "-c", str(conf), "--instance", "trn1.32xlarge"],
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=live_env(live_dir),
        )
        exporter, port = start_exporter(stdin=monitor.stdout)
        monitor.stdout.close()  # the exporter owns the read end now
        listening = [
            c.laddr
            for c in psutil.Process(exporter.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert [a.ip for a in listening] == ["127.0.0.1"]  # loopback unless --bind says otherwise
        text = wait_for(
            lambda: (
                (t := get_metrics(port))
                and "execution_status_total{" in t
                and 'runtime_tag="bert-serve"' in t
                and t
            )
        )
        assert 'instance_type="trn1.32xlarge"' in text
        assert "neuroncore_utilization_ratio{" in text and 'neuroncore="2"' in text
        assert "neuroncore_memory_usage_constants{" in text
        assert "system_memory_total_bytes{" in text and "python_info" in text
    finally:
        stop.write_text("")
        for proc in (monitor, exporter):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
        publisher.wait(timeout=20)


def test_input_end_and_malformed_lines(tmp_path):
    proc, port = start_exporter("--linger")
    proc.stdin.write("{oops\n" + json.dumps(example_report()) + "\n")
    proc.stdin.flush()
    text = wait_for(lambda: (t := get_metrics(port)) and "neuroncore_utilization_ratio{" in t and t)
    assert "neuronscope_exporter_malformed_lines_total 1.0" in text
    proc.stdin.close()
    said = [proc.stderr.readline() for _ in range(3)]
    assert said[0].startswith("Unable to decode JSON")
    assert said[2] == "neuron-monitor-prometheus: skipped 1 malformed of 2 lines\n"
    assert "neuroncore_utilization_ratio{" in get_metrics(port)  # --linger: still serving
    proc.terminate()
    proc.wait(timeout=10)


def test_port_in_use_is_one_line_and_exit_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [PYTHON, "-m", "collectors.prometheus", "--port", str(port)],
            input="",
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        f"neuron-monitor-prometheus: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_cert_without_key_is_refused():
    out = subprocess.run(
        [PYTHON, "-m", "collectors.prometheus", "--cert-file", "c.pem"],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "go together" in out.stderr


# -- hostile input (issue 14): nothing bad reaches a metric or stops a scrape ----------------------


def _with(change) -> str:
    report = example_report()
    change(report)
    return json.dumps(report)


def _counters(report: dict) -> dict:
    return report["neuron_runtime_data"][0]["report"]["execution_stats"]["execution_summary"]


@pytest.mark.parametrize("line, said", [
    ('{"neuron_runtime_data":[{"pid":' + "9" * 5000 + "}]}", "Unable to decode JSON (line 1): not JSON"),
    ("[" * 100_000, "Unable to decode JSON (line 1): JSON nested too deeply"),
    ('{"neuron_runtime_data":' + "[" * 100_000, "nested too deeply"),
], ids=["5000-digit-int", "deep-list", "deep-in-report"])
def test_undecodable_lines_are_skipped_and_counted(exporter, line, said):
    assert exporter.process_line(line) is False
    assert said in exporter.err.getvalue() and exporter.malformed == 1
    assert exporter.process_line(json.dumps(example_report())) is True


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_never_enter_a_counter_or_gauge(exporter, value):
    exporter.process_line(json.dumps(example_report()))
    bad = _with(lambda r: (_counters(r).__setitem__("completed", value),
                           r["system_data"]["memory_info"].__setitem__("memory_total_bytes", value)))
    assert exporter.process_line(bad) is False
    assert exporter.process_line(json.dumps(example_report())) is True  # and the counter keeps counting
    text = scrape(exporter)
    assert "nan" not in text.lower().replace("neuronscope", "") and "inf" not in text.replace("info", "")
    assert 'status_type="completed",' in text and f"{SUBNET}}} 6.0" in text  # 3 + 3, the bad 3 skipped
    assert "not a finite number" in exporter.err.getvalue()


def test_1e400_and_out_of_range_numbers_are_refused(exporter):
    text = _with(lambda r: _counters(r).__setitem__("completed", 1))
    text = text.replace('"completed": 1', '"completed": 1e400')
    assert exporter.process_line(text) is False
    big = _with(lambda r: _counters(r).__setitem__("completed", 10**30))
    assert exporter.process_line(big) is False
    assert "completed" in exporter.err.getvalue()


@pytest.mark.parametrize("index", [1e400, 10**30, -1, "0", 1.5])
def test_a_bad_neuron_device_index_is_a_malformed_group(exporter, index):
    line = _with(lambda r: r["system_data"]["neuron_hw_counters"]["neuron_devices"][0].__setitem__(
        "neuron_device_index", 7.25))
    line = line.replace('"neuron_device_index": 7.25', f'"neuron_device_index": {json.dumps(index)}'
                        if index != 1e400 else '"neuron_device_index": 1e400')
    assert exporter.process_line(line) is False
    assert "neuron_hw_counters: neuron_device_index" in exporter.err.getvalue()
    scrape(exporter)


def test_a_lone_surrogate_tag_does_not_break_later_scrapes():
    proc, port = start_exporter("--linger")
    try:
        report = example_report()
        report["neuron_runtime_data"][0]["neuron_runtime_tag"] = "bad\ud800tag\x1b"
        proc.stdin.write(json.dumps(report) + "\n" + "\xff\n")  # ensure_ascii: \ud800 stays an escape
        proc.stdin.flush()
        text = wait_for(lambda: (t := get_metrics(port)) and 'runtime_tag="bad?tag?"' in t and t)
        assert "neuroncore_utilization_ratio{" in text
        assert "neuroncore_utilization_ratio{" in get_metrics(port)  # and the next scrape too
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_huge_core_keys_are_bounded(exporter):
    line = _with(lambda r: r["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]
                 .__setitem__("9" * 400, {"neuroncore_utilization": 1}))
    assert exporter.process_line(line) is False
    assert "is not an index below" in exporter.err.getvalue()
