"""XLA gathers and scatter-adds beyond the row lookup (``neuroncore.frontends.jax_indexing``):
``take_along_axis`` on any axis, ``take`` of a column, out-of-range starts clamped as XLA clamps
them, ``.at[].add`` of rows and of elements, ``.at[i, j]`` and ``.at[rows]`` with set / add / mul /
max / min, against JAX; a runtime overwrite of more than 64 updates stays one unsupported op in
``check()``."""

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


def updates(x, i, j, v, rows, vals, cols, col_vals):
    return (
        x.at[i, j].set(v), x.at[i, j].add(v), x.at[i, j].mul(v), x.at[i, j].max(v), x.at[i, j].min(v),
        x.at[rows].set(vals), x.at[rows].add(vals), x.at[rows].mul(vals), x.at[rows].max(vals),
        x.at[:, cols].set(col_vals), x.at[2, 3].set(5.0), x.at[-1].set(vals[0]),
    )


def test_at_set_add_mul_max_min_with_one_and_two_dim_indices_match_jax() -> None:
    """What jnp emits for ``x.at[i, j].op(v)`` (two indexed dims, element windows) and
    ``x.at[rows].op(vals)`` (one indexed dim, whole rows); a repeated position (set: the later
    update wins, as XLA applies them on CPU; mul/max/min: combined) and an index past the operand
    (dropped, as XLA drops it). Before: 'scatter(not an add)' for all but the adds of rows."""
    x = jnp.asarray(RNG.standard_normal((6, 8)).astype(np.float32))
    i = jnp.asarray(np.array([1, 4, 1, 9], np.int32))  # (1, 2) twice; (9, 0) outside: dropped
    j = jnp.asarray(np.array([2, 7, 2, 0], np.int32))
    v = jnp.asarray(RNG.standard_normal(4).astype(np.float32))
    rows = jnp.asarray(np.array([0, 3, 0], np.int32))
    vals = jnp.asarray(RNG.standard_normal((3, 8)).astype(np.float32))
    cols = jnp.asarray(np.array([5, 1], np.int32))
    col_vals = jnp.asarray(RNG.standard_normal((6, 2)).astype(np.float32))
    args = (x, i, j, v, rows, vals, cols, col_vals)
    assert nc.check(updates, args) == []
    got, want = nc.trace(updates, args)(*args), updates(*args)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6, err_msg=f"output {k}")


def overwrite(x, rows):
    return jnp.zeros((100, 6)).at[rows].set(x)  # marker: set


def test_a_runtime_overwrite_of_more_than_64_updates_is_reported_unsupported() -> None:
    ops = nc.check(overwrite, (jnp.ones((80, 6)), jnp.asarray(np.arange(80, dtype=np.int32))))
    assert len(ops) == 1 and ops[0].opcode.startswith("scatter(set:") and "64 updates" in ops[0].opcode


def test_argmax_and_argmin_are_the_first_index_of_the_extreme() -> None:
    """``jnp.argmax`` / ``jnp.argmin`` lower to a variadic reduce of (values, iota) whose
    comparator keeps the larger (smaller) value and, on a tie, the smaller index: it was one
    unsupported ``reduce(variadic)`` (a JAX classifier's predictions, greedy decoding)."""

    def picks(x, ties):
        return (jnp.argmax(x, -1), jnp.argmin(x, 0), jnp.argmax(x), jnp.argmax(ties, axis=1),
                jnp.argmin(ties.astype(jnp.bfloat16), -1))

    x = jnp.asarray(RNG.standard_normal((6, 9)), jnp.float32)
    ties = jnp.asarray(RNG.integers(0, 3, (2, 5, 4)), jnp.float32)  # repeated maxima and minima
    assert nc.check(picks, (x, ties)) == []
    got, want = nc.trace(picks, (x, ties))(x, ties), picks(x, ties)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_variadic_reduce_that_is_not_an_argmax_stays_unsupported() -> None:
    def sum_and_max(x):
        return jax.lax.reduce((x, x), (0.0, -jnp.inf),
                              lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])), (1,))

    missing = nc.check(sum_and_max, (jnp.ones((4, 8)),))
    assert [m.opcode for m in missing] == ["reduce(variadic)"]


def sorts(x, ids):
    p = jax.nn.softmax(x, axis=-1)
    descending = jnp.sort(p, axis=-1)[..., ::-1]  # top-p sampling's cumulative mass
    return (jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1), jnp.sort(x, axis=0, descending=True),
            jnp.argsort(x, axis=0, descending=True), jnp.median(x, axis=-1),
            jnp.cumsum(descending, axis=-1), jnp.sort(x.astype(jnp.bfloat16), axis=-1),
            jnp.argsort(ids, axis=-1), jax.lax.sort((x, ids), num_keys=1)[1], jnp.flip(x, (0, 1)))


def test_sort_argsort_and_reverse_match_jax() -> None:
    """``jnp.sort`` / ``argsort`` (HLO ``sort`` with JAX's ascending comparator; stable: ties keep
    their order) as a rank sort, and ``reverse`` (``[::-1]``, ``flip``, descending sorts) as a row
    gather: both were unsupported ops. Exact against JAX: ties, -0.0, bf16 and integer keys."""
    x = np.asarray(RNG.standard_normal((3, 9)), np.float32)
    x[0, 3] = x[0, 5]
    x[1, :4] = 0.5
    x[2, 2], x[2, 6] = -0.0, 0.0
    ids = jnp.asarray(RNG.integers(0, 4, (3, 9)).astype(np.int32))
    model = nc.trace(sorts, (jnp.asarray(x), ids))
    got, want = model(jnp.asarray(x), ids), sorts(jnp.asarray(x), ids)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=1e-6,
                                   atol=2e-7, err_msg=f"output {k}")


def multi_key_sorts(x, ids, z):
    return (jnp.lexsort((x, ids)), jnp.lexsort((z, x, ids), axis=0),  # the last key is the primary
            jax.lax.sort((x, ids, z), num_keys=2), jax.lax.sort((ids, x, z), num_keys=3),
            jax.lax.sort((x.astype(jnp.bfloat16), ids), num_keys=2, is_stable=True)[1])


def test_sorts_on_several_keys_match_jax() -> None:
    """``jnp.lexsort`` and ``lax.sort(num_keys > 1)`` (HLO ``sort`` whose comparator is JAX's
    lexicographic "less than": unsupported before) as a rank sort on every key: exact against JAX
    with ties on the first key broken by the next, ties on all keys kept in order, -0.0 equal to
    0.0, float, bf16 and integer keys, along either axis."""
    x = RNG.integers(0, 3, (3, 9)).astype(np.float32)  # few values: the later keys decide often
    x[0, 2], x[0, 4] = -0.0, 0.0
    ids = RNG.integers(0, 3, (3, 9)).astype(np.int32)
    z = RNG.standard_normal((3, 9)).astype(np.float32)
    args = (jnp.asarray(x), jnp.asarray(ids), jnp.asarray(z))
    model = nc.trace(multi_key_sorts, args)
    for k, (g, w) in enumerate(zip(jax.tree_util.tree_leaves(model(*args)),
                                   jax.tree_util.tree_leaves(multi_key_sorts(*args)))):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                      err_msg=f"output {k}")


def test_a_sort_on_a_boolean_key_stays_unsupported() -> None:
    ops = nc.check(lambda x, y: jax.lax.sort((x > 0, y), num_keys=1)[1], (jnp.ones((2, 5)), jnp.ones((2, 5))))
    assert [op.opcode for op in ops] == ["sort"]
