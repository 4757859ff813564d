"""bench/llm_decode.py's grid and its bucket-weighted TPOT, without compiling anything.

The bench is loaded by its path (bench/README.md: how a bench script is reached from tests); its
``Grid.run`` (compile + simulate) is replaced by a table of per-program times, so these tests check
the arithmetic the published comparison rests on, not the cost model.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from neuroncore.generation import decode_contexts, select_bucket

BENCH = Path(__file__).resolve().parents[1] / "bench" / "llm_decode.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("llm_decode_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_token_buckets_follow_transformers_neuronx(bench):
    assert bench.token_buckets(256) == (128, 256)
    assert bench.token_buckets(4096) == (128, 256, 512, 1024, 2048, 4096)
    assert bench.token_buckets(3000) == (128, 256, 512, 1024, 2048, 3000)
    assert bench.token_buckets(100) == (100,)


def test_grid_respects_max_positions(bench):
    keys = {str(k) for k in bench.grid_keys(["llama2-7b", "mistral-7b"], ["inf2.48xlarge", "trn1.32xlarge"],
                                            [1], None)}
    assert "llama2-7b/inf2.48xlarge/tp24/b1/128-3968" in keys  # 4096 positions: Llama-2's limit
    assert "llama2-7b/trn1.32xlarge/tp32/b1/128-8064" not in keys  # 8192 > 4096
    assert "llama2-7b/inf2.48xlarge/tp24/b1/4096-4096" not in keys
    assert "mistral-7b/trn1.32xlarge/tp32/b1/8192-8192" in keys
    assert set(bench.CALIBRATION) <= {str(k) for k in bench.grid_keys(
        list(bench.MODELS), list(bench.INSTANCES), list(bench.BATCHES), None)}


def test_tpot_is_the_mean_over_every_decode_step(bench, monkeypatch):
    """Each bucket's program simulated once and weighted by its steps equals the plain mean over
    all steps when a step's time depends only on its bucket."""
    def step_ms(bucket: int) -> float:
        return 1.0 + bucket / 1000.0

    def fake_run(self, workload, key, context):
        ms = 50.0 if workload == "llama-prefill" else step_ms(context + 1)
        return bench.Timed(ms, ms, 0.0, 0.0, 0.0, 0)

    monkeypatch.setattr(bench.Grid, "run", fake_run)
    key = bench.Key("llama2-7b", "inf2.48xlarge", 24, 2, 128, 3968)
    figures = bench.Grid().figures(key)
    buckets = bench.token_buckets(128 + 3968)
    steps = [step_ms(select_bucket(buckets, c)) for c in decode_contexts(128, 3968)]
    assert len(steps) == 3967
    assert figures["tpot_ms"] == pytest.approx(sum(steps) / len(steps), abs=1e-3)
    assert figures["ttft_ms"] == 50.0
    total_s = (50.0 + sum(steps)) / 1e3
    assert figures["tokens_per_s"] == pytest.approx(2 * 3968 / total_s, abs=0.1)
    assert sum(figures["steps_by_bucket"].values()) == 3967


def test_calibration_errors_are_relative(bench):
    key = "llama2-70b/trn1.32xlarge/tp32/b1/128-128"
    out = {key: {"ttft_ms": 53.9 * 1.1, "tpot_ms": 25.18 * 0.5}}
    errors = bench.calibration_errors(out)
    assert errors[key]["ttft_ms"]["error"] == pytest.approx(0.1)
    assert errors[key]["tpot_ms"]["error"] == pytest.approx(-0.5)


def test_heads_are_laid_out_as_transformers_neuronx_does(bench):
    """The 8 KV heads of Llama-3-8B are replicated to one per rank at tp 24 (queries padded 32 ->
    48), and the decode graph the bench times holds exactly those heads in its cache inputs."""
    from neuroncore.workloads import get

    key = bench.Key("llama3-8b", "inf2.48xlarge", 24, 1, 128, 128)
    figures = bench.head_figures(key)
    assert (figures["q_heads"], figures["kv_heads"], figures["kv_copies"]) == (48, 24, 3)
    # 32 layers x K and V x 1 head per rank x 256 positions x 128 x bf16
    assert figures["kv_cache_mib_per_rank"] == 2 * 32 * 256 * 128 * 2 / 2**20
    graph = get("llama-decode").graph("llama3-8b", batch=1, context=127, tp_degree=24)
    assert {p.shape[1] for p in graph.parameters if p.name.startswith("past_")} == {24}
    mha = bench.head_figures(bench.Key("llama2-13b", "trn1.32xlarge", 32, 1, 128, 128))
    assert (mha["q_heads"], mha["kv_heads"], mha["kv_copies"]) == (64, 64, 1)  # padded, not copied


def test_each_key_reports_what_it_cost_and_programs_are_shared(bench, monkeypatch, capsys):
    """A program is made once per (phase, model, instance, batch, context): 128/3968 reuses the
    prefill and the first decode buckets 128/128 made; each key's new programs add up to the run's,
    and --progress leaves one stderr line per finished key."""
    def fake_run(self, workload, key, context):
        return self.cache.setdefault((workload, key.model, key.instance, key.batch, context),
                                     bench.Timed(1.0, 1.0, 0.0, 0.0, 0.0, 0))

    monkeypatch.setattr(bench.Grid, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["llm_decode.py", "--models", "llama2-7b", "--instances",
                                      "inf2.48xlarge", "--batches", "1", "--lengths", "128-128", "128-3968",
                                      "--jobs", "1", "--progress"])
    bench.main()
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    short = out["llama2-7b/inf2.48xlarge/tp24/b1/128-128"]
    long = out["llama2-7b/inf2.48xlarge/tp24/b1/128-3968"]
    assert short["programs_new"] == 1 + len(short["steps_by_bucket"])
    assert long["programs_new"] == len(set(long["steps_by_bucket"]) - set(short["steps_by_bucket"]))
    assert short["programs_new"] + long["programs_new"] == out["programs_simulated"]
    progress = [json.loads(line) for line in captured.err.splitlines()]
    assert [p["done"] for p in progress] == [1, 2] and all(p["of"] == 2 for p in progress)
    assert {"key_wall_s", "key_cpu_s"} <= set(long) and "bench_cpu_s" in out


def test_the_host_copies_the_embedded_prompt_to_every_rank(bench):
    """transformers-neuronx 2.18 embeds on the CPU and writes the hidden states to every rank's
    input buffer: one chip of two ranks receives 2 x batch x tokens x hidden FP16 values, plus the
    integer inputs; a decode step copies one token's."""
    import neuroncore as nc
    from neuroncore.runtime.host_io import request_latency_ns

    g = nc.GraphBuilder("ids")
    ids = g.parameter("ids", (2, 128), "int32")
    graph = g.build([g.convert(ids, "fp32")])
    prefill = bench.host_input_bytes(graph, 2, 128, 4096, 2)
    assert prefill == 2 * 128 * 4 + 2 * 2 * 128 * 4096 * 2
    assert bench.host_input_bytes(graph, 2, 1, 4096, 2) == 2 * 128 * 4 + 2 * 2 * 1 * 4096 * 2
    spec = nc.Instance("inf2.48xlarge").core(0).spec
    ids_only = request_latency_ns(spec, 0.0, 2 * 128 * 4, 0)
    # 4 MiB more on one 17 B/ns engine: ~0.25 ms more latency before the execution starts
    assert request_latency_ns(spec, 0.0, prefill, 0) - ids_only == pytest.approx(
        2 * 2 * 128 * 4096 * 2 * 1e9 / spec.dma_engine_bytes_per_s)


TIMINGS = {"sim_wall_s", "compile_wall_s", "key_wall_s", "key_cpu_s", "bench_wall_s", "bench_cpu_s", "jobs",
           "grid_instructions_per_cpu_s"}


def _figures(out: dict) -> dict:
    """A run's JSON without what depends on the machine's speed (or on --jobs)."""
    return {k: ({f: v for f, v in value.items() if f not in TIMINGS} if isinstance(value, dict) else value)
            for k, value in out.items() if k not in TIMINGS}


def test_two_workers_give_the_serial_figures():
    """--jobs 2 makes the programs in two spawned worker processes: the same figures, keys in the
    same order, each program made once, and each key's cost the CPU of the worker that made it.
    The smallest real sub-grid: 7B inf2 tp24 at batch 1 and 4, 128/128 (four programs)."""
    import os
    import subprocess

    root = BENCH.parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    args = [sys.executable, str(BENCH), "--models", "llama2-7b", "--instances", "inf2.48xlarge",
            "--batches", "1", "4", "--lengths", "128-128"]
    runs = {}
    for jobs in (1, 2):
        done = subprocess.run([*args, "--jobs", str(jobs)], capture_output=True, text=True, env=env,
                              check=True, timeout=300)
        runs[jobs] = json.loads(done.stdout)
    serial, parallel = runs[1], runs[2]
    assert parallel["jobs"] == 2 and serial["jobs"] == 1
    assert list(parallel) == list(serial)
    assert _figures(parallel) == _figures(serial)
    assert parallel["programs_simulated"] == 4
    for out in runs.values():
        keys = [k for k in out if k.startswith("llama2-7b/")]
        assert [out[k]["programs_new"] for k in keys] == [2, 2]
        assert all(out[k]["key_cpu_s"] > 0 for k in keys)
        assert out["bench_cpu_s"] >= sum(out[k]["key_cpu_s"] for k in keys) - 0.2
        # what the grid compiled: each program's rank instructions, counted once, in the key that made it
        assert all(out[k]["instructions_new"] > 0 for k in keys)
        assert out["instructions_compiled"] == sum(out[k]["instructions_new"] for k in keys)
        assert out["grid_instructions_per_cpu_s"] == round(out["instructions_compiled"] / out["bench_cpu_s"])


def test_jobs_must_be_positive():
    import subprocess

    done = subprocess.run([sys.executable, str(BENCH), "--jobs", "0"], capture_output=True, text=True)
    assert done.returncode != 0 and "--jobs must be at least 1, not 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_workers_start_a_program_only_where_its_memory_fits(bench):
    """The biggest programs first, but a prefill whose estimated memory does not fit next to the
    running ones waits (a smaller one starts instead); with nothing running, the first runs alone."""
    big = ("llama-prefill", "llama3-70b", "inf2.48xlarge", 8, 4096)  # 32,768 tokens x 80 layers
    mid = ("llama-prefill", "llama2-7b", "inf2.48xlarge", 8, 2048)
    step = ("llama-decode", "llama2-7b", "inf2.48xlarge", 1, 255)
    assert 17 * 2**30 < bench.estimated_rss_bytes(big) < 18 * 2**30  # the grid's biggest (session 12)
    assert 1.64 * 2**30 < bench.estimated_rss_bytes(mid) < 2.5 * 2**30  # 1.64 GiB measured (session 12)
    pending = sorted([step, mid, big], key=bench.estimated_cost, reverse=True)
    assert pending == [big, mid, step]
    budget = int(18.5 * 2**30)  # big alone fits, nothing beside it
    assert bench.next_program(pending, [], budget) == big
    assert bench.next_program(pending, [big], budget) is None  # nothing fits next to it
    assert bench.next_program([big, step], [mid], budget) == step
    assert bench.next_program([], [mid], budget) is None



# peak resident sets (VmHWM) measured in session 12, one program made as `simulate` makes it, alone
# (GiB; bench/README.md): (phase, model, instance, batch, tokens) -> peak
MEASURED_PEAK_GIB = {
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 1, 2048): 0.72,
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 2, 2048): 1.36,
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 4, 2048): 2.49,
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 1, 4096): 1.46,
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 8, 128): 0.45,
    ("llama-prefill", "llama3-70b", "inf2.48xlarge", 1, 2048): 0.83,
    ("llama-prefill", "llama2-13b", "inf2.48xlarge", 1, 2048): 0.39,
    ("llama-prefill", "llama3-8b", "trn1.32xlarge", 1, 8192): 0.78,
    ("llama-prefill", "llama2-7b", "inf2.48xlarge", 8, 2048): 1.64,
    ("llama-prefill", "llama2-7b", "trn1.32xlarge", 4, 2048): 0.68,
    ("llama-prefill", "mistral-7b", "inf2.48xlarge", 1, 8192): 1.10,
    # the grid's two biggest (50.9 and 61.8 M nodes), skipped for memory before session 12
    ("llama-prefill", "llama3-70b", "trn1.32xlarge", 8, 4096): 10.01,
    ("llama-prefill", "llama3-70b", "inf2.48xlarge", 8, 4096): 12.30,
}


def test_the_memory_estimate_bounds_every_measured_program(bench):
    """The estimate keeps the workers from being killed only if it is an upper bound (session 9's
    was 0-2 % above the biggest measured, and a 70B prefill it put at 12.0 GiB was OOM-killed);
    it is also not so loose that it would skip programs this machine can make (< 1.5 x + 0.2 GiB)."""
    for program, peak in MEASURED_PEAK_GIB.items():
        estimate = bench.estimated_rss_bytes(program) / 2**30
        assert peak < estimate < 1.5 * peak + 0.2, (program, peak, estimate)


def test_programs_over_the_available_memory_are_skipped_in_one_line(bench, monkeypatch, capsys):
    """A program estimated past the memory available would be killed part way (no swap here): the
    run names it on stderr, gives its keys a "skipped" entry and every other key its figures."""
    def fake_run(self, workload, key, context):
        return self.cache.setdefault((workload, key.model, key.instance, key.batch, context),
                                     bench.Timed(1.0, 1.0, 0.0, 0.0, 0.0, 0))

    monkeypatch.setattr(bench.Grid, "run", fake_run)
    big = ("llama-prefill", "llama2-7b", "inf2.48xlarge", 8, 2048)
    assert bench.estimated_rss_bytes(big) > 2 * 2**30  # the others (b1 prefill, decode steps) fit
    monkeypatch.setattr(bench, "memory_budget_bytes", lambda: 2 * 2**30)
    monkeypatch.setattr(sys, "argv", ["llm_decode.py", "--models", "llama2-7b", "--instances",
                                      "inf2.48xlarge", "--batches", "1", "8", "--lengths", "2048-2048",
                                      "--jobs", "1"])
    bench.main()
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "tpot_ms" in out["llama2-7b/inf2.48xlarge/tp24/b1/2048-2048"]
    skipped = out["llama2-7b/inf2.48xlarge/tp24/b8/2048-2048"]
    assert set(skipped) == {"skipped"}
    assert skipped["skipped"].startswith("llama2-7b inf2.48xlarge b8 prefill (2048 tokens): estimated peak")
    assert "more than the 2.0 GiB available" in skipped["skipped"] and "--ignore-memory" in skipped["skipped"]
    assert out["keys_skipped"] == 1 and out["keys_failed"] == 0
    assert captured.err.count("llm_decode: skipped") == 1 and "Traceback" not in captured.err


def test_a_program_that_fails_fails_only_its_keys(bench, monkeypatch, capsys):
    """One program raising (e.g. a placement the compiler cannot make) fails the keys that need it,
    in one line each; the other keys keep their figures and the run exits non-zero after printing."""
    def fake_run(self, workload, key, context):
        program = (workload, key.model, key.instance, key.batch, context)
        if key.batch == 4 and workload == "llama-decode":
            raise RuntimeError("cannot place silu.75.t2 in SBUF\nsecond line")
        return self.cache.setdefault(program, bench.Timed(1.0, 1.0, 0.0, 0.0, 0.0, 0))

    monkeypatch.setattr(bench.Grid, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["llm_decode.py", "--models", "llama2-7b", "--instances",
                                      "inf2.48xlarge", "--batches", "1", "4", "--lengths", "128-128",
                                      "--jobs", "1", "--progress"])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert stopped.value.code == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "tpot_ms" in out["llama2-7b/inf2.48xlarge/tp24/b1/128-128"]
    failed = out["llama2-7b/inf2.48xlarge/tp24/b4/128-128"]
    assert failed == {"failed": "RuntimeError: cannot place silu.75.t2 in SBUF"}
    assert out["keys_failed"] == 1
    lines = captured.err.splitlines()
    failed_line = "llm_decode: llama2-7b/inf2.48xlarge/tp24/b4/128-128 failed: RuntimeError: cannot place"
    assert failed_line in lines[-2]
    progress = [json.loads(line) for line in lines if line.startswith("{")]
    assert "tpot_ms" in progress[0] and "failed" in progress[1]  # --progress lines carry the figures


def test_a_signal_in_a_serial_run_stops_it_and_keeps_the_finished_keys(bench, monkeypatch, capsys):
    """--jobs 1 makes the programs in the run's own process: SIGINT there (``Stopped`` raised by
    the handler) stops the run, not only the key being made (it is not a key's failure), the
    finished key keeps its figures and the exit is 128 + 2."""
    import signal

    def fake_run(self, workload, key, context):
        if key.prompt == 2048:
            bench._stop_on(signal.SIGINT, None)
        return self.cache.setdefault((workload, key.model, key.instance, key.batch, context),
                                     bench.Timed(1.0, 1.0, 0.0, 0.0, 0.0, 0))

    monkeypatch.setattr(bench.Grid, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["llm_decode.py", "--models", "llama2-7b", "--instances",
                                      "inf2.48xlarge", "--batches", "1", "--lengths", "128-128", "2048-2048",
                                      "--jobs", "1"])
    try:
        with pytest.raises(SystemExit) as stopped:
            bench.main()
    finally:  # the handler restored the defaults; leave pytest's own
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stopped.value.code == 128 + signal.SIGINT
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "tpot_ms" in out["llama2-7b/inf2.48xlarge/tp24/b1/128-128"]
    assert out["llama2-7b/inf2.48xlarge/tp24/b1/2048-2048"] == {
        "stopped": "the run was stopped by SIGINT before its programs were made"}
    assert out["keys_failed"] == 0 and out["keys_stopped"] == 1 and "failed" not in captured.err


class _Pool:
    """A stand-in for the worker pool: futures resolve when the bench waits on them, as a program
    in ``fates`` says: "ok", "error" (the worker raised) or "die" (the worker was killed, so every
    future of the pool still unresolved is broken, as ProcessPoolExecutor reports it)."""

    submitted: ClassVar[list[list]] = []

    def __init__(self, max_workers, mp_context, **initializer):
        self.futures: list = []
        _Pool.submitted.append([])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, program, quantize):
        from concurrent.futures import Future

        future: Future = Future()
        future.program = program  # type: ignore[attr-defined]
        future.pool = self  # type: ignore[attr-defined]
        self.futures.append(future)
        _Pool.submitted[-1].append(program)
        return future


def test_a_worker_killed_fails_only_its_program(bench, monkeypatch):
    """A worker killed (out of memory) breaks its pool and every program running in it: those are
    tried again one at a time, the one that dies alone is failed, the others keep their figures."""
    from concurrent.futures.process import BrokenProcessPool

    from neuroncore.workloads import LLAMA_PRESETS  # noqa: F401 - the bench's presets are loaded

    keys = bench.grid_keys(["llama2-7b"], ["inf2.48xlarge"], [1, 4], [(128, 128)])
    dying = ("llama-prefill", "llama2-7b", "inf2.48xlarge", 4, 128)
    fates = {p: "ok" for key in keys for p in bench.programs_of(key)}
    fates[dying] = "die"

    def fake_wait(futures, return_when):
        pools = {f.pool for f in futures}
        for pool in pools:
            unresolved = [f for f in pool.futures if not f.done()]
            if any(fates[f.program] == "die" for f in unresolved):
                for f in unresolved:
                    f.set_exception(BrokenProcessPool("A process in the process pool was terminated"))
            for f in unresolved:
                if not f.done():
                    f.set_result((tuple(bench.Timed(1.0, 1.0, 0.0, 0.0, 0.0, 0).__dict__.values()), 0.1, 0.1))
        return set(futures), set()

    _Pool.submitted = []
    monkeypatch.setattr(bench, "ProcessPoolExecutor", _Pool)
    monkeypatch.setattr(bench, "wait", fake_wait)
    monkeypatch.setattr(bench, "memory_budget_bytes", lambda: 2**40)
    grid = bench.Grid()
    finished: list = []
    grid.run_parallel(keys, 2, "none", finished.append)
    assert sorted(map(str, finished)) == sorted(map(str, keys))
    assert set(grid.failed) == {dying} and "worker process died" in grid.failed[dying]
    assert grid.failure(keys[1]).startswith("llama2-7b inf2.48xlarge b4 prefill (128 tokens): its worker")
    assert grid.failure(keys[0]) is None and "tpot_ms" in grid.figures(keys[0])
    first_pool = _Pool.submitted[0]
    assert dying in first_pool and len(first_pool) == 2  # it broke the pool with another running
    retried = [pool for pool in _Pool.submitted[1:] if dying in pool]
    assert retried and all(pool[pool.index(dying):] == [dying] or len(pool) == 1 for pool in retried)
    assert all(p in grid.cache for p in fates if p != dying)  # the innocent one was made again


def _processes_of(parent: int) -> list[int]:
    """The child processes of ``parent`` (Linux /proc: each process's fourth stat field)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used; -1 once it is gone (a zombie counts as gone)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return -1.0
    return -1.0 if fields[0] in "ZX" else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(args: list[str]):
    """The bench started as a user does, and a way to wait for its workers to be computing."""
    import os
    import subprocess
    import time

    env = {**os.environ, "PYTHONPATH": str(BENCH.parents[1])}
    run = subprocess.Popen([sys.executable, str(BENCH), *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)

    def busy_workers(cpu_s: float, timeout: float = 120.0) -> list[int]:
        """The run's two spawned workers (their command lines run multiprocessing's spawn_main),
        once one of them has used ``cpu_s`` CPU seconds (imports done: inside a program)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and run.poll() is None:
            workers = [pid for pid in _processes_of(run.pid)
                       if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
            if len(workers) == 2 and max(map(_cpu_s, workers)) >= cpu_s:
                return workers
            time.sleep(0.1)
        raise AssertionError(f"no busy workers in {timeout} s (exit {run.poll()})")

    return run, busy_workers


def _gone(workers: list[int], within_s: float) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while any(_cpu_s(w) >= 0 for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    return all(_cpu_s(w) < 0 for w in workers)


# a 2,048-token prefill (b1 ~8 CPU s, b4 ~20) and its key's one decode bucket: workers busy for seconds
_SLICE = ["--models", "llama2-7b", "--instances", "inf2.48xlarge", "--jobs", "2", "--lengths", "2048-2048"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_the_run_even_killed():
    """SIGKILL leaves the run no say: its workers end with it (PR_SET_PDEATHSIG) instead of
    finishing their programs as orphans (session 9 found a 1.7 GB one)."""
    import os
    import signal

    run, busy_workers = _start([*_SLICE, "--batches", "1"])
    workers: list[int] = []
    try:
        workers = busy_workers(1.5)
        run.kill()
        run.wait(timeout=10)
        assert _gone(workers, within_s=5.0)
    finally:
        run.kill()
        for pid in workers:
            if _cpu_s(pid) >= 0:
                os.kill(pid, signal.SIGKILL)
        run.communicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_the_workers_and_prints_the_finished_keys():
    """SIGTERM part way: the workers are killed at once, the keys finished so far keep their
    figures in the JSON line, the others say they were stopped, and the exit is 128 + 15."""
    import os
    import signal
    import threading

    run, busy_workers = _start([*_SLICE, "128-128", "--batches", "4", "--progress"])
    timer = threading.Timer(180.0, run.kill)  # bounded whatever happens
    timer.start()
    workers: list[int] = []
    try:
        workers = busy_workers(0.0)
        assert run.stderr is not None
        for line in run.stderr:  # the 128-128 key finishes long before the 8,192-row prefill
            if line.startswith("{"):
                assert json.loads(line)["key"] == "llama2-7b/inf2.48xlarge/tp24/b4/128-128"
                break
        run.send_signal(signal.SIGTERM)
        assert _gone(workers, within_s=3.0)  # not after the prefill's ~15 CPU s left
        stdout, stderr = run.communicate(timeout=30)
        assert run.returncode == 128 + signal.SIGTERM, stderr
        out = json.loads(stdout)
        assert "tpot_ms" in out["llama2-7b/inf2.48xlarge/tp24/b4/128-128"]
        assert out["llama2-7b/inf2.48xlarge/tp24/b4/2048-2048"] == {
            "stopped": "the run was stopped by SIGTERM before its programs were made"}
        assert out["stopped"] == "SIGTERM" and out["keys_stopped"] == 1 and out["keys_failed"] == 0
        assert "llm_decode: stopped by SIGTERM: 1 of 2 keys finished" in stderr
        assert "Traceback" not in stderr
    finally:
        timer.cancel()
        run.kill()
        for pid in workers:
            if _cpu_s(pid) >= 0:
                os.kill(pid, signal.SIGKILL)
