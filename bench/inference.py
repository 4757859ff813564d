"""Encoder and CNN inference on inf2.xlarge against the published tables: prints one JSON line.

    python bench/inference.py            # BERT-base, BERT-large, ResNet-50 at batch 1, 4, 8
    python bench/inference.py --quick    # the calibration configuration only (BERT-base, batch 1)
    python bench/inference.py --models resnet-50 --batches 1 8

The configurations AWS publishes for inf2.xlarge (Neuron benchmark tables, ``*_encoder.csv`` and
``*_vision_cnn.csv``): an FP32 PyTorch model with BF16 matmul auto-cast (``dtype="bf16"``), one copy
per NeuronCore (the instance's 2 cores, data parallel), BERT at sequence length 128 and ResNet-50 at
224x224. The models are transformers' own (random weights from their configs, nothing downloaded),
traced with default settings: ``BertForSequenceClassification`` with BERT-base / BERT-large dims
(2 labels) and ``ResNetForImageClassification`` (its default config is ResNet-50; 1,000 labels).
Every execution is timing only.

Per key ``"<model>/inf2.xlarge/b<B>"``:

* ``p50_ms``: the median host-observed latency of one request: the runtime's per-execution overhead,
  the input copy to the device, the execution, the output copy back
  (``neuroncore.runtime.host_io.request_latency_ns``; all executions of one program take the same
  simulated time, so the median is that latency).
* ``throughput_per_s``: samples per second of ``REQUESTS`` requests sent back to back to the two
  copies (each to the copy that is free first): ``REQUESTS x B`` over the span from the first
  execution's start to the last one's end on the device clocks, which leave the runtime's
  per-execution gap between executions; host copies overlap the other core's execution
  [assumption: asynchronous execution keeps the device busy].

Also per key: ``device_ms`` (one execution), ``compile_wall_s`` and ``sim_wall_s``.
``calibration`` is the error on the public point: BERT-base, batch 1, seq 128, p50 1.00 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from neuronscope import settings

# the core's own speed: no live-state publisher attached (it would make the core build records)
os.environ.setdefault(settings.LIVE.name, "0")

import torch
from transformers import BertConfig, BertForSequenceClassification, ResNetConfig, ResNetForImageClassification

from neuroncore.frontends.tracing import trace
from neuroncore.runtime.host_io import request_latency_ns

INSTANCE = "inf2.xlarge"
CORES = 2  # one model copy per NeuronCore
SEQ = 128
IMAGE = 224
BATCHES = (1, 4, 8)
REQUESTS = 16
CALIBRATION = {"bert-base/inf2.xlarge/b1": {"p50_ms": 1.00}}


def bert(hidden: int, layers: int, heads: int) -> Callable[[int], tuple[torch.nn.Module, dict[str, Any]]]:
    def build(batch: int) -> tuple[torch.nn.Module, dict[str, Any]]:
        config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=4 * hidden)
        model = BertForSequenceClassification(config).eval()
        ids = torch.randint(0, config.vocab_size, (batch, SEQ))
        return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return build


def resnet50(batch: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    model = ResNetForImageClassification(ResNetConfig(num_labels=1000)).eval()
    return model, {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE)}


MODELS = {"bert-base": bert(768, 12, 12), "bert-large": bert(1024, 24, 16), "resnet-50": resnet50}


def measure(name: str, batch: int) -> dict[str, float]:
    torch.manual_seed(0)
    module, inputs = MODELS[name](batch)
    t0 = time.perf_counter()
    with torch.no_grad():
        traced = trace(module, inputs, instance=INSTANCE, dtype="bf16", replicas=CORES)
    compile_s = time.perf_counter() - t0
    del module
    program = traced.program
    runner = traced.variants[0].model
    t1 = time.perf_counter()
    results = [runner.execute(timing_only=True) for _ in range(REQUESTS)]
    sim_s = time.perf_counter() - t1
    in_bytes = sum(p.nbytes for p in program.graph.parameters)
    out_bytes = sum(o.nbytes for o in program.graph.outputs)
    latencies = [request_latency_ns(program.spec, r.device_time_ns, in_bytes, out_bytes) for r in results]
    span_ns = max(r.end_ns for r in results) - min(r.start_ns for r in results)
    return {
        "throughput_per_s": round(REQUESTS * batch / (span_ns / 1e9), 1),
        "p50_ms": round(statistics.median(latencies) / 1e6, 4),
        "device_ms": round(results[0].device_time_ns / 1e6, 4),
        "compile_wall_s": round(compile_s, 1),
        "sim_wall_s": round(sim_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="BERT-base at batch 1 only")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    args = parser.parse_args()
    configs = [("bert-base", 1)] if args.quick else [(m, b) for m in args.models for b in args.batches]
    out: dict[str, Any] = {"instance": INSTANCE, "dtype": "fp32 model, bf16 matmul auto-cast",
                           "copies": CORES}
    started = time.perf_counter()
    for name, batch in configs:
        out[f"{name}/{INSTANCE}/b{batch}"] = measure(name, batch)
    out["calibration"] = {
        key: {figure: {"published": value, "simulated": out[key][figure],
                       "error": round(out[key][figure] / value - 1.0, 4)}
              for figure, value in published.items()}
        for key, published in CALIBRATION.items() if key in out}
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
