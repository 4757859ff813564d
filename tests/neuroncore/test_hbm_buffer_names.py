"""HBM tensors and views are keyed by names made from op names: two distinct computed values of one
name must not silently share a buffer (an earlier sharding pass produced such graphs and trained on
wrong gradients). Weights stored under one label share their buffer on purpose."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.errors import CompileError
from neuroncore.compiler.lowering_state import HbmTensorKind


def _two_values_named_alike() -> nc.Graph:
    """exp(x) and tanh(x), both too large to stay on chip (128 KiB per partition each: over half of
    SBUF alone, so no live set keeps them), given one name; both read after a full reduction of the
    second, so each is re-read from HBM."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (128, 32768), "fp32")
    a = g.exp(x)
    b = g.add_op("tanh", [x], x.shape, "fp32", name=a.name)
    total = g.reduce(g.reduce(b, [1]), [0])
    c = g.add(g.add(a, b), g.broadcast(total, a.shape, []))
    return g.build([g.reduce(c, [1])])


def test_two_computed_values_of_one_name_are_refused_naming_both():
    with pytest.raises(CompileError) as info:
        nc.compile(_two_values_named_alike(), "trn1")
    message = str(info.value)
    assert "\n" not in message
    assert "share the HBM buffer 'exponential.2'" in message
    assert "(exponential)" in message and "(tanh)" in message  # both nodes named


def test_two_views_of_one_name_are_refused():
    g = nc.GraphBuilder()
    x = g.parameter("x", (8, 16), "fp32")
    y = g.parameter("y", (8, 16), "fp32")
    a = g.concatenate([x, y], 0)
    b = g.add_op("concatenate", [y, x], (16, 16), "fp32", name=a.name, dimension=0)
    graph = g.build([g.add(g.exp(a), g.exp(b))])
    with pytest.raises(CompileError, match=r"share the HBM buffer 'concatenate\.\d+\.view'"):
        nc.compile(graph, "trn1")


def test_weights_of_one_label_share_their_buffer(run, assert_close):
    g = nc.GraphBuilder()
    x = g.parameter("x", (128, 64), "fp32")
    w = g.weight("w", (64, 64), "fp32")
    w_again = g.add_op("constant", [], w.shape, "fp32", init=w.attrs["init"], label=w.attrs["label"])
    graph = g.build([g.add(g.dot(x, w), g.dot(x, w_again))])
    inputs = [np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)]
    result = run(graph, inputs)
    weights = [t for t in result.program.hbm_tensors.values() if t.kind is HbmTensorKind.WEIGHT]
    assert [t.name for t in weights] == ["weight.model/w"]
    assert_close(result.out, result.ref)


def test_weights_of_one_label_in_other_shapes_get_buffers_of_their_own(run, assert_close):
    """Two constants of one label whose shapes differ cannot be one tensor: the second read the
    first's buffer (a bilinear resize's [12, 4] matrix read the first 48 values of another resize's
    [12, 6]: silently wrong; a [32] norm weight read as [120]: an error in the runtime). Each gets
    a buffer of its own; same-shaped ones still share theirs (above)."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (128, 64), "fp32")
    wide = g.weight("w", (64, 48), "fp32")
    narrow = g.weight("w", (64, 32), "fp32")  # the same label: model/w
    assert wide.attrs["label"] == narrow.attrs["label"]
    graph = g.build([g.dot(x, wide), g.dot(x, narrow)])
    inputs = [np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)]
    result = run(graph, inputs)
    weights = sorted(t.name for t in result.program.hbm_tensors.values() if t.kind is HbmTensorKind.WEIGHT)
    assert len(weights) == 2 and weights[0] == "weight.model/w"
    assert_close(result.out, result.ref)
