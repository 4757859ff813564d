"""``shard(..., input_splits=)`` splitting a training program's weights from the start (not only its
gradient buffers): the compiled rank programs give the unsplit program's gradients.

The defect: the sharding pass's helper ops are named ``<opcode>.<n>`` by its builder's counter and
could take a name copied from the full graph (``compare.257``); the compiler keys a value's HBM
tensor by its op's name, so two such values shared one buffer and the gradients came out wrong
(a Llama accumulate program with its weights split from the start)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import torch

from neuroncore.compiler import compile as compile_graph
from neuroncore.ir.reference import bind_inputs, run_reference
from neuroncore.parallel.group import _Rendezvous
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.sharding import shard
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.training.torch_step import ProgramKind

transformers = pytest.importorskip("transformers")

TP = 2


@pytest.fixture(scope="module")
def accumulate() -> dict[str, Any]:
    """A one-layer Llama's accumulate program (forward + backward + gradient buffers), its inputs
    and how the update program splits every resident tensor."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=32, use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    micro = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), micro, tp=TP,
                                   accumulation_steps=2)
    graph, layout = step.graphs[ProgramKind.ACCUMULATE]
    ids = np.random.default_rng(0).integers(0, 64, (2, 8))
    feeds = {**step._initial_state(), "input/0": ids, "input/1": ids, **step.rng_state(layout.inputs)}
    splits = step.rank_programs[ProgramKind.UPDATE].input_split
    return {"step": step, "graph": graph, "layout": layout, "inputs": [feeds[n] for n in layout.inputs],
            "splits": splits, "trained": frozenset(f"param/{n}" for n in step.param_names)}


def test_weights_split_from_the_start_give_the_unsplit_gradients(accumulate: dict[str, Any]) -> None:
    graph, inputs, step = accumulate["graph"], accumulate["inputs"], accumulate["step"]
    fixed = {k: v for k, v in accumulate["splits"].items()
             if v is not None and k.startswith(("param/", "grad/"))}
    assert any(k.startswith("param/") for k in fixed)
    sharded = shard(graph, TP, trained=accumulate["trained"], input_splits=fixed)
    by_name = dict(zip(accumulate["layout"].inputs, sharded.input_splits))
    assert all(by_name[k] == v for k, v in fixed.items())  # split as asked, from the start
    program = compile_graph(sharded.local, step.core.spec)
    models = [step.instance.core(r).load(program, rank=r) for r in range(TP)]
    rendezvous = _Rendezvous(TP)
    produced: list[list[np.ndarray]] = [[] for _ in range(TP)]

    def run(r: int) -> None:
        arrays = bind_inputs(program.graph, sharded.rank_arrays(inputs, r))
        produced[r] = models[r].compute(arrays, rendezvous.for_rank(r))

    run_ranks(TP, run, rendezvous.barrier, "input-splits")
    expected = run_reference(graph, inputs)
    for name, ours, ref in zip(accumulate["layout"].outputs, sharded.gather_outputs(produced), expected):
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5, err_msg=name)
    names = collections.Counter(op.name for op in sharded.local.ops)
    assert not [n for n, k in names.items() if k > 1]  # one name per value: one HBM tensor each
