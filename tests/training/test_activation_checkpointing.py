"""Activation checkpointing in a traced training step: ``gradient_checkpointing_enable()`` on a
transformers model, or ``torch.utils.checkpoint.checkpoint`` around blocks. The backward recomputes
each checkpointed region's values before reading them, so the step keeps less (memory check and
program HBM) and takes longer (the recompute), and it still trains as PyTorch does."""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

import neuroncore
from neuroncore.training.torch_joint import RECOMPUTE_OF, CheckpointingIgnored
from tests.fixtures.labelled import Labelled

transformers = pytest.importorskip("transformers")


def _llama(checkpointing: bool, layers: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return Labelled(model, use_cache=False)


def _train(model: torch.nn.Module, ids: torch.Tensor, steps: int, precision: str = "fp32"
           ) -> tuple[Any, list[float], list[float]]:
    """(the step, its losses, PyTorch's FP32 losses); the model ends with the step's parameters."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointingIgnored)  # said of nothing any more
        step = neuroncore.trace_train_step(model, opt, (ids, ids), precision=precision)
    losses, expected = [], []
    for _ in range(steps):
        losses.append(float(step(ids, ids)))
        loss = ref(ids, ids)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        expected.append(float(loss))
    model.reference = ref  # type: ignore[assignment]
    return step, losses, expected


def test_gradient_checkpointing_recomputes_in_the_backward_and_trains_as_pytorch() -> None:
    """Before: torch.export traced through the checkpoints, every activation was kept, nothing was
    recomputed and the trace warned CheckpointingIgnored."""
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    plain = _llama(checkpointing=False)
    base, _, _ = _train(plain, ids, steps=1)
    model = _llama(checkpointing=True)
    step, losses, expected = _train(model, ids, steps=3)
    assert losses == pytest.approx(expected, rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), model.reference.parameters()):  # type: ignore[union-attr]
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
    # each decoder layer's values are recomputed in the backward, under model/backward/recompute
    recomputed = {op.layer.split("/layers.")[1].split("/")[0] for op in step.graph.ops
                  if op.layer.startswith("model/backward/recompute/") and "/layers." in op.layer}
    assert recomputed == {"0", "1", "2"}
    assert not any("recompute" in op.layer for op in base.graph.ops)
    # kept: each layer's input and the rest of the model, plus one layer's working set
    assert step.memory.activations < 0.6 * base.memory.activations
    scratch = [s.program.hbm_bytes_by_kind()["scratch"] for s in (step, base)]
    assert scratch[0] < scratch[1]  # the program's device memory holds less at its peak
    # and the step takes longer: the recompute runs on the device
    assert step.last_results[0].device_time_ns > 1.05 * base.last_results[0].device_time_ns


def test_gradient_checkpointing_in_bf16() -> None:
    """bf16 auto-cast: the recompute computes the same values, so the checkpointed step equals the
    plain one exactly, and both are within bf16 error of FP32 PyTorch."""
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    plain, checkpointed = _llama(checkpointing=False), _llama(checkpointing=True)
    _, base_losses, _ = _train(plain, ids, steps=3, precision="bf16")
    step, losses, expected = _train(checkpointed, ids, steps=3, precision="bf16")
    assert any(RECOMPUTE_OF in n.meta for n in step.joint.module.graph.nodes)
    assert losses == base_losses
    for p, q in zip(checkpointed.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert losses == pytest.approx(expected, rel=2e-2)  # bf16 has 8 bits of mantissa


class _Block(torch.nn.Module):
    def __init__(self, reentrant: bool | None, dropout: float = 0.0) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.drop = torch.nn.Dropout(dropout)
        self.reentrant = reentrant

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(F.gelu(self.up(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reentrant is None:
            return self.body(x)
        return checkpoint.checkpoint(self.body, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("first", ["linear", "input"])
def test_torch_utils_checkpoint_around_blocks(reentrant: bool, first: str) -> None:
    """Both checkpoint implementations. A reentrant checkpoint whose input needs no gradient gives
    its parameters none in eager PyTorch (nothing to recompute), and here; its autograd.Function
    could not be exported before ('element 0 of tensors does not require grad')."""
    torch.manual_seed(0)
    head = [torch.nn.Linear(8, 8)] if first == "linear" else []
    model = torch.nn.Sequential(*head, _Block(reentrant), _Block(reentrant), torch.nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy)
    frozen = reentrant and first == "input"  # the blocks get no gradient
    assert any(RECOMPUTE_OF in n.meta for n in step.joint.module.graph.nodes) is not frozen
    for _ in range(2):
        loss = float(step(x, y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reentrant: "None of the inputs have requires_grad=True"
            expected = F.cross_entropy(ref(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)


def test_dropout_inside_a_checkpoint_recomputes_the_same_mask() -> None:
    """The recomputed draw reads the original's stream (the checkpoint's saved RNG state in eager
    PyTorch): the checkpointed step equals the plain one with the same seed, step after step."""

    def run(reentrant: bool | None) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(_Block(reentrant, 0.3), _Block(reentrant, 0.3), torch.nn.Linear(8, 2))
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)  # the step's seed
        step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy)
        return [float(step(x, y)) for _ in range(3)], [p.detach().clone() for p in model.parameters()]

    plain, checkpointed = run(None), run(False)
    assert checkpointed[0] == plain[0]
    for p, q in zip(checkpointed[1], plain[1]):
        assert torch.equal(p, q)


def test_a_selective_policy_is_said_not_to_be_followed() -> None:
    """``context_fn`` (selective activation checkpointing) is the one form not followed: the region
    is recomputed whole, and the trace says so in one warning; numerics are PyTorch's."""

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> checkpoint.CheckpointPolicy:
        return checkpoint.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default \
            else checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

    class Selective(_Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            contexts = functools.partial(checkpoint.create_selective_checkpoint_contexts, policy)
            return checkpoint.checkpoint(self.body, x, use_reentrant=False, context_fn=contexts)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Selective(False), torch.nn.Linear(8, 2))
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(CheckpointingIgnored, match="1 checkpointed call.* selective policy"):
        step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy)
    assert any(RECOMPUTE_OF in n.meta for n in step.joint.module.graph.nodes)


def test_offloading_to_the_host_is_said_not_to_be_modelled() -> None:
    """``activation_checkpointing_enable(offload=True)`` (``save_on_cpu`` around each checkpoint):
    the step checkpoints, but the kept activations stay in HBM; one warning says so."""
    model = _llama(checkpointing=False, layers=1)
    model.model.activation_checkpointing_enable(offload=True)  # type: ignore[operator]
    ids = torch.randint(0, 64, (2, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(CheckpointingIgnored, match="offloaded to host memory"):
        step = neuroncore.trace_train_step(model, opt, (ids, ids))
    assert any(RECOMPUTE_OF in n.meta for n in step.joint.module.graph.nodes)


def test_tensor_parallel_step_recomputes_too() -> None:
    """tp 2: the same recompute in each rank's program; its memory check (counted on the rank's
    IR program, ``program_saved_activations``) keeps less, and the numerics are unchanged."""
    from neuroncore.parallel.tp_train import TensorParallelTrainStep

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    runs = []
    for checkpointing in (False, True):
        model = _llama(checkpointing, layers=2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = TensorParallelTrainStep(model, opt, (ids, ids), tp=2)
        runs.append((step, [float(step(ids, ids)) for _ in range(2)]))
    (plain, plain_losses), (step, losses) = runs
    assert losses == plain_losses
    assert any(op.layer.startswith("model/backward/recompute/") for op in step.rank_program.graph.ops)
    assert step.memory.activations < 0.7 * plain.memory.activations


def test_each_checkpointed_layer_keeps_only_its_input() -> None:
    """The memory check's arithmetic, on the traced graph: two more checkpointed decoder layers
    add exactly their inputs (``s*b*h`` FP32 values each: Korthikanti et al.'s ``2sbh`` bytes in
    16 bits), against every value autograd saves (over 30x that) without checkpointing."""
    from neuroncore.training.torch_joint import joint_graph, saved_activations

    s, b, h = 32, 2, 64

    def kept(layers: int, checkpointing: bool) -> int:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=h, intermediate_size=2 * h,
                                          num_hidden_layers=layers, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(config)
        if checkpointing:
            model.gradient_checkpointing_enable()
        ids = torch.randint(0, 64, (b, s))
        return saved_activations(joint_graph(Labelled(model, use_cache=False), (ids, ids)))

    assert kept(4, True) - kept(2, True) == 2 * s * b * h * 4
    assert kept(4, False) - kept(2, False) > 30 * 2 * s * b * h * 4


def test_gpt2_with_its_default_dropout_recomputes_the_forward_it_skipped() -> None:
    """GPT-2 (dropout 0.1 in every block) checkpointed trains exactly as without checkpointing (same
    seed: every recomputed mask is the forward's), and the recompute's busy time on the device is
    about the checkpointed layers' forward time: the backward grows by it."""
    import numpy as np

    from neuroncore.training.step_records import _union_ns, phase_busy_ns

    def run(checkpointing: bool) -> tuple[list[float], dict[str, float]]:
        torch.manual_seed(0)
        config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
        if checkpointing:
            model.gradient_checkpointing_enable()
        ids = torch.randint(0, 128, (2, 32))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.manual_seed(5)  # the step's seed
        step = neuroncore.trace_train_step(Labelled(model, use_cache=False), opt, (ids, ids))
        losses = [float(step(ids, ids)) for _ in range(2)]
        result = step.last_results[0]
        layers = [step.program.graph.ops[int(i)].layer if i >= 0 else "" for i in step.program.op_index]
        busy = phase_busy_ns(result)
        for name, prefix in (("recompute", "model/backward/recompute/"),
                             ("layers", "model/forward/model/transformer/h.")):
            mask = np.array([layer.startswith(prefix) for layer in layers])
            busy[name] = _union_ns(result.timeline.start_ns[mask], result.timeline.end_ns[mask])
        return losses, busy

    (plain, base), (losses, busy) = run(False), run(True)
    assert losses == plain
    assert 0.7 * base["layers"] < busy["recompute"] < 1.3 * base["layers"]
    assert busy["backward"] > base["backward"] + 0.7 * busy["recompute"]
