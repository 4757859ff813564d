"""Shared fixtures: a profile recorded from the execution core, and the core's own batches of it.

The core run is done once per session (bert-layer, two timing-only executions on one trn1 core) with
the recorder and a plain list both subscribed to the same sink, so tests can compare what was
written with what the core emitted.
"""

from __future__ import annotations

from typing import Any

import pytest

import neuroncore as nc
from formats.recorder import record_profile
from neuroncore import workloads
from tests.fixtures.recorded import EXECUTIONS, Dataset, Recorded


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    path = tmp_path_factory.mktemp("profiles") / "bert"
    sink = nc.EventSink()
    batches: list[Any] = []
    sink.subscribe(batches.append)
    instance = nc.Instance("trn1.2xlarge", sink=sink)
    program = nc.compile(workloads.get("bert-layer").graph(), "trn1")
    results = []
    with record_profile(path, sink, metadata={"instance_type": instance.name}):
        model = instance.core(0).load(program)
        for _ in range(EXECUTIONS):
            results.append(model.execute(timing_only=True))
    return Recorded(path, batches, program, results)


@pytest.fixture(scope="session")
def tp_dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """llama-decode (1 layer) sharded over 2 cores with collectives, recorded by the device-profile
    collector as model=<m>/core=<c>/execution=<k>/ profiles."""
    from collectors.device_profile import profile
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.runtime import Instance

    root = tmp_path_factory.mktemp("dataset") / "device"
    workload = workloads.get("llama-decode")
    graph = workload.build(**workload.options(None, tp_degree=2, layers=1))
    sink = nc.EventSink()
    instance = Instance("trn1.32xlarge", sink=sink)
    with profile(root, sink=sink):
        model = TensorParallelModel.load(graph, instance, tp_degree=2)
        result = model.execute(None, timing_only=True)
    return Dataset(root, result, [rank.program for rank in result.ranks])
