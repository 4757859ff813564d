"""The Scalar engine's activation derivatives (``gelu_dx``, ``silu_dx``; nki.language.gelu_dx /
silu_dx on Trn1): one ACTIVATE per tile that equals PyTorch's autograd of GELU / SiLU, which is how
the training workloads time a GELU or SwiGLU MLP's backward."""

from __future__ import annotations

import numpy as np
import torch

import neuroncore as nc
from neuroncore.compiler import compile as compile_graph


def _graph(fn: str) -> nc.Graph:
    g = nc.GraphBuilder()
    x = g.parameter("x", (256, 96))
    return g.build([getattr(g, fn)(x)])


def test_derivatives_equal_torch_autograd(run, assert_close) -> None:
    x = np.random.default_rng(0).standard_normal((256, 96)).astype(np.float32) * 3
    t = torch.tensor(x, requires_grad=True)
    for fn, torch_fn in (("gelu_dx", torch.nn.functional.gelu), ("silu_dx", torch.nn.functional.silu)):
        (grad,) = torch.autograd.grad(torch_fn(t).sum(), t)
        result = run(_graph(fn), [x])
        assert_close(result.out, result.ref)
        np.testing.assert_allclose(result.ref, grad.numpy(), rtol=1e-5, atol=1e-5)


def test_a_derivative_is_one_scalar_engine_pass() -> None:
    program = compile_graph(_graph("silu_dx"), "trn1")
    acts = [program.operands[i] for i in range(program.n_nodes)
            if program.opcodes[program.opcode_id[i]] == "ACTIVATE"]
    assert acts and all("func=Silu_dx" in text for text in acts)
    assert not [i for i in range(program.n_nodes)
                if program.opcodes[program.opcode_id[i]].startswith("TENSOR_")]
