"""Live state: the accumulator's counters, atomic publishing, readers' cleanup, windows, and several
real publisher processes at once (one killed, one exiting normally)."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import threading
import time
from importlib.metadata import entry_points

import numpy as np
import pytest

import neuroncore as nc
from collectors import latency, live, livepaths
from collectors.livereader import parse_state, read_live_state
from collectors.livestate import ENGINES, LiveAccumulator, union_ns
from collectors.livewindow import LiveTracker, window
from neuroncore.events import EventBatch, EventSink
from neuroncore.record_kinds import ProgramLoadedMeta, RecordKind, check_batch
from tests.fixtures.live import (
    PYTHON,
    REPO,
    holder,
    live_env,
    start_publisher,
    state_doc,
    wait_for,
    write_state,
)


def tiny_program(target: str = "trn1") -> nc.Program:
    b = nc.GraphBuilder("tiny")
    x = b.parameter("x", (64, 128), "bf16")
    with b.scope("proj"):
        h = b.gelu(b.matmul(x, b.weight("w", (128, 256), "bf16")))
    y = b.matmul(h, b.weight("w2", (256, 64), "bf16"))
    return nc.compile(b.build([y]), target)


# -- union of spans ------------------------------------------------------------------------------


def brute_union(starts, ends, carry):
    covered = set()
    for s, e in zip(starts, ends):
        covered.update(range(max(int(s), int(carry)), int(e)))
    return len(covered)


@pytest.mark.parametrize("seed", range(6))
def test_union_matches_brute_force_across_batches(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 500, 80)
    ends = starts + rng.integers(0, 40, 80)
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    carry, total = -math.inf, 0.0
    for part in np.array_split(np.arange(80), 3):  # batches in time order, as the core emits them
        busy, carry = union_ns(starts[part], ends[part], carry)
        total += busy
    assert total == brute_union(starts, ends, -1)


# -- the accumulator on a real execution ------------------------------------------------------------


@pytest.fixture(scope="module")
def observed():
    sink = EventSink()
    acc = LiveAccumulator()
    batches = []
    sink.subscribe(acc)
    sink.subscribe(batches.append)
    program = tiny_program()
    model = nc.Instance("trn1.32xlarge", sink=sink).core(3).load(program)
    results = [model.execute(timing_only=True) for _ in range(3)]
    return acc, batches, program, results


def test_accumulator_counts_device_time_flops_and_executions(observed):
    acc, batches, _, results = observed
    snap = acc.snapshot()
    core = snap["cores"]["3"]
    assert core["device"] == 1 and core["generation"] == 2
    assert core["executions"] == 3 and snap["execution_status"]["completed"] == 3
    assert core["busy_ns"] == sum(r.device_time_ns for r in results)
    flops = sum(int(np.sum(b.columns["raw_flops"])) for b in batches if b.kind == "instruction")
    assert core["flops"] == flops > 0
    assert set(core["engine_busy_ns"]) == set(ENGINES)
    for engine, busy in core["engine_busy_ns"].items():
        assert 0 <= busy <= core["busy_ns"], engine  # a union of spans inside the executions
    assert core["engine_busy_ns"]["Tensor"] > 0 and core["engine_busy_ns"]["DMA"] > 0
    assert sum(snap["device_latency_hist"].values()) == 3
    assert sum(snap["total_latency_hist"].values()) == 3


def test_accumulator_memory_is_the_programs_hbm_by_category(observed):
    acc, _, program, _ = observed
    (model,) = acc.snapshot()["models"]
    kinds = program.hbm_bytes_by_kind()
    assert model["memory"]["constants"] == kinds["weight"]
    assert model["memory"]["tensors"] == kinds["input"] + kinds["output"]
    assert model["memory"]["model_shared_scratchpad"] == kinds["scratch"]
    assert model["memory"]["model_code"] > 0 and model["memory"]["runtime_memory"] == 0
    assert model["executions"] == 3 and model["core"] == 3 and len(model["uuid"]) == 32


def test_tensor_busy_merges_its_two_tracks(observed):
    acc, batches, _, _ = observed
    spans = [
        (s, e)
        for b in batches
        if b.kind == "instruction"
        for s, e, t in zip(b.columns["start_ts"], b.columns["end_ts"], b.columns["track"])
        if t in (0, 5)
    ]
    starts, ends = np.array([s for s, _ in spans]), np.array([e for _, e in spans])
    expected, _ = union_ns(starts, ends, -math.inf)  # LoadStationary and MultiplyMoving overlap
    assert expected < sum(e - s for s, e in spans)
    assert acc.snapshot()["cores"]["3"]["engine_busy_ns"]["Tensor"] == pytest.approx(expected, rel=1e-9)


def test_models_beyond_a_cores_memory_are_forgotten_oldest_first():
    """There is no unload event: models of dropped Instances leave once a core could not hold them all."""
    acc = LiveAccumulator()
    six_gib = {"weight": 6 * 2**30, "input": 0, "output": 0, "scratch": 0}
    no_deps = np.zeros(1, np.int64)
    for model_id in (1, 2, 3):
        batch = EventBatch(
            RecordKind.PROGRAM_LOADED,
            {"op_index": np.zeros(1, np.int32), "hlo_name": ["dot.1"], "opcode": ["dot"], "layer": [""],
             "shape": [[4, 4]], "dtype": ["bf16"], "frames": [[]]},
            ProgramLoadedMeta(
                model_id=model_id, core=0, device=0, model_name="big", spec=nc.NC_V2,
                instance_type="trn1.2xlarge", rank=0, n_instructions=10, n_dma_transfers=2, queues=[],
                semaphore_names={}, operands=[], opcodes=[], compiler_opcodes={},
                hbm_bytes_by_kind=six_gib, activation_fn=[], tensor_instruction_type=[],
                performance_mode=[], dep_ptr=no_deps, dep_idx=no_deps[:0], resource=np.zeros(0, np.int8)),
        )
        check_batch(batch)
        acc(batch)
    assert [m["model_id"] for m in acc.snapshot()["models"]] == [2, 3]  # 18 GiB > the core's 16 GiB


def test_tensor_parallel_runs_count_link_traffic_on_every_rank():
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.workloads import get

    sink = EventSink()
    acc = LiveAccumulator()
    sink.subscribe(acc)
    group = TensorParallelModel.load(get("mlp").graph(), nc.Instance("trn1.32xlarge", sink=sink), tp_degree=4)
    group.execute(timing_only=True)
    snap = acc.snapshot()
    assert sorted(snap["cores"]) == ["0", "1", "2", "3"]
    assert all(c["executions"] == 1 and c["busy_ns"] > 0 for c in snap["cores"].values())
    assert snap["link_bytes"]["neuronlink"] > 0 and snap["link_bytes"]["on_chip"] > 0


# -- latency histograms ---------------------------------------------------------------------------


def test_latency_percentiles_are_within_half_a_percent():
    rng = np.random.default_rng(1)
    samples = rng.lognormal(mean=13, sigma=1.0, size=5000)  # ns
    hist: dict[int, int] = {}
    for s in samples:
        b = latency.bucket(s)
        hist[b] = hist.get(b, 0) + 1
    p = latency.percentiles(hist)
    ordered = np.sort(samples)
    for name, q in latency.PERCENTILES:
        truth = ordered[max(1, math.ceil(q * len(ordered))) - 1] / 1e9
        assert p[name] == pytest.approx(truth, rel=0.006), name
    assert latency.percentiles({}) is None
    assert latency.difference({1: 5, 2: 3}, {1: 5, 2: 1}) == {2: 2}


# -- publishing and reading -------------------------------------------------------------------------


def test_publisher_writes_whole_files_and_removes_them_on_stop(tmp_path, observed):
    acc = observed[0]
    pub = live.Publisher(acc, tmp_path, period_s=0.05)
    assert pub.publish_once()
    assert [p.name for p in tmp_path.iterdir()] == [f"{os.getpid()}.json"]  # no temporary left over
    (state,) = read_live_state(tmp_path)
    assert state.pid == os.getpid() and state.cores[3].executions == 3
    assert state.tag == os.environ.get("NEURON_PROCESS_TAG", str(os.getpid()))
    assert state.models[0].memory_bytes > 0 and not state.stale
    pub.start()
    first = state.sequence
    wait_for(lambda: read_live_state(tmp_path)[0].sequence > first + 1)
    pub.stop()
    assert not (tmp_path / f"{os.getpid()}.json").exists()


def test_publisher_never_raises_into_the_program(tmp_path, observed):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    pub = live.Publisher(observed[0], blocker / "live", period_s=0.05)
    assert pub.publish_once() is False  # logged once, publishing off
    assert pub.publish_once() is False


def test_readers_remove_dead_and_reused_pids_and_flag_stale_ones(tmp_path):
    done = subprocess.Popen(["true"])
    done.wait()
    write_state(tmp_path, state_doc(os.getpid(), start_time=0.0) | {"pid": done.pid})  # dead pid
    sleeper = holder()
    try:
        write_state(tmp_path, state_doc(sleeper.pid, start_time=time.time() - 3600))  # pid reused
        write_state(tmp_path, state_doc(os.getpid(), sampled_at=time.time() - 60))  # alive, stuck
        (tmp_path / f".{done.pid}.7.tmp").write_text("{")  # left by a killed writer
        (tmp_path / "notes.txt").write_text("not ours")
        states = read_live_state(tmp_path)
        assert [s.pid for s in states] == [os.getpid()] and states[0].stale
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == sorted([f"{os.getpid()}.json", "notes.txt"])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_unreadable_file_of_a_live_process_is_skipped_not_deleted(tmp_path):
    path = tmp_path / f"{os.getpid()}.json"
    path.write_text("{ half")
    assert read_live_state(tmp_path) == []
    assert path.exists()
    assert read_live_state(tmp_path / "missing") == []


# -- windows --------------------------------------------------------------------------------------


def sample(**kwargs):
    return parse_state(state_doc(os.getpid(), **kwargs))


def test_utilisation_is_busy_device_time_over_wall_time_capped_at_100():
    t0 = 1000.0
    before = sample(sampled_at=t0, sequence=1, cores={0: {"busy_ns": 0, "flops": 0}})
    half = sample(
        sampled_at=t0 + 2,
        sequence=2,
        cores={0: {"busy_ns": 10**9, "flops": 4 * 10**12, "engine_busy_ns": {"Tensor": 5e8}}},
    )
    w = window(before, half, cpus=4)
    assert w.period_s == pytest.approx(2.0)
    assert w.cores[0].utilization == pytest.approx(50.0)
    assert w.cores[0].flops == pytest.approx(2e12)
    assert w.cores[0].engine_busy["Tensor"] == pytest.approx(0.25)
    over = sample(sampled_at=t0 + 2, sequence=2, cores={0: {"busy_ns": 4 * 10**9, "flops": 4 * 10**12}})
    w = window(before, over, cpus=4)
    assert w.cores[0].utilization == 100.0  # simulated faster than real time: fully busy
    assert w.cores[0].flops == pytest.approx(1e12)  # over the device time, never above the peak


def test_windows_report_per_period_deltas_and_repeat_rates_for_an_unchanged_sample():
    hist_a = {latency.bucket(1e6): 2}
    hist_b = {latency.bucket(1e6): 2, latency.bucket(4e6): 3}
    a = sample(
        sampled_at=10.0,
        sequence=1,
        completed=2,
        total_hist=hist_a,
        device_hist=hist_a,
        cores={0: {"busy_ns": 0}},
        cpu_user_s=1.0,
    )
    b = sample(
        sampled_at=11.0,
        sequence=2,
        completed=5,
        total_hist=hist_b,
        device_hist=hist_b,
        cores={0: {"busy_ns": 5 * 10**8}},
        cpu_user_s=1.5,
    )
    tracker = LiveTracker(cpus=2)
    tracker.prime([a])
    w = tracker.advance([b])[os.getpid()]
    assert w.execution_status["completed"] == 3
    assert w.total_latency["p0"] == pytest.approx(4e-3, rel=0.006)  # only this period's executions
    assert w.vcpu_user == pytest.approx(25.0)  # 0.5 s of CPU over 1 s on 2 vCPUs
    again = tracker.advance([b])[os.getpid()]
    assert again.cores[0].utilization == pytest.approx(50.0)  # not a false idle
    assert again.execution_status["completed"] == 0 and again.total_latency is None


# -- real publishers --------------------------------------------------------------------------------


def test_live_listener_and_console_scripts_are_registered():
    names = {e.name: e.value for e in entry_points(group="neuronscope.sink_listeners")}
    assert names.get("live") == "collectors.live:install"
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["neuron-monitor"] == "collectors.monitor:main"
    assert scripts["neuron-monitor-prometheus"] == "collectors.prometheus:main"
    assert scripts["neuron-ls"] == "explorer.ls:main"


def test_two_publishers_at_once_one_killed_one_exiting(tmp_path):
    live_dir, stop = tmp_path / "live", tmp_path / "stop"
    a = start_publisher(live_dir, 0, stop, tag="server-a")
    b = start_publisher(live_dir, 5, stop)
    try:
        states = wait_for(
            lambda: (
                (s := read_live_state(live_dir))
                and len(s) == 2
                and all(x.cores and x.models for x in s)
                and s
            )
        )
        by_pid = {s.pid: s for s in states}
        assert by_pid[a.pid].tag == "server-a" and by_pid[b.pid].tag == str(b.pid)
        assert set(by_pid[a.pid].cores) == {0} and set(by_pid[b.pid].cores) == {5}
        assert by_pid[b.pid].cores[5].device == 2 and by_pid[b.pid].instance_type == "trn1.32xlarge"
        assert "-c" in by_pid[a.pid].command and by_pid[a.pid].runtime_version
        a.send_signal(signal.SIGKILL)
        a.wait()
        assert (live_dir / f"{a.pid}.json").exists()  # nobody can clean up after SIGKILL but a reader
        assert [s.pid for s in read_live_state(live_dir)] == [b.pid]
        assert not (live_dir / f"{a.pid}.json").exists()
        stop.write_text("")
        assert b.wait(timeout=20) == 0
        assert list(live_dir.glob("*.json")) == []  # a normal exit removes its own file
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_live_publishing_can_be_turned_off(tmp_path):
    script = (
        "import neuroncore as nc\nb = nc.GraphBuilder('t')\nx = b.parameter('x', (8, 8), 'fp32')\n"
        "p = nc.compile(b.build([b.add(x, x)]), 'trn1')\n"
        "m = nc.Instance('trn1.2xlarge').core(0).load(p)\nm.execute(timing_only=True)\n"
        "import collectors.live as live\nprint(live._process is None)\n"
    )
    out = subprocess.run(
        [PYTHON, "-c", script],
        env=live_env(tmp_path, NEURONSCOPE_LIVE="0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True" and list(tmp_path.iterdir()) == []


def test_state_file_is_the_documented_json(tmp_path):
    stop = tmp_path / "stop"
    proc = start_publisher(tmp_path, 1, stop)
    try:
        path = tmp_path / f"{proc.pid}.json"
        wait_for(lambda: path.exists() and json.loads(path.read_text())["models"])
        data = json.loads(path.read_text())
        assert data["format"] == "neuronscope-live" and data["version"] == 1
        for key in (
            "pid",
            "start_time",
            "tag",
            "command",
            "user",
            "runtime_version",
            "period_s",
            "started_at",
            "sampled_at",
            "sequence",
            "host",
            "cores",
            "models",
            "execution_status",
            "errors",
            "total_latency_hist",
            "device_latency_hist",
            "link_bytes",
            "instance_type",
        ):
            assert key in data, key
        assert data["period_s"] == pytest.approx(0.1)
    finally:
        stop.write_text("")
        proc.wait(timeout=20)


# -- the live-state directory (issue 14): ours, private, never written through a link ----------------


def _publisher(directory, observed):
    return live.Publisher(observed[0], directory, period_s=0.05)


def test_the_directory_is_created_private_and_files_are_0600(tmp_path, observed):
    directory = tmp_path / "shm" / "neuronscope-test"
    assert _publisher(directory, observed).publish_once()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    state = directory / f"{os.getpid()}.json"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600  # command lines are in it


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777, 0o710])
def test_a_directory_open_to_others_is_refused(tmp_path, observed, mode, caplog):
    directory = tmp_path / "live"
    directory.mkdir()
    os.chmod(directory, mode)
    pub = _publisher(directory, observed)
    assert pub.publish_once() is False and list(directory.iterdir()) == []
    assert f"has mode {mode:04o}, open to other users" in caplog.text
    write_state(tmp_path / "ok", state_doc(os.getpid()))
    os.rename(tmp_path / "ok" / f"{os.getpid()}.json", directory / f"{os.getpid()}.json")
    assert read_live_state(directory) == []  # and readers do not trust what is in it
    with pytest.raises(livepaths.LiveDirError, match="refusing to use it"):
        livepaths.check_live_dir(directory)


def test_a_directory_owned_by_another_user_is_refused(tmp_path, observed, caplog):
    if os.getuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    directory = tmp_path / "live"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4321, 4321)
    assert _publisher(directory, observed).publish_once() is False
    assert "is owned by uid 4321, not you (uid 0)" in caplog.text
    assert list(directory.iterdir()) == []


def test_a_symlinked_directory_is_refused(tmp_path, observed):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "live"
    link.symlink_to(real)
    assert _publisher(link, observed).publish_once() is False
    assert list(real.iterdir()) == []
    with pytest.raises(livepaths.LiveDirError, match="symbolic link"):
        livepaths.ensure_live_dir(link)


def test_no_link_at_a_temporary_name_can_redirect_a_write(tmp_path, observed, monkeypatch):
    directory = tmp_path / "live"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    names = iter(["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"])
    monkeypatch.setattr(livepaths.secrets, "token_hex", lambda n: next(names))
    (directory / f".{os.getpid()}.aaaaaaaaaaaaaaaa.tmp").symlink_to(victim)  # the guessed name
    (directory / f"{os.getpid()}.json").symlink_to(victim)  # and the final name
    assert _publisher(directory, observed).publish_once()
    assert victim.read_text() == "precious"
    state = directory / f"{os.getpid()}.json"
    assert not state.is_symlink() and json.loads(state.read_text())["pid"] == os.getpid()
    assert (directory / f".{os.getpid()}.aaaaaaaaaaaaaaaa.tmp").is_symlink()  # left alone, not followed


def test_readers_never_follow_links_or_wait_on_fifos(tmp_path):
    directory = tmp_path / "live"
    directory.mkdir(mode=0o700)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(state_doc(os.getpid())))
    (directory / f"{os.getpid()}.json").symlink_to(secret)
    os.mkfifo(directory / "1.json")  # pid 1 is alive: a reader that opened this would block
    assert read_live_state(directory, cleanup=False) == []


def test_concurrent_producers_and_readers_see_no_torn_file(tmp_path):
    directory = tmp_path / "live"
    livepaths.ensure_live_dir(directory)
    models = [{"model_id": i, "name": "m" * 200, "uuid": "u", "core": 0, "device": 0, "loaded_at": 1.0,
               "memory": {"tensors": 1}, "executions": 0} for i in range(200)]
    doc = state_doc(os.getpid(), models=models)
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            while not stop.is_set():
                livepaths.write_private(directory, f"{os.getpid()}.json",
                                        json.dumps(doc | {"sequence": n}).encode())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    reads = 0
    try:
        first = time.time() + 10.0  # read once a producer has written (a loaded machine starts them
        while not (directory / f"{os.getpid()}.json").exists() and time.time() < first:  # late)
            time.sleep(0.001)
        deadline = time.time() + 2.0
        while time.time() < deadline:
            states = read_live_state(directory, cleanup=False)
            assert len(states) == 1 and len(states[0].models) == 200  # whole, never half
            reads += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert reads > 10 and not errors
    assert [p.name for p in directory.iterdir()] == [f"{os.getpid()}.json"]
