"""XLA gathers and scatter-adds beyond the row lookup (``neuroncore.frontends.jax_indexing``):
``take_along_axis`` on any axis, ``take`` of a column, out-of-range starts clamped as XLA clamps
them, ``.at[].add`` of rows and of elements, against JAX; a scatter that is not an add stays one
unsupported op in ``check()``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import neuroncore as nc  # noqa: E402

RNG = np.random.default_rng(3)


def indexing(x, idx, rows, cols):
    return (
        jnp.take_along_axis(x, idx, axis=-1),  # batching dims (2 of them)
        jnp.take_along_axis(x, jnp.minimum(idx[:2, :, :1], 2), axis=0),
        x.take(3, axis=2), x[:, :, 1], jnp.take(x, rows, axis=1, mode="clip"),
        jnp.zeros((5, 6)).at[rows].add(x[0, :4, :6] * 2.0),  # rows of a table (embedding grads)
        jnp.zeros((3, 6)).at[:, cols[0]].add(x[:, 0, :2]),  # columns; a repeated index adds up
    )


def test_gathers_and_scatter_adds_match_jax() -> None:
    x = jnp.asarray(RNG.standard_normal((3, 4, 6)).astype(np.float32))
    idx = jnp.asarray(RNG.integers(0, 6, (3, 4, 2)).astype(np.int32))
    rows = jnp.asarray(np.array([4, 0, 4, 9], np.int32))  # 9: clipped (take) / dropped (scatter)
    cols = jnp.asarray(np.array([[1, 1], [0, 5], [2, 3]], np.int32))  # [1, 1]: twice
    model = nc.trace(indexing, (x, idx, rows, cols))
    got, want = model(x, idx, rows, cols), indexing(x, idx, rows, cols)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, k
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=f"output {k}")


def overwrite(x, rows):
    return jnp.zeros((5, 6)).at[rows].set(x)  # marker: set


def test_a_scatter_that_overwrites_is_reported_unsupported() -> None:
    ops = nc.check(overwrite, (jnp.ones((4, 6)), jnp.asarray(np.array([0, 1, 2, 3], np.int32))))
    assert [op.opcode for op in ops] == ["scatter(not an add)"]
