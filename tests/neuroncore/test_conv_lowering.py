"""The implicit-GEMM convolution and pooling lowering (neuroncore/compiler/lower_conv.py) and the
channel-major pass (neuroncore/compiler/channel_major.py): what the compiled programs contain."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import neuroncore as nc  # noqa: E402
from neuroncore.compiler.lower_conv import bands, output_blocks  # noqa: E402
from neuroncore.ir.conv import (  # noqa: E402
    ConvChannels,
    WindowGeometry,
    from_blocks,
    to_blocks,
)


def _traced(module, x, **kw):
    module.eval()
    traced = nc.trace(module, (x,), **kw)
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(traced(x), want, rtol=2e-4, atol=5e-5)
    return traced


def _opcodes(program, name):
    return [i for i, o in enumerate(program.opcodes) if o == name]


def _nodes(program, opcode):
    code = program.opcodes.index(opcode) if opcode in program.opcodes else -1
    return np.flatnonzero(program.opcode_id == code)


def test_kernel_offsets_are_access_patterns_not_dma_transfers():
    torch.manual_seed(0)
    traced = _traced(nn.Conv2d(64, 64, 3, padding=1, bias=False), torch.randn(1, 64, 24, 24))
    program = traced.program
    # the input is read once (one transfer), the weights once, the output stored once: no
    # transfer per kernel offset as im2col through HBM needed
    assert program.n_dma_transfers <= 4
    matmuls = _nodes(program, "MATMUL")
    # 576 output positions = 2 PSUM banks (whole rows of 24: 21 + 3 rows), 9 offsets each, two
    # passes each in FP32
    assert len(matmuls) == 2 * 9 * 2
    operands = [program.operands[i] for i in matmuls]
    assert all("[1,24]" in text or "[24," in text for text in operands)  # row pattern over the tile
    # one LoadStationary per offset serves both banks
    assert len(_nodes(program, "LDWEIGHTS")) == 9


def test_stride_two_reads_every_other_element():
    torch.manual_seed(0)
    traced = _traced(nn.Conv2d(8, 16, 1, stride=2, bias=False), torch.randn(1, 8, 10, 10))
    matmul = _nodes(traced.program, "MATMUL")[0]
    assert "[20,5],[2,5]" in traced.program.operands[matmul]  # rows 2 apart, columns 2 apart


def test_batch_norm_and_relu_between_convolutions_stay_channel_major():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 8, 3, padding=1))
    traced = _traced(net, torch.randn(2, 8, 12, 12))
    graph = traced.program.graph
    elementwise = [op for op in graph.ops if op.opcode in ("multiply", "add", "maximum")
                   and len(op.shape) > 1]
    assert elementwise and all(op.shape in ((2, 16, 144), (2, 8, 144)) for op in elementwise)
    # the 4-D reshapes between the convolutions are gone
    assert [op.opcode for op in graph.ops].count("reshape") <= 2


def test_large_image_is_read_in_bands():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 130, 130)
    traced = _traced(nn.Conv2d(2, 4, 3, padding=1), x)
    geo = WindowGeometry((130, 130), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1))
    assert len(bands(geo, 12288)) > 1  # fp32: a quarter of SBUF holds ~93 padded rows
    assert len(_nodes(traced.program, "MEMSET")) > 1  # one zeroed band buffer per band
    _traced(nn.MaxPool2d(3, stride=2, padding=1), x)


def test_pooling_is_one_vector_op_per_window_offset():
    torch.manual_seed(0)
    traced = _traced(nn.MaxPool2d(3, stride=2, padding=1), torch.randn(1, 64, 16, 16))
    program = traced.program
    assert len(_nodes(program, "TENSOR_TENSOR")) == 8  # 9 offsets: one copy, 8 maxima
    assert program.n_dma_transfers <= 3


def test_weight_blocks_round_trip():
    rng = np.random.default_rng(0)
    for groups, c, o in ((1, 200, 136), (2, 160, 96), (192, 192, 192), (4, 8, 12)):
        from neuroncore.ir.conv import choose_group_block
        ch = ConvChannels(c, o, groups, choose_group_block(groups, c // groups, o // groups))
        w = rng.standard_normal((o, c // groups, 3, 2)).astype(np.float32)
        np.testing.assert_array_equal(from_blocks(to_blocks(w, ch), ch, (3, 2)), w)


def test_output_blocks_fill_banks_with_whole_rows():
    blocks = output_blocks((56, 56))
    assert [b.count for b in blocks[:2]] == [504, 504]  # 9 rows of 56
    assert sum(b.count for b in blocks) == 56 * 56
    wide = output_blocks((2, 700))  # a row wider than a bank is cut along it
    assert sum(b.count for b in wide) == 1400 and max(b.count for b in wide) <= 512


def test_batch_norm_and_relu_are_applied_in_the_evacuation():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    traced = _traced(net, torch.randn(1, 8, 12, 12))
    program = traced.program
    lowered = {program.graph.ops[i].opcode for i in program.op_index if i >= 0}
    assert not lowered & {"multiply", "add", "maximum"}  # no pass over the activation of its own
    evacuations = [program.operands[i] for i in _nodes(program, "ACTIVATE")]
    evacuations += [program.operands[i] for i in _nodes(program, "TENSOR_SCALAR")]
    # each bank: func(psum * scale + bias) with per-partition scale and bias, on Scalar or Vector
    assert [t for t in evacuations if "psum" in t] and all(
        ("scale=" in t or "operand0=" in t) for t in evacuations if "psum" in t)
    assert "Relu" in set(program.activation_fn)


class _Residual(nn.Module):
    """relu(bn(conv(x)) + x): a ResNet block's shortcut add before its ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


def test_a_residual_add_is_applied_in_the_evacuation(run):
    """The shortcut is added to each PSUM bank after the scale and bias (Vector reads PSUM) and
    before the ReLU: no pass of its own over the activation, results bit-identical to the
    unfused add (the same FP32 roundings in the same order)."""
    torch.manual_seed(1)
    net = _Residual()
    net.bn.running_mean.uniform_(-1, 1)
    net.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 16, 10, 10)
    traced = _traced(net, x)
    program = traced.program
    adds = [op.index for op in program.graph.ops if op.opcode == "add" and op.shape == (2, 16, 100)]
    assert adds and not set(adds) & {int(i) for i in program.op_index}, "the add ran as its own pass"
    shortcut = [t for i, t in enumerate(program.operands) if program.opcodes[program.opcode_id[i]]
                == "TENSOR_TENSOR" and "op=add" in t]
    assert shortcut, "the evacuation adds the shortcut"
    graph = program.graph
    inputs = [x.numpy()]
    fused = run(graph, inputs)
    # the same graph with the sum also an output: the add keeps its own pass
    unfused = run(nc.Graph(graph.name, graph.ops, graph.parameters,
                           [*graph.outputs, graph.ops[adds[0]]]), inputs)
    assert set(adds) & {int(i) for i in unfused.program.op_index}
    np.testing.assert_array_equal(fused.outputs[0], unfused.outputs[0])


def test_hbm_scratch_is_reused_once_its_last_reader_ran():
    b = nc.GraphBuilder("chain")
    # 128 KiB per partition: over half of SBUF, so no live set keeps a value on chip
    # (compiler.residency) and each lives in HBM
    x = b.parameter("x", (128, 32768))
    values = [x]
    for _ in range(4):
        # a reshape view between the tanhs keeps them out of one fusion group (which would keep
        # the chain in SBUF tile by tile): each tanh's value is stored to HBM scratch
        y = b.tanh(values[-1])
        values.append(b.reshape(b.reshape(y, (128, 128, 256)), (128, 32768)))
    program = nc.compile(b.build([values[-1]]), "trn1")
    scratch = [t for t in program.hbm_tensors.values() if t.kind == "scratch"]
    assert len(scratch) == 4
    # at most two intermediates are live at once (one read while the next is written)
    assert program.hbm_bytes_by_kind()["scratch"] == 2 * scratch[0].nbytes
    x_in = np.random.default_rng(0).standard_normal((128, 32768)).astype(np.float32)
    out = nc.Instance("trn1.2xlarge").core(0).load(program).execute([x_in]).outputs[0]
    np.testing.assert_allclose(out, np.tanh(np.tanh(np.tanh(np.tanh(x_in)))), rtol=1e-5, atol=1e-6)
