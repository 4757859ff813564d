"""Execution-core benchmark: prints one JSON line of figures (medians of repeated runs).

    python bench/core.py            # full: timing-only Llama-2-7B (32 layers) decode step
    python bench/core.py --quick    # 4 layers, fewer repeats (a smoke run)

Figures:
* ``sim_instructions_per_s``: instructions simulated per wall second, timing-only llama-decode
  at Llama-2-7B dims, one core (execute() without listeners). Target >= 1,000,000.
* ``sink_overhead_ratio``: execute() time with a no-op event listener / without. Target <= 1.10.
* ``matmul_4096x8192x8192_bf16_ms`` on one trn1 core and its error against the public 6.97 ms
  (calibration point 1 of neuroncore.md §9.1). Target: within 15 %.
* ``compile_instructions_per_s``: instructions (engine instructions, not DMA transfers) compiled per
  wall second for the whole Llama-2-7B decode graph (32 layers, in --quick too; median of 3 compiles,
  1 with --quick), ``compile_cpu_instructions_per_s`` the same per CPU second (steadier on a loaded
  machine), ``compile_layers_relocated`` how many layers were relocated rather than lowered
  (``compiler.layer_replay``); ``*_llama2_70b_tp32`` the same for one rank of the 80-layer 70B at
  tp 32. Target >= 200,000 (issue 15 §5; see docs/execution-core.md "Compile speed").
* ``shard_llama2_70b_tp32_s``: the tensor-parallel sharding pass on the full Llama-2-70B decode graph
  (80 layers, tp 32, batch 8): a pass that finds misplaced inputs now collects them all, so the graph
  settles in 2 passes instead of one pass per layer's KV-cache input (81).
* ``hbm_bound_efficiency``: decode-shaped matvec (batch 1, 4096 x 11008 bf16): simulated time over
  weight bytes / the core's HBM bandwidth share (410 GB/s), with the parts the model attributes it to.
* ``dtype_*`` (issue 15 §2): the 4096x8192x8192 matmul on one Trainium2 core (NC-v3) in bf16 and fp8
  (e4m3, double-row: 2x the bf16 PE rate, neuroncore.md §3.1) and their ratio, the same fp8 matmul
  on Trainium1 (cFP8 at the bf16 rate), and the decode matvec above with int8 weight-only
  quantisation (half the weight bytes) against bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from neuronscope import settings

# the core's own speed: no live-state publisher attached (it would make the core build records)
os.environ.setdefault(settings.LIVE.name, "0")

import neuroncore as nc
from neuroncore import workloads
from neuroncore.compiler import CompilerOptions, Quantization
from neuroncore.hardware import NC_V2
from neuroncore.runtime.timing_summary import summarize

PUBLISHED_MATMUL_MS = 6.97


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def bench_simulation(layers: int, repeats: int) -> dict:
    graph = workloads.get("llama-decode").graph("llama2-7b", layers=layers)
    t = time.perf_counter()
    program = nc.compile(graph, "trn1")
    compile_s = time.perf_counter() - t
    quiet = nc.Instance("trn1.2xlarge", sink=nc.EventSink())
    model = quiet.core(0).load(program)
    model.execute(timing_only=True)  # JIT warm-up
    base = timed(lambda: model.execute(timing_only=True), repeats)

    observed_sink = nc.EventSink()
    received = [0]

    def noop(batch: nc.EventBatch) -> None:
        received[0] += 1

    observed_sink.subscribe(noop)
    observed = nc.Instance("trn1.2xlarge", sink=observed_sink).core(0).load(program)
    observed.execute(timing_only=True)
    # interleave to share the machine's noise between the two measurements
    with_sink, without = [], []
    for _ in range(repeats):
        with_sink += timed(lambda: observed.execute(timing_only=True), 1)
        without += timed(lambda: model.execute(timing_only=True), 1)
    result = model.execute(timing_only=True)
    n = program.n_instructions
    median = statistics.median(base + without)
    return {
        "sim_model": f"llama2-7b decode, {layers} layers, batch 1, context 2048, trn1 core",
        "sim_instructions": n,
        "sim_dma_transfers": program.n_dma_transfers,
        "sim_compile_s": round(compile_s, 2),
        "sim_execute_s_median": round(median, 4),
        "sim_instructions_per_s": round(n / median),
        "sink_overhead_ratio": round(statistics.median(with_sink) / statistics.median(without), 3),
        "sink_batches_per_execution": received[0] // (repeats + 1),
        "llama2_7b_decode_device_ms": round(result.device_time_ns / 1e6, 3),
    }


def bench_compile(repeats: int) -> dict:
    """Compile speed on the whole Llama-2-7B decode graph (32 layers, both modes: the --quick
    simulation graph has too few layers for a run of repeated layers) and on one rank of the
    80-layer Llama-2-70B at tp 32. Wall and CPU seconds: on a loaded machine the CPU figure is the
    steadier one."""
    from neuroncore.parallel.sharding import shard

    graphs = {
        "": workloads.get("llama-decode").graph("llama2-7b"),
        "_llama2_70b_tp32": shard(workloads.get("llama-decode").graph("llama2-70b", context=255,
                                                                      tp_degree=32), 32).local,
    }
    figures: dict = {}
    for suffix, graph in graphs.items():
        walls, cpus = [], []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            program = nc.compile(graph, "trn1")
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        n = program.n_instructions
        figures[f"compile_instructions{suffix}"] = n
        figures[f"compile_instructions_per_s{suffix}"] = round(n / statistics.median(walls))
        figures[f"compile_cpu_instructions_per_s{suffix}"] = round(n / statistics.median(cpus))
        figures[f"compile_layers_relocated{suffix}"] = program.stats.get("layers_relocated", 0)
    return figures


def bench_sharding() -> dict:
    from neuroncore.parallel.sharding import shard

    graph = workloads.get("llama-decode").graph("llama2-70b", batch=8, tp_degree=32)
    t = time.perf_counter()
    shard(graph, 32)
    return {"shard_llama2_70b_tp32_s": round(time.perf_counter() - t, 2)}


def bench_matmul() -> dict:
    graph = workloads.get("matmul").graph("nki-tutorial")
    program = nc.compile(graph, "trn1")
    result = nc.Instance("trn1.32xlarge", sink=nc.EventSink()).core(0).load(program).execute(
        timing_only=True)
    ms = result.device_time_ns / 1e6
    flops = 2 * 4096 * 8192 * 8192
    summary = summarize(result)
    return {
        "matmul_4096x8192x8192_bf16_ms": round(ms, 3),
        "matmul_error_vs_6_97_ms": round(ms / PUBLISHED_MATMUL_MS - 1.0, 4),
        "matmul_hfu": round(flops / (ms * 1e-3) / NC_V2.pe_peak_bf16_flops_per_s, 4),
        "matmul_hbm_gb": round(summary.hbm_bytes / 1e9, 3),
        "matmul_plan_mb_nb_kb": list(next(iter(program.stats["dot_plans"].values()))),
    }


def bench_hbm_bound() -> dict:
    # the 4096x11008 operand is a weight in a decode step: make it one
    b = nc.GraphBuilder("matvec")
    x = b.parameter("x", (1, 4096), "bf16")
    with b.scope("mlp/gate_proj"):
        y = b.matmul(x, b.weight("weight", (4096, 11008), "bf16"))
    graph = b.build([y])
    program = nc.compile(graph, "trn1")
    result = nc.Instance("trn1.2xlarge", sink=nc.EventSink()).core(0).load(program).execute(
        timing_only=True)
    weight_bytes = 4096 * 11008 * 2
    bound_ns = weight_bytes / NC_V2.hbm_bytes_per_s * 1e9
    dma_bound_ns = weight_bytes / NC_V2.dma_bytes_per_s * 1e9
    return {
        "hbm_bound_efficiency": round(result.device_time_ns / bound_ns, 3),
        "matvec_us": round(result.device_time_ns / 1e3, 1),
        "matvec_hbm_bound_us": round(bound_ns / 1e3, 1),
        "matvec_dma_ceiling_bound_us": round(dma_bound_ns / 1e3, 1),
        "hbm_bound_explained": "ratio = (HBM share 410 GB/s / DMA ceiling 272 GB/s) x per-descriptor "
                               "overhead x 1.3 us fixed latency of the first transfer + PE drain",
    }


def _device_ms(graph: nc.Graph, target: str, instance: str,
               options: CompilerOptions | None = None) -> float:
    program = nc.compile(graph, target, options)
    result = nc.Instance(instance, sink=nc.EventSink()).core(0).load(program).execute(timing_only=True)
    return result.device_time_ns / 1e6


def bench_dtypes(quick: bool) -> dict:
    m, k, n = (1024, 2048, 2048) if quick else (4096, 8192, 8192)
    shape = f"{m}x{k}x{n}"
    matmul = workloads.get("matmul")
    bf16_v3 = _device_ms(matmul.graph(m=m, k=k, n=n, dtype="bf16"), "trn2", "trn2.48xlarge")
    fp8_v3 = _device_ms(matmul.graph(m=m, k=k, n=n, dtype="fp8_e4m3"), "trn2", "trn2.48xlarge")
    fp8_v2 = _device_ms(matmul.graph(m=m, k=k, n=n, dtype="fp8_e4m3"), "trn1", "trn1.32xlarge")
    b = nc.GraphBuilder("matvec")
    x = b.parameter("x", (1, 4096), "bf16")
    with b.scope("mlp/gate_proj"):
        y = b.matmul(x, b.weight("weight", (4096, 11008), "bf16"))
    matvec = b.build([y])
    bf16_us = _device_ms(matvec, "trn1", "trn1.2xlarge") * 1e3
    int8_us = _device_ms(matvec, "trn1", "trn1.2xlarge",
                         CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY)) * 1e3
    return {
        f"dtype_matmul_{shape}_trn2_bf16_ms": round(bf16_v3, 3),
        f"dtype_matmul_{shape}_trn2_fp8_ms": round(fp8_v3, 3),
        "dtype_trn2_fp8_speedup_vs_bf16": round(bf16_v3 / fp8_v3, 3),
        f"dtype_matmul_{shape}_trn1_fp8_ms": round(fp8_v2, 3),
        "dtype_matvec_4096x11008_int8_weight_only_us": round(int8_us, 1),
        "dtype_matvec_int8_speedup_vs_bf16": round(bf16_us / int8_us, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, 3 repeats")
    args = parser.parse_args()
    layers, repeats = (4, 3) if args.quick else (32, 7)
    figures = {"bench": "core", "machine": f"{platform.machine()} {os.cpu_count()} cpus"}
    figures.update(bench_simulation(layers, repeats))
    figures.update(bench_compile(1 if args.quick else 3))
    figures.update(bench_sharding())
    figures.update(bench_matmul())
    figures.update(bench_hbm_bound())
    figures.update(bench_dtypes(args.quick))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
