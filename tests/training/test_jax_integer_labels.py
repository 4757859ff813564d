"""JAX training steps whose loss is optax's integer-label cross-entropy
(``softmax_cross_entropy_with_integer_labels``: ``jnp.take_along_axis``, a gather with batching
dims, and its gradient, a scatter-add), and an embedding looked up by ids (its gradient a
scatter-add of rows), against JAX's own jitted update over several steps."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

from neuroncore.training import trace_jax_train_step  # noqa: E402


def _classifier_loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _lm_loss(params: dict[str, jax.Array], ids: jax.Array, labels: jax.Array) -> jax.Array:
    h = params["emb"][ids]  # [B, S, D]: a row lookup, its gradient a scatter-add of rows
    h = jnp.tanh(h @ params["w"])
    logits = h @ params["emb"].T  # tied output projection, [B, S, V]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _reference(loss_fn, params, optimizer, inputs, steps):  # type: ignore[no-untyped-def]
    state = optimizer.init(params)

    @jax.jit
    def update(params, state):  # type: ignore[no-untyped-def]
        loss, grads = jax.value_and_grad(loss_fn)(params, *inputs)
        updates, state = optimizer.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    losses = []
    for _ in range(steps):
        loss, params, state = update(params, state)
        losses.append(float(loss))
    return losses, params


def _check(loss_fn, params, inputs, steps: int = 3) -> None:  # type: ignore[no-untyped-def]
    optimizer = optax.adamw(1e-2, weight_decay=0.01)
    step = trace_jax_train_step(loss_fn, params, optimizer, inputs)
    losses = [float(step(*inputs)) for _ in range(steps)]
    expected, ref_params = _reference(loss_fn, params, optimizer, inputs, steps)
    assert losses == pytest.approx(expected, rel=1e-5)
    for key in params:
        np.testing.assert_allclose(np.asarray(step.params[key]), np.asarray(ref_params[key]), atol=1e-5)


def test_integer_label_cross_entropy_steps_match_jax() -> None:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 16)) * 0.3, "b1": jnp.zeros(16),
              "w2": jax.random.normal(k2, (16, 4)) * 0.3, "b2": jnp.zeros(4)}
    x = jax.random.normal(k3, (6, 8))
    _check(_classifier_loss, params, (x, jnp.array([0, 1, 2, 3, 0, 1])))


def test_language_model_with_embedding_and_integer_labels_matches_jax() -> None:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"emb": jax.random.normal(k1, (32, 16)) * 0.3, "w": jax.random.normal(k2, (16, 16)) * 0.3}
    ids = jax.random.randint(k3, (2, 8), 0, 32)
    labels = jnp.roll(ids, -1, axis=1)
    _check(_lm_loss, params, (ids, labels))
