"""LLM generation timing on whole instances, tensor-parallel, against the published tables: one JSON line.

    python bench/llm_decode.py            # the whole grid below (slow: see bench/README.md)
    python bench/llm_decode.py --quick    # the two LLM calibration configurations only
    python bench/llm_decode.py --models llama2-7b --instances inf2.48xlarge --jobs 2
    python bench/llm_decode.py --models llama2-7b --batches 1 --lengths 128-128
    python bench/llm_decode.py --models llama2-7b --batches 1 --lengths 128-128 --quantize int8-weight-only

The grid is the one AWS publishes for transformers-neuronx (Neuron 2.18 decoder tables): Llama-2
7B/13B/70B, Llama-3 8B/70B and Mistral-7B, on inf2.48xlarge (tp 24) and trn1.32xlarge (tp 32),
batch 1/4/8, input/output tokens 128/128, 128/3968 (inf2) or 128/8064 (trn1), 2048/2048, 4096/4096
and 8192/8192, each where input + output fits the model's max positions (``MAX_POSITIONS``).
Every model is the full-size graph (random weights, timing only: no weight is ever allocated), its
heads laid out for the ranks as transformers-neuronx does, sharded Megatron-style and compiled once
per shape.

Per key ``"<model>/<instance>/tp<N>/b<B>/<in>-<out>"``:

Both latencies are what the host sees (``neuroncore.runtime.host_io.request_latency_ns``): the
runtime's per-execution overhead, the inputs copied in (the hidden states transformers-neuronx
embeds on the host, written to every rank: ``host_input_bytes``), the execution, the logits copied
out (the KV cache stays on the device, as transformers-neuronx keeps it).

* ``ttft_ms``: context encoding of the ``in``-token prompt (causal attention, all layers, last-token
  logits). transformers-neuronx compiles prompt buckets of half each token bucket, so every
  published input (128, 2048, 4096, 8192) is a bucket of its own: the prefill runs at exactly ``in``.
* ``tpot_ms``: the mean over the generation's decode steps (every output token after the first,
  which the prefill makes) with the context growing, each step run in its context bucket: the
  smallest of the compiled buckets that holds its context (``neuroncore.generation.select_bucket``).
  The buckets are transformers-neuronx's default for ``n_positions = in + out``: powers of two from
  128, then ``n_positions`` itself (``bucket.token_sizes`` -> ``power_of_two_bucket_sizes(128, n)``),
  e.g. 128/3968 -> 128, 256, ..., 2048, 4096. Each bucket's decode step is simulated once (timing
  only, its KV cache the bucket's length) and weighted by how many steps run in it
  (``steps_per_bucket``). A step's simulated time depends only on its program, i.e. on its bucket
  (the cache the program reads is the bucket's length whatever the live context), so this weighted
  mean equals the mean over all tokens exactly.
* ``tokens_per_s``: generated tokens over the generation's time, ``B * out / (ttft + (out-1)*tpot)``.
* ``heads``: the query and KV heads each program stores for the ranks (transformers-neuronx's
  rule, ``neuroncore.parallel.heads``): the 8 KV heads of Llama-2-70B, Llama-3 and Mistral-7B are
  replicated to one per rank (24 at tp 24, 32 at tp 32; queries padded 32 -> 48 or 64 -> 72 at tp
  24), Llama-2-7B/13B (MHA) are padded to 48 (or 64) heads; ``kv_cache_mib_per_rank`` is the cache
  one rank holds for ``in + out`` positions (bf16).
* ``sim_wall_s``: wall seconds simulating the executions this key uses (its prefill and each
  bucket's decode step; compilation excluded, it is in ``compile_wall_s`` once per program).
* ``key_wall_s``, ``key_cpu_s``, ``programs_new``: what the key cost in this run, i.e. making
  (building the graph, sharding, compiling, timing) the programs no earlier key of the grid's
  order needs, each measured in the process that made it (a program is made once per (phase,
  model, instance, batch, context) and shared by every key that needs it: 128/128 and 128/3968
  share their prefill and their first decode buckets). The run's totals are ``bench_wall_s`` and
  ``bench_cpu_s`` (every process's CPU: this one's and its workers'); ``--progress`` prints each
  key's line on stderr as soon as its programs are made, so a run stopped part way still gives
  its per-key times.

``--jobs N`` (default: the cores this process may use) makes the programs in N worker processes
(spawned, so none shares state with another), every program once, the biggest first
(``estimated_cost``); ``--jobs 1`` makes them one after the other in this process, in the grid's
order. The figures are the same either way, keys in the grid's order; with N workers the keys'
``key_wall_s`` overlap, so they add up to more than ``bench_wall_s``.

A program whose estimated peak memory (``estimated_rss_bytes``) alone is more than the memory
available when the run starts is not started: its keys are ``{"skipped": "<program>: <why>"}``
and stderr names it (``--ignore-memory`` runs it anyway; on this 24 GiB machine the grid's two
biggest prefills, Llama-3-70B b8 4096 tokens, are estimated at 14.7 GiB on trn1 and 17.6 on inf2
since session 12, so they run when the machine is otherwise idle). A program that
fails (an error in the compiler, a worker killed) fails only the keys that need it, each
``{"failed": "<program>: <error's first line>"}`` and one stderr line; every other key keeps its
figures, the JSON line is printed, and the run exits 1. ``keys_skipped`` / ``keys_failed`` count
them; ``--progress`` lines carry each key's figures as it finishes. SIGTERM or SIGINT stops
the run: its workers are killed at once, the JSON line is printed with the keys finished so far,
the others ``{"stopped": ...}`` (``stopped``, ``keys_stopped``), exit 128 + the signal. Workers
never outlive the run, however it ends (``_die_with_parent``).

The numbers come from the execution core's cost model (neuroncore.md: engine rates, HBM and DMA
costs, per-execution overheads) and the collective model (NeuronLink topology, algorithms, hop
latency), not from hardware. ``calibration`` gives the error on each public calibration point.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass
from typing import Any

from neuronscope import settings

# the core's own speed: no live-state publisher attached (it would make the core build records)
os.environ.setdefault(settings.LIVE.name, "0")

from neuroncore.compiler import CompilerOptions, Quantization
from neuroncore.generation import normalize_buckets, steps_per_bucket
from neuroncore.ir.graph import Graph
from neuroncore.parallel import TensorParallelModel
from neuroncore.parallel.heads import head_counts
from neuroncore.runtime import Instance
from neuroncore.runtime.host_io import request_latency_ns
from neuroncore.workloads import LLAMA_PRESETS, MAX_POSITIONS, get

MODELS = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "mistral-7b")
INSTANCES = {"inf2.48xlarge": 24, "trn1.32xlarge": 32}  # instance -> tp degree of the tables
LONG_OUTPUT = {"inf2.48xlarge": 3968, "trn1.32xlarge": 8064}  # 128 + out = 4096 / 8192
BATCHES = (1, 4, 8)

# public calibration points (ms): key -> {figure: published}
CALIBRATION = {
    "llama2-7b/inf2.48xlarge/tp24/b1/128-3968": {"ttft_ms": 27.6, "tpot_ms": 6.47},
    "llama2-70b/trn1.32xlarge/tp32/b1/128-128": {"ttft_ms": 53.9, "tpot_ms": 25.18},
}


def host_input_bytes(graph: Graph, batch: int, tokens: int, hidden: int, ranks_per_chip: int) -> int:
    """Bytes the host copies to one chip for one execution (``request_latency_ns``'s input copy,
    on the chip's one host-to-device DMA engine; the chips copy in parallel).

    transformers-neuronx (Neuron 2.18) embeds the tokens on the host: with ``on_device_embedding``
    off (the default then; its 2.18 samples set it off explicitly) ``forward`` runs
    ``chkpt_model.model.embed_tokens(input_ids)`` on the CPU and the decoder writes the hidden
    states into an input buffer that ``ParallelTensorManipulator.duplicate`` made on *every* rank,
    so each chip receives ``batch x tokens x hidden`` FP16 values once per rank it holds (a 128-token
    Llama-2-7B prompt: 1 MiB per rank, 2 MiB per inf2 chip). The integer inputs (positions, cache
    ids; our program's token ids stand in for them) are counted as they are. The program still
    gathers its embedding rows on the device: a few microseconds counted twice [assumption: the
    gather is not worth a second program shape]."""
    integers = sum(p.nbytes for p in graph.parameters if not p.dtype.is_float)
    return integers + batch * tokens * hidden * 2 * ranks_per_chip


def lengths_for(instance: str) -> list[tuple[int, int]]:
    return [(128, 128), (128, LONG_OUTPUT[instance]), (2048, 2048), (4096, 4096), (8192, 8192)]


def token_buckets(n_positions: int) -> tuple[int, ...]:
    """transformers-neuronx's default token-generation buckets for ``n_positions`` (bucket.py)."""
    sizes, size = [], 128
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return normalize_buckets([*sizes, n_positions])


@dataclass(frozen=True)
class Key:
    model: str
    instance: str
    tp: int
    batch: int
    prompt: int
    output: int

    def __str__(self) -> str:
        return f"{self.model}/{self.instance}/tp{self.tp}/b{self.batch}/{self.prompt}-{self.output}"


@dataclass
class Timed:
    device_ms: float  # the execution on the device
    request_ms: float  # as the host sees it: + launch overhead, token ids in, logits out
    wall_s: float
    compile_s: float
    cc_ms: float
    collectives: int
    instructions: int = 0  # the rank program's engine instructions (bench/core.py's count)


Program = tuple[str, str, str, int, int]  # (phase, model, instance, batch, context)


def programs_of(key: Key) -> list[Program]:
    """The programs ``key`` needs, in the order a serial run makes them: its prefill, then one
    decode step per bucket (a bucket-b step attends over b positions: b - 1 cached plus the new
    token's)."""
    buckets = steps_per_bucket(token_buckets(key.prompt + key.output), key.prompt, key.output)
    return [("llama-prefill", key.model, key.instance, key.batch, key.prompt),
            *(("llama-decode", key.model, key.instance, key.batch, b - 1) for b in buckets)]


def simulate(program: Program, options: CompilerOptions | None = None) -> Timed:
    """Build ``program``'s full-size graph, shard it, compile the rank program, time one execution."""
    workload, model, instance, batch, context = program
    tp = INSTANCES[instance]
    graph = get(workload).graph(model, batch=batch, context=context, tp_degree=tp)
    t0 = time.perf_counter()
    group = TensorParallelModel.load(graph, Instance(instance), tp_degree=tp, options=options)
    t1 = time.perf_counter()
    result = group.execute(timing_only=True)
    t2 = time.perf_counter()
    group.unload()  # freed when this returns, not by the cycle collector (NeuronCore.unload)
    compiled = group.program
    # the KV cache stays on the device: the hidden states (embedded on the host) and the
    # positions go in, the logits out
    tokens = context if workload == "llama-prefill" else 1
    host_in = host_input_bytes(compiled.graph, batch, tokens, LLAMA_PRESETS[model]["hidden"],
                               group.topology.cores_per_device)
    host_out = compiled.graph.outputs[0].nbytes
    request = request_latency_ns(compiled.spec, result.device_time_ns, host_in, host_out)
    return Timed(result.device_time_ns / 1e6, request / 1e6, t2 - t1, t1 - t0,
                 result.collective_ns / 1e6, len(result.collectives), compiled.n_instructions)


def measured(program: Program, quantize: str) -> tuple[tuple, float, float]:
    """``simulate`` with what it cost the process that ran it (CPU and wall seconds, graph building
    and sharding included): the worker's entry point. Plain tuples cross the process boundary."""
    wall, cpu = time.perf_counter(), time.process_time()
    timed = simulate(program, CompilerOptions(quantize=Quantization(quantize)))
    cost = time.process_time() - cpu, time.perf_counter() - wall
    release_memory()
    return astuple(timed), *cost


def release_memory() -> None:
    """Hands the memory a finished program freed back to the system. glibc keeps freed heap pages
    in its arenas: a worker that made a Llama-2-7B b4 2,048-token prefill (peak 1.75 GiB) held
    1.05 GiB resident while idle or making its next, small program, invisible to the budget that
    sums the running programs' estimates; ``malloc_trim`` takes it down to 0.48 (0.10 at start:
    the rest is the core's caches). Nothing else changes: programs and figures are the same."""
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
            ctypes.CDLL(None).malloc_trim(0)


def estimated_cost(program: Program) -> int:
    """A rough relative compile cost, only to hand out the biggest programs first over the
    workers (longest processing time first): a prefill's grows with its layers and prompt tokens
    (docs/execution-core.md: 2-8 CPU s per 1,000 tokens), a decode bucket costs about what a
    ~200-token prefill does. Figures never depend on it."""
    workload, model, _, batch, context = program
    layers = LLAMA_PRESETS[model]["layers"]
    return layers * (batch * context if workload == "llama-prefill" else 200)


RSS_BASE_BYTES = 0.5 * 2**30  # interpreter, graph, tables, and caches earlier programs of the worker left
RSS_BYTES_PER_NODE = 230  # per estimated node: the program's columns, the lowering's lists, the run's times
DECODE_RSS_BYTES = int(1.25 * 2**30)  # any grid decode step: 0.9 GiB measured at most


def estimated_nodes(program: Program) -> int:
    """A prefill's compiled program size (nodes of one rank), an upper bound fitted to node counts
    measured on every kind of grid prefill (session 10, bench/README.md): per layer,

    * a fixed part, the layer's weight tiles: ``48 x hidden/128``;
    * per row (``batch x tokens``), ``k x hidden/128 x (1 + 32/tp) / 2``: half of a row's work is
      on the whole hidden state on every rank whatever tp (the norms, residual adds and the two
      all-reduces), half the rank's slices of the matmuls (1/tp); ``k`` grows with the rows
      (longer row runs stage more), ``0.29 + 0.03 x log2(rows / 2048)`` within [0.2, 0.345];
    * the attention scores, ``3.7e-4 x batch x query heads per rank x tokens^2`` (causal).

    The LM head (the last token's logits only) and the embedding gather are a few hundred nodes."""
    _, model, instance, batch, context = program
    dims, tp = LLAMA_PRESETS[model], INSTANCES[instance]
    q_heads = head_counts(dims["heads"], dims["kv_heads"], tp)[0] // tp
    width, rows = dims["hidden"] / 128, batch * context
    k = min(0.345, max(0.2, 0.29 + 0.03 * math.log2(rows / 2048)))
    per_layer = 48 * width + k * rows * width * (1 + 32 / tp) / 2 + 3.7e-4 * batch * q_heads * context**2
    return int(dims["layers"] * per_layer)


def estimated_rss_bytes(program: Program) -> int:
    """A peak resident set of the worker making ``program``, an upper bound, to keep two big ones
    from running at once and to skip one that cannot fit at all: a prefill's is its program's
    nodes (``estimated_nodes``) at ``RSS_BYTES_PER_NODE`` each over ``RSS_BASE_BYTES`` (session 12:
    measured peaks 220-320 bytes per node over ~0.16 GiB on programs of 2.3-11.4 M nodes, each
    alone, 160-209 per *estimated* node, which the node estimate puts 30-50 % over the counts;
    a worker keeps up to 0.4 GiB more after earlier programs; docs/execution-core.md
    "Program memory"); a decode step's is ``DECODE_RSS_BYTES`` (bench/README.md: the table)."""
    if program[0] != "llama-prefill":
        return DECODE_RSS_BYTES
    return int(RSS_BASE_BYTES + RSS_BYTES_PER_NODE * estimated_nodes(program))


def memory_budget_bytes() -> int:
    """What the workers may use together: the memory available when the run starts (Linux
    ``MemAvailable``), else the machine's."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_big(programs: set[Program], budget: int) -> dict[Program, str]:
    """The programs whose estimated peak memory alone is more than ``budget``, with why: started,
    each would be killed part way (or swap the machine to a crawl), so the run skips them and says
    so instead (``--ignore-memory`` runs them anyway)."""
    return {p: (f"estimated peak {estimated_rss_bytes(p) / 2**30:.1f} GiB, more than the "
                f"{budget / 2**30:.1f} GiB available (--ignore-memory runs it anyway)")
            for p in sorted(programs) if estimated_rss_bytes(p) > budget}


def next_program(pending: list[Program], running: list[Program], budget: int) -> Program | None:
    """The first of ``pending`` (biggest first) whose estimated memory fits next to the running
    programs' in ``budget``; with nothing running, the first (alone, whatever its estimate)."""
    if not running:
        return pending[0] if pending else None
    used = sum(estimated_rss_bytes(p) for p in running)
    return next((p for p in pending if used + estimated_rss_bytes(p) <= budget), None)


class ProgramFailed(Exception):
    """A program of the grid could not be made; the message says which and why, in one line."""


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the run (``_stop_on``): the workers are killed and the keys
    already finished are printed. Not an ``Exception`` (as ``KeyboardInterrupt`` is not), so
    that no handler of a key's or a program's failure takes it for one."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on(signum: int, frame: object) -> None:
    """SIGTERM / SIGINT handler of the run: raises ``Stopped`` in the main thread; a second
    signal acts as if none were handled (the process ends at once, its workers with it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    raise Stopped(signum)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> None:
    """Worker initializer: the worker ends when ``parent`` (the run) does, however it ends
    (SIGKILL included), instead of finishing its program as an orphan. On Linux the kernel kills
    it (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); everywhere a daemon thread checks once a second
    that the worker's parent is still ``parent`` (an orphan is re-parented) and ends the worker
    if not. A parent already gone before this ran is caught by the same check."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no libc prctl: the thread alone
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Kills the pool's worker processes now (not after their programs) and drops its queue."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


class Grid:
    """Simulates each (phase, model, instance, batch, length) program once, whatever keys share it;
    ``cost`` is what each program cost the process that made it (CPU s, wall s)."""

    def __init__(self, options: CompilerOptions | None = None) -> None:
        self.cache: dict[Program, Timed] = {}
        self.cost: dict[Program, tuple[float, float]] = {}
        self.failed: dict[Program, str] = {}  # programs that could not be made, with why (one line)
        self.options = options  # precision of every program (e.g. int8 weight-only)

    def failure(self, key: Key) -> str | None:
        """Why ``key`` has no figures (the first of its programs that failed), if it has none."""
        return next((f"{describe(p)}: {self.failed[p]}" for p in programs_of(key) if p in self.failed),
                    None)

    def run(self, workload: str, key: Key, context: int) -> Timed:
        program = (workload, key.model, key.instance, key.batch, context)
        if program in self.failed:
            raise ProgramFailed(self.failed[program])
        if program not in self.cache:
            wall, cpu = time.perf_counter(), time.process_time()
            self.cache[program] = simulate(program, self.options)
            self.cost[program] = (time.process_time() - cpu, time.perf_counter() - wall)
            release_memory()
        return self.cache[program]

    def figures(self, key: Key) -> dict[str, Any]:
        prefill = self.run("llama-prefill", key, key.prompt)
        per_bucket = steps_per_bucket(token_buckets(key.prompt + key.output), key.prompt, key.output)
        # a bucket-b step attends over b positions: b - 1 cached plus the new token's
        decode = {b: self.run("llama-decode", key, b - 1) for b in per_bucket}
        steps = sum(per_bucket.values())
        tpot = sum(decode[b].request_ms * n for b, n in per_bucket.items()) / steps
        total_ms = prefill.request_ms + tpot * steps
        return {
            "tpot_ms": round(tpot, 3),
            "ttft_ms": round(prefill.request_ms, 3),
            "tokens_per_s": round(key.batch * key.output / (total_ms / 1e3), 1),
            "sim_wall_s": round(prefill.wall_s + sum(t.wall_s for t in decode.values()), 3),
            "compile_wall_s": round(prefill.compile_s + sum(t.compile_s for t in decode.values()), 2),
            "decode_cc_ms_by_bucket": {str(b): round(t.cc_ms, 3) for b, t in decode.items()},
            "decode_device_ms_by_bucket": {str(b): round(t.device_ms, 3) for b, t in decode.items()},
            "steps_by_bucket": {str(b): n for b, n in per_bucket.items()},
            "heads": head_figures(key),
        }

    def run_parallel(self, keys: list[Key], jobs: int, quantize: str,
                     finished: Callable[[Key], None]) -> None:
        """Make every program ``keys`` need, each once, on ``jobs`` worker processes (spawned: a
        fresh interpreter each, no state shared with this one), biggest first, a program started
        only where its estimated memory fits next to the running ones' (``next_program``);
        ``finished(key)`` is called as soon as all of a key's programs are made or one failed.

        A program that raises is failed with its error's first line. A worker that dies (killed,
        e.g. by the kernel when memory runs out) takes its pool down with every program running
        in it: those are tried again one at a time, nothing beside them, and one that brings its
        pool down alone is failed. Every other program, and every figure already made, stays.

        The workers end with this process (``_die_with_parent``: even killed with SIGKILL), and
        when anything stops this one part way (``Stopped`` by SIGTERM / SIGINT, an error) they
        are killed before it returns, not left to finish their programs."""
        needed = list(dict.fromkeys(p for key in keys for p in programs_of(key)))
        waiting = {key: set(programs_of(key)) for key in keys}
        pending = sorted(needed, key=estimated_cost, reverse=True)
        budget = memory_budget_bytes()
        alone: set[Program] = set()  # were running when a worker died: retried with nothing beside
        context = multiprocessing.get_context("spawn")

        def settle(program: Program) -> None:
            for key in keys:
                if program in waiting[key]:
                    waiting[key].discard(program)
                    if not waiting[key] or program in self.failed:
                        waiting[key].clear()
                        finished(key)

        while pending:
            running: dict[Future, Program] = {}
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_die_with_parent,
                                     initargs=(os.getpid(),)) as pool:
                broken = False
                try:
                    while (pending or running) and not broken:
                        while len(running) < jobs and not alone & set(running.values()):
                            program = next_program(pending, list(running.values()), budget)
                            if program is None or (running and program in alone):
                                break
                            pending.remove(program)
                            running[pool.submit(measured, program, quantize)] = program
                        ready, _ = wait(running, return_when=FIRST_COMPLETED)
                        for future in ready:
                            program = running.pop(future)
                            try:
                                timed, cpu, wall = future.result()
                            except BrokenProcessPool:
                                broken = True
                                running[future] = program
                                continue
                            except Exception as error:  # a worker's error fails its program
                                self.failed[program] = first_line(error)
                            else:
                                self.cache[program] = Timed(*timed)
                                self.cost[program] = (cpu, wall)
                            settle(program)
                except BaseException:  # stopped (SIGTERM / SIGINT) or an error here: no orphans
                    _kill_workers(pool)
                    raise
            if broken:
                lost = list(running.values())
                if len(lost) == 1:
                    self.failed[lost[0]] = ("its worker process died (killed: out of memory? "
                                            f"estimated peak {estimated_rss_bytes(lost[0]) / 2**30:.1f} GiB)")
                    settle(lost[0])
                else:
                    alone.update(lost)
                    pending[:0] = sorted(lost, key=estimated_cost, reverse=True)


def describe(program: Program) -> str:
    """A program as one line names it: its phase, model, instance, batch and context."""
    workload, model, instance, batch, context = program
    phase = "prefill" if workload == "llama-prefill" else "decode step"
    return f"{model} {instance} b{batch} {phase} ({context} tokens)"


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def head_figures(key: Key) -> dict[str, int | float]:
    """The heads each program stores for ``key.tp`` ranks (transformers-neuronx's rule,
    ``neuroncore.parallel.heads``: KV heads replicated when tp does not divide them, query heads
    padded) and the KV cache one rank holds for the whole generation (bf16, in + out positions):
    the decode graphs' cache inputs have exactly these heads."""
    dims = LLAMA_PRESETS[key.model]
    heads, kv, copies = head_counts(dims["heads"], dims["kv_heads"], key.tp)
    head_dim = dims["hidden"] // dims["heads"]
    cache = 2 * dims["layers"] * key.batch * (kv // key.tp) * (key.prompt + key.output) * head_dim * 2
    return {"q_heads": heads, "kv_heads": kv, "kv_copies": copies,
            "kv_cache_mib_per_rank": round(cache / 2**20, 1)}


def grid_keys(models: list[str], instances: list[str], batches: list[int],
              lengths: list[tuple[int, int]] | None) -> list[Key]:
    keys = []
    for model in models:
        for instance in instances:
            for batch in batches:
                for prompt, output in lengths_for(instance):
                    if lengths is not None and (prompt, output) not in lengths:
                        continue
                    if prompt + output <= MAX_POSITIONS[model]:
                        keys.append(Key(model, instance, INSTANCES[instance], batch, prompt, output))
    return keys


def calibration_errors(out: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Simulated vs published on every calibration point the run covered; error = sim / pub - 1."""
    errors: dict[str, dict[str, dict[str, float]]] = {}
    for key, published in CALIBRATION.items():
        if key in out and all(figure in out[key] for figure in published):
            errors[key] = {figure: {"published": value, "simulated": out[key][figure],
                                    "error": round(out[key][figure] / value - 1.0, 4)}
                           for figure, value in published.items()}
    return errors


def _length(text: str) -> tuple[int, int]:
    prompt, _, output = text.partition("-")
    return int(prompt), int(output)


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) child processes: the workers."""
    times = os.times()
    return times.children_user + times.children_system


def default_jobs() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _jobs(text: str) -> int:
    jobs = int(text)
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be at least 1, not {jobs}")
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the LLM calibration configurations only")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--instances", nargs="+", choices=list(INSTANCES), default=list(INSTANCES))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--lengths", nargs="+", type=_length, metavar="IN-OUT",
                        help="input-output token pairs of the grid, e.g. 128-128 2048-2048")
    parser.add_argument("--quantize", choices=[q.value for q in Quantization], default="none",
                        help="int8-weight-only: transformers-neuronx's quantized configuration (int8 "
                             "linear weights, per-channel scales); calibration points are bf16 runs")
    parser.add_argument("--progress", action="store_true",
                        help="one JSON line per finished key on stderr (its wall and CPU seconds)")
    parser.add_argument("--jobs", type=_jobs, default=default_jobs(),
                        help="worker processes making the programs (default: the cores this process "
                             "may use); 1: one after the other in this process")
    parser.add_argument("--ignore-memory", action="store_true",
                        help="run programs whose estimated peak memory is more than is available "
                             "(skipped otherwise, each named on stderr and in the JSON)")
    args = parser.parse_args()
    options = CompilerOptions(quantize=Quantization(args.quantize))
    if args.quick:
        keys = [k for k in grid_keys(list(MODELS), list(INSTANCES), list(BATCHES), None)
                if str(k) in CALIBRATION]
    else:
        keys = grid_keys(args.models, args.instances, args.batches, args.lengths)
    out: dict = {"dtype": "bf16", "quantize": args.quantize,
                 "bucket_rule": "powers of two from 128 up to in+out, then in+out"}
    grid = Grid(options)
    started, started_cpu, children = time.perf_counter(), time.process_time(), _children_cpu_s()
    # what a key cost in this run: making the programs no earlier key (in the grid's order) needed
    first: dict[Key, list[Program]] = {}
    made: set[Program] = set()
    for key in keys:
        first[key] = [p for p in programs_of(key) if p not in made]
        made.update(first[key])
    skipped = {} if args.ignore_memory else too_big(made, memory_budget_bytes())
    for program, reason in skipped.items():
        print(f"llm_decode: skipped {describe(program)}: {reason}", file=sys.stderr, flush=True)
    runnable = [key for key in keys if not skipped.keys() & set(programs_of(key))]
    jobs = min(args.jobs, max(len(made - skipped.keys()), 1))
    done: list[Key] = []

    def key_cost(key: Key) -> dict[str, float | int]:
        cost = [grid.cost.get(p, (0.0, 0.0)) for p in first[key]]
        made_now = [grid.cache[p] for p in first[key] if p in grid.cache]
        return {"key_wall_s": round(sum(c[1] for c in cost), 2),
                "key_cpu_s": round(sum(c[0] for c in cost), 2), "programs_new": len(first[key]),
                "instructions_new": sum(t.instructions for t in made_now)}

    def result(key: Key) -> dict:
        """The key's figures, or why it has none (every program it needs is made or failed)."""
        failure = grid.failure(key)
        if failure is None:
            try:
                return {**grid.figures(key), **key_cost(key)}
            except ProgramFailed:
                failure = grid.failure(key)
            except Exception as error:  # one key's failure keeps the others' figures
                failure = first_line(error)
        return {"failed": failure}

    def finished(key: Key) -> None:
        figures = result(key)
        out[str(key)] = figures
        done.append(key)
        if "failed" in figures:
            print(f"llm_decode: {key} failed: {figures['failed']}", file=sys.stderr, flush=True)
        if args.progress:  # a run stopped part way still leaves each finished key's figures
            print(json.dumps({"key": str(key), "done": len(done), "of": len(runnable),
                              **figures, "bench_wall_s": round(time.perf_counter() - started, 1)}),
                  file=sys.stderr, flush=True)

    stopped: Stopped | None = None
    signal.signal(signal.SIGTERM, _stop_on)
    signal.signal(signal.SIGINT, _stop_on)
    try:
        if jobs > 1:
            grid.run_parallel(runnable, jobs, args.quantize, finished)
        else:
            for key in runnable:
                finished(key)
    except Stopped as stop:  # the keys finished so far are printed, the others say why they are not
        stopped = stop
        print(f"llm_decode: stopped by {stop}: {len(done)} of {len(runnable)} keys finished",
              file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for key in keys:  # the grid's order, whatever order the keys finished in
        big = next((p for p in programs_of(key) if p in skipped), None)
        if big:
            out[str(key)] = {"skipped": f"{describe(big)}: {skipped[big]}"}
        elif key in done:
            out[str(key)] = out.pop(str(key))
        else:
            out[str(key)] = {"stopped": f"the run was stopped by {stopped} before its programs were made"}
    out["calibration"] = calibration_errors(out)
    out["programs_simulated"] = len(grid.cache)
    out["keys_failed"] = sum("failed" in out[str(key)] for key in keys)
    out["keys_skipped"] = sum("skipped" in out[str(key)] for key in keys)
    if stopped is not None:
        out["stopped"] = str(stopped)
        out["keys_stopped"] = sum("stopped" in out[str(key)] for key in keys)
    out["compile_wall_s"] = round(sum(t.compile_s for t in grid.cache.values()), 1)
    out["jobs"] = jobs
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    out["bench_cpu_s"] = round(time.process_time() - started_cpu + _children_cpu_s() - children, 1)
    # what the grid compiled (one rank program each), and per CPU second of the whole run:
    # bench/core.py's compile_cpu_instructions_per_s over every program, sharding and timing included
    out["instructions_compiled"] = sum(t.instructions for t in grid.cache.values())
    out["grid_instructions_per_cpu_s"] = round(out["instructions_compiled"] / max(out["bench_cpu_s"], 1e-9))
    print(json.dumps(out), flush=True)
    if stopped is not None:
        sys.exit(128 + stopped.signum)  # the shell's code for a process a signal ended
    if out["keys_failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
