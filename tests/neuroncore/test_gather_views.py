"""Gathers (index_select, embedding) whose table is a view of a stored tensor: a transposed, strided
or sliced tensor. The elements picked equal PyTorch's; the transfer is costed through the view's
access pattern (a strided row is many short descriptors, not one contiguous run)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc

torch = pytest.importorskip("torch")

VIEWS = {
    "transposed": lambda x, w: x.t(),
    "strided columns": lambda x, w: x[:, ::2],
    "row slice": lambda x, w: x[2:20],
    "column slice": lambda x, w: x[:, 3:11],
    "transposed weight": lambda x, w: w.t(),
    "strided weight": lambda x, w: w[:, 1::2],
}


class _Pick(torch.nn.Module):
    def __init__(self, view: str, embedding: bool) -> None:
        super().__init__()
        self.view, self.embedding = view, embedding
        self.w = torch.nn.Parameter(torch.randn(24, 16))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        table = VIEWS[self.view](x, self.w)
        if self.embedding:
            return torch.nn.functional.embedding(idx, table)
        return torch.index_select(table, 0, idx)


@pytest.mark.parametrize("embedding", [False, True], ids=["index_select", "embedding"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_gather_over_a_view_equals_pytorch(view: str, embedding: bool):
    torch.manual_seed(0)
    model = _Pick(view, embedding)
    x = torch.randn(24, 16)
    idx = torch.tensor([0, 3, 5, 7, 2, 1, 0, 6, 15, 11])
    traced = nc.trace(model, (x, idx))
    out = np.asarray(traced(x, idx))
    np.testing.assert_array_equal(out, model(x, idx).detach().numpy())


def _gather_node_cost(table_of) -> tuple[float, int, float]:
    """(DMA engine time, engines, GpSimd descriptor-generation time) of the one gather transfer."""
    g = nc.GraphBuilder()
    w = g.weight("table", (64, 512), "fp32")
    idx = g.parameter("idx", (128,), "int32", low=0, high=64)
    graph = g.build([g.gather(table_of(g, w), idx)])
    program = nc.compile(graph, "trn1")
    opcodes = [program.opcodes[k] for k in program.opcode_id]
    dma = [i for i, o in enumerate(opcodes) if o == "DMA_DIRECT2D" and "gather hbm:" in program.operands[i]]
    trig = [i for i, o in enumerate(opcodes) if o == "DMA_DESCRIPTOR_GEN"]
    assert len(dma) == 1 and len(trig) == 1
    return float(program.cost_ns[dma[0]]), int(program.dma_engines[dma[0]]), float(program.cost_ns[trig[0]])


def test_a_strided_table_is_gathered_element_by_element():
    rows, _, trig_rows = _gather_node_cost(lambda g, w: g.slice(w, (0, 0), (64, 512), (1, 2)))
    contiguous, _, trig_contiguous = _gather_node_cost(lambda g, w: g.slice(w, (0, 0), (64, 256)))
    # 256 one-element descriptors per picked row instead of one 1 KiB run: the per-descriptor
    # overhead dominates, and GpSimd writes 256x the descriptors
    assert rows > 10 * contiguous
    assert trig_rows > 10 * trig_contiguous


def test_a_contiguous_view_costs_as_a_stored_table():
    sliced = _gather_node_cost(lambda g, w: g.slice(w, (0, 0), (64, 256)))
    stored = _gather_node_cost(lambda g, w: g.weight("narrow", (64, 256), "fp32"))
    assert sliced == stored
