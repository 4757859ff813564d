"""Device/system profile collectors and ``neuron-profile capture`` through its real entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import neuroncore as nc
from collectors.device_profile import profile
from collectors.system import system_profile
from formats import figures, open_profile, units
from formats.dataset import capture_state, is_incomplete
from neuroncore.events import EventSink
from neuroncore.parallel import TensorParallelModel
from neuroncore.record_kinds import RecordKind
from neuroncore.workloads import get, random_inputs

REPO = Path(__file__).resolve().parents[2]
SMALL_MLP = dict(batch=8, d_model=64, d_ff=128)


def neuron_profile(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "explorer.profile_cli", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table(path: Path, name: str):
    return pq.read_table(sorted(path.glob(f"{name}*.parquet"))[0])


# -- collectors.profile -------------------------------------------------------------------------------

def test_one_profile_per_execution_and_core(tmp_path):
    sink = EventSink()
    graph = get("mlp").graph(**SMALL_MLP)
    instance = nc.Instance("trn1.2xlarge", sink=sink)
    with profile(tmp_path / "run", sink=sink) as collector:
        first = instance.core(0).load(nc.compile(graph, "trn1"))
        second = instance.core(1).load(nc.compile(get("matmul").graph(m=64, k=64, n=64), "trn1"))
        inputs = random_inputs(graph)
        results = [first.execute(inputs), first.execute(inputs), second.execute(timing_only=True)]
    paths = sorted(str(p.path.relative_to(tmp_path / "run")) for p in collector.profiles)
    assert paths == ["model=matmul/core=1/execution=1", "model=mlp/core=0/execution=1",
                     "model=mlp/core=0/execution=2"]
    mlp2 = open_profile(tmp_path / "run/model=mlp/core=0/execution=2")
    assert mlp2.table("Instruction").num_rows == first.program.n_instructions
    assert not mlp2.warnings
    info = mlp2.metadata
    assert info["neuroncore_idx"] == 0 and info["instance_type"] == "trn1.2xlarge" and info["is_simulation"]
    # each profile holds only its own execution
    span = table(tmp_path / "run/model=mlp/core=0/execution=2", "Instruction").column("start_ts")
    assert min(span.to_pylist()) >= results[1].start_ns


def test_nth_execution_only(tmp_path):
    sink = EventSink()
    graph = get("mlp").graph(**SMALL_MLP)
    with profile(tmp_path / "run", nth_exec=2, sink=sink) as collector:
        model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(nc.compile(graph, "trn1"))
        for _ in range(3):
            model.execute(timing_only=True)
    assert [(p.execution, p.complete) for p in collector.profiles] == [(2, True)]
    with profile(tmp_path / "none", nth_exec=0, sink=sink) as collector:
        model.execute(timing_only=True)
    assert collector.profiles == []


def test_tensor_parallel_ranks_get_their_own_profiles_with_collectives(tmp_path):
    sink = EventSink()
    graph = get("llama-decode").graph(layers=1, tp_degree=2)
    with profile(tmp_path / "tp", sink=sink) as collector:
        group = TensorParallelModel.load(graph, nc.Instance("trn1.32xlarge", sink=sink), tp_degree=2)
        group.execute(timing_only=True)
    assert sorted(p.core for p in collector.profiles) == [0, 1]
    rank1 = open_profile(tmp_path / "tp/model=llama_decode/core=1/execution=1")
    cc = rank1.table("CcOp")
    assert cc.num_rows == 3 and set(cc.column("operation").to_pylist()) == {"AllReduce"}
    assert rank1.table("NeuronLinkUsage").num_rows > 0
    assert not rank1.warnings


def test_an_error_inside_keeps_what_was_recorded_marked_incomplete(tmp_path):
    """An execution cut by the error is kept, marked incomplete; one that had finished before it is
    complete (found by the user trials: a script that raised after its profiled step left the
    step's whole profile marked incomplete, skipped by view, against docs/capture.md)."""
    sink = EventSink()
    graph = get("mlp").graph(**SMALL_MLP)
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(nc.compile(graph, "trn1"))
    with pytest.raises(RuntimeError, match="boom"), profile(tmp_path / "run", sink=sink):
        model.execute(timing_only=True)
        raise RuntimeError("boom")
    done = open_profile(tmp_path / "run/model=mlp/core=0/execution=1")
    assert done.complete and done.table("Instruction").num_rows > 0 and not done.warnings

    def cut(batch) -> None:  # the error arrives while the execution is being recorded
        if batch.kind is RecordKind.DMA_PACKET:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), profile(tmp_path / "cut", sink=sink):
        sink.subscribe(cut)
        model.execute(timing_only=True)
    kept = tmp_path / "cut/model=mlp/core=0/execution=1.incomplete"
    assert kept.is_dir() and not (tmp_path / "cut/model=mlp/core=0/execution=1").exists()
    partial = open_profile(kept)
    assert partial.table("Instruction").num_rows > 0
    assert any("boom" in w.message for w in partial.warnings)


# -- collectors.system ----------------------------------------------------------------------------------

def test_system_profile_samples_and_runtime_events_on_the_host_clock(tmp_path):
    sink = EventSink()
    before = time.time_ns()
    with system_profile(tmp_path / "sys", interval_s=0.01, sink=sink) as collector:
        group = TensorParallelModel.load(get("llama-decode").graph(layers=1, tp_degree=2),
                                         nc.Instance("trn1.32xlarge", sink=sink), tp_degree=2)
        result = group.execute(timing_only=True)
        time.sleep(0.05)
    after = time.time_ns()
    sys_dir = tmp_path / "sys"
    events = table(sys_dir, "SystemProfileEvents").to_pylist()
    names = [e["name"] for e in events]
    assert names.count("nrt_load") == 2 and names.count("nrt_execute") == 2
    assert names.count("nrt_cc") == 2 * len(result.collectives)
    for event in events:
        assert before <= event["start_ts"] <= event["end_ts"] <= after + 10**9
        assert event["process_id"] == os.getpid() and event["trace_event_source"] == "neuron_rt"
    running = next(e for e in events if e["name"] == "nc_exec_running")
    extra = json.loads(running["extra_attributes_json"])
    assert running["duration_ns"] == extra["device_end_ns"] - extra["device_start_ns"]
    # the alignment rule: a collective sits at host_start + (device ts - device start)
    execute = next(e for e in events if e["name"] == "nrt_execute" and e["nc_idx"] == 0)
    cc = next(e for e in events if e["name"] == "nrt_cc" and e["nc_idx"] == 0)
    cc_extra = json.loads(cc["extra_attributes_json"])
    assert cc["start_ts"] - execute["start_ts"] == cc_extra["device_start_ns"] - extra["device_start_ns"]
    cpu = table(sys_dir, "CpuUsage")
    assert collector.samples >= 2 and cpu.num_rows == collector.samples * os.cpu_count()
    assert table(sys_dir, "HostMemUsage").num_rows == collector.samples
    meta = table(sys_dir, "SystemProfileMetadata").to_pylist()[0]
    assert int(meta["first_ts_ns"]) <= int(meta["last_ts_ns"])


# -- neuron-profile capture --------------------------------------------------------------------------

def test_capture_a_workload(tmp_path):
    out = tmp_path / "mlp"
    done = neuron_profile("capture", "--workload", "mlp", "--set", "batch=8", "--set", "d_model=64",
                          "--set", "d_ff=128", "-o", str(out), "--system-interval", "0.02")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 6 and lines[-1] == str(out)
    assert lines[0].startswith("captured mlp on trn1.2xlarge core 0: 2 executions, profiled execution 2")
    device = open_profile(out / "device/model=mlp/core=0/execution=2")
    assert device.table("Instruction").num_rows > 0
    assert open_profile(out / "system").table("CpuUsage").num_rows > 0
    # the closing lines print the profile's own figures in the one unit convention (formats.units)
    whole = figures.figures(device)
    assert f"device time {units.fmt_ns(whole.length_ns)};" in lines[1]
    assert f"{units.fmt_bytes(whole.hbm.read + whole.hbm.write)} HBM traffic" in lines[1]
    assert f"MFU {units.fmt_pct(whole.mfu)}" in lines[2]


def test_capture_wraps_any_program(tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(
        "import neuroncore as nc\n"
        "from neuroncore.workloads import get\n"
        "g = get('mlp').graph(batch=8, d_model=64, d_ff=128)\n"
        "m = nc.Instance('trn1.2xlarge').core(0).load(nc.compile(g, 'trn1'))\n"
        "for _ in range(3):\n"
        "    m.execute(timing_only=True)\n"
        "print('script done')\n")
    out = tmp_path / "wrapped"
    done = neuron_profile("capture", "-o", str(out), "--profile-nth-exec", "3", "--",
                          sys.executable, str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "script done" in done.stdout and "1 device profile(s)" in done.stdout
    assert (out / "device/model=mlp/core=0/execution=3/Instruction.parquet").exists()
    events = table(out / "system", "SystemProfileEvents").to_pylist()
    assert [e["name"] for e in events].count("nrt_execute") == 3
    assert {e["process_id"] for e in events} != {os.getpid()}  # the child's events, folded in
    assert not list(out.glob(".events-*"))


def test_capture_passes_the_programs_exit_code(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    done = neuron_profile("capture", "-o", str(tmp_path / "out"), "--", sys.executable, str(script))
    assert done.returncode == 3
    assert "exit code 3" in done.stdout


def test_interrupted_capture_keeps_an_incomplete_system_profile(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "explorer.profile_cli", "capture", "-o",
                             str(tmp_path / "out"), "--system-interval", "0.02", "--", sys.executable,
                             str(script)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # a test runner (or a library it loaded) may ignore SIGINT, and children
                            # inherit that: give the capture the default disposition a shell would
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("neuron-profile: interrupted")
    kept = tmp_path / "out/system.incomplete"
    assert kept.is_dir() and open_profile(kept).table("CpuUsage").num_rows > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--workload", "mlp", "--profile-nth-exec", "3"], "beyond --num-exec 2"),
    (["--workload", "mlp", "--", "python", "x.py"], "either --workload or a command"),
    ([], "nothing to run"),
    (["--", "no-such-program-xyz"], "command not found: no-such-program-xyz"),
    (["--workload", "llama-decode", "--tp", "3", "--instance", "trn1.2xlarge"], "tp_degree 3 does not fit"),
    (["--workload", "mlp", "--set", "nope=1"], "has no option nope"),
])
def test_capture_bad_input(tmp_path, args, message):
    done = neuron_profile("capture", "-o", str(tmp_path / "out"), *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron-profile: error: ")
    assert message in lines[0]


def test_capture_refuses_a_non_empty_output(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    done = neuron_profile("capture", "--workload", "mlp", "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_package_level_api(tmp_path):
    import collectors

    sink = EventSink()
    with collectors.profile(tmp_path / "p", sink=sink) as collector:
        model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(
            nc.compile(get("mlp").graph(**SMALL_MLP), "trn1"))
        model.execute(timing_only=True)
    assert [p.model for p in collector.profiles] == ["mlp"]
    assert collectors.system_profile is system_profile


def test_models_loaded_before_the_collector_are_profiled(tmp_path):
    """A model traced before ``profile()`` started is announced again to the new listener."""
    sink = EventSink()
    program = nc.compile(get("mlp").graph(**SMALL_MLP), "trn1")
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
    model.execute(timing_only=True)  # nobody listening
    with profile(tmp_path / "late", sink=sink) as collector:
        model.execute(timing_only=True)
        model.execute(timing_only=True)
    assert [p.execution for p in collector.profiles] == [1, 2]
    late = open_profile(collector.profiles[-1].path)
    assert late.table("Instruction").num_rows == model.program.n_instructions and not late.warnings


# -- recording failures, warm-up fallback, incomplete marks ------------------------------------------

MLP_SCRIPT = (
    "import os, sys\n"
    "import neuroncore as nc\n"
    "from neuroncore.workloads import get\n"
    "g = get('mlp').graph(batch=8, d_model=64, d_ff=128)\n"
    "m = nc.Instance('trn1.2xlarge').core(0).load(nc.compile(g, 'trn1'))\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    m.execute(timing_only=True)\n"
    "print('script done', flush=True)\n"
    "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n")


def test_recording_errors_never_reach_execute(tmp_path, monkeypatch):
    """A profile that cannot be finished (here: the summary step fails) is kept, marked with the
    cause, and the program's next execute() -- which is when the profile closes -- still returns."""
    from collectors.device_profile import DeviceProfileCollector, RecordingError
    from formats import derive

    def broken(writer):
        raise OSError("disk full")

    monkeypatch.setattr(derive, "staged_profile", broken)
    sink = EventSink()
    collector = DeviceProfileCollector(tmp_path / "run")
    sink.subscribe(collector)
    program = nc.compile(get("mlp").graph(**SMALL_MLP), "trn1")
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
    model.execute(timing_only=True)
    model.execute(timing_only=True)  # closes execution 1: the failure stays in the collector
    with pytest.raises(RecordingError, match="disk full"):
        collector.close()
    kept = open_profile(tmp_path / "run/model=mlp/core=0/execution=1.incomplete")
    assert not kept.complete and kept.num_rows("Instruction") > 0
    assert any("disk full" in w.message for w in kept.warnings)


def test_a_failed_device_profile_fails_the_capture_in_one_line(tmp_path):
    script = tmp_path / "s.py"
    # the program itself puts a file where its profile must go: the recording fails, the program runs on
    script.write_text("import os, pathlib\n"
                      "d = pathlib.Path(os.environ['NEURONSCOPE_PROFILE_DIR']) / 'model=mlp/core=0'\n"
                      "d.mkdir(parents=True)\n"
                      "(d / 'execution=2').write_text('in the way')\n" + MLP_SCRIPT)
    done = neuron_profile("capture", "-o", str(tmp_path / "out"), "--", sys.executable, str(script), "3")
    assert "script done" in done.stdout
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("neuron-profile: error: device profile failed") and "exists" in lines[-1]
    assert "Traceback" not in done.stderr


def test_fewer_executions_than_asked_keep_a_marked_warm_up_profile(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(MLP_SCRIPT)
    out = tmp_path / "out"
    done = neuron_profile("capture", "-o", str(out), "--profile-nth-exec", "3", "--", sys.executable,
                          str(script), "2")
    assert done.returncode == 0, done.stderr
    kept = out / "device/model=mlp/core=0/execution=2"
    assert sorted(p.name for p in (out / "device/model=mlp/core=0").iterdir()) == ["execution=2"]
    state = capture_state(kept)
    assert state.warm_up and state.requested_execution == 3 and not state.incomplete
    assert "ran this model only 2 time(s), fewer than --profile-nth-exec 3" in done.stdout
    view = neuron_profile("view", str(kept), "--output-format", "summary-json")
    assert view.returncode == 0 and "warm-up execution" in view.stderr


def test_a_crashed_program_is_not_told_it_ran_too_few_executions(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(MLP_SCRIPT)
    done = neuron_profile("capture", "-o", str(tmp_path / "out"), "--", sys.executable, str(script), "1", "4")
    assert done.returncode == 4
    assert "fewer than" not in done.stdout and "stopped (exit code 4) after 1 execution(s)" in done.stdout
    none = neuron_profile("capture", "-o", str(tmp_path / "none"), "--", sys.executable, str(script),
                          "0", "5")
    assert none.returncode == 5 and "fewer" not in none.stdout
    assert "no device profile: the program stopped (exit code 5) before a model ran" in none.stdout


def test_an_incomplete_profile_opened_by_its_path_says_so(tmp_path):
    from formats.writer import ProfileWriter

    writer = ProfileWriter(tmp_path / "p", {"is_simulation": True})
    writer.write("HbmUsage", {"timestamp": [1, 2], "current_throughput": [1.0, 2.0],
                              "total_transfer_bytes": [10, 20]})
    kept = writer.abort("stopped by the user")
    assert kept == tmp_path / "p.incomplete" and is_incomplete(kept)
    for args in (["query", str(kept), "SELECT count(*) FROM HbmUsage"],
                 ["view", str(kept), "--output-format", "summary-json"]):
        done = neuron_profile(*args)
        notes = [line for line in done.stderr.splitlines() if "is an incomplete profile" in line]
        assert len(notes) == 1 and "incomplete profile" in notes[0] and "stopped by the user" in notes[0]
    found = neuron_profile("query", str(tmp_path), "SELECT count(*) AS n FROM HbmUsage",
                           "--include-incomplete", "--format", "csv")
    assert found.returncode == 0 and found.stdout.split() == ['"n"', "2"]


def test_sigterm_stops_a_workload_capture_like_ctrl_c(tmp_path):
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "explorer.profile_cli", "capture", "-w", "llama-decode",
                             "--set", "layers=1", "--timing-only", "--num-exec", "100000", "-o", str(out),
                             "--system-interval", "0.02"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "device").exists() and time.monotonic() < deadline:  # recording has begun
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("neuron-profile: interrupted (SIGTERM)")
    assert is_incomplete(out / "system.incomplete")
    assert not [p for p in out.rglob(".*") if p.is_dir()]
