"""JAX random numbers in a training step: ``jax.random`` keys passed into a ``value_and_grad`` step
(dropout by ``jax.random.bernoulli``) lowered to the core's ``rng`` op with JAX's own generator,
Threefry-2x32, so the masks, the losses and the trained parameters equal JAX's."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

import neuroncore  # noqa: E402
from neuroncore.frontends.tracing import TraceError  # noqa: E402
from neuroncore.ir import threefry  # noqa: E402
from neuroncore.training import trace_jax_train_step  # noqa: E402

RATE = 0.3


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    keep = jax.random.bernoulli(key, 1.0 - RATE, h.shape)  # dropout
    h = jnp.where(keep, h / (1.0 - RATE), 0.0)
    logits = h @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 4)).mean()


def _keys(n: int) -> list[jax.Array]:
    return list(jax.random.split(jax.random.PRNGKey(42), n))  # full 32-bit words, not small ints


def test_threefry_matches_jax_bits() -> None:
    for key in _keys(3):
        words = np.asarray(key)
        np.testing.assert_array_equal(threefry.random_bits(np.arange(37), (int(words[0]), int(words[1]))),
                                      np.asarray(jax.random.bits(key, (37,))))
        np.testing.assert_array_equal(threefry.from_halves(threefry.to_halves(words)), words)


def test_uniform_and_bernoulli_on_the_core_equal_jax_exactly() -> None:
    def draw(key: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.random.uniform(key, (5, 130)) + x, jax.random.bernoulli(key, 0.5, (3, 9))

    x = jnp.zeros((5, 130))
    traced = neuroncore.trace(draw, (_keys(1)[0], x))
    assert [op.attrs["algorithm"] for op in traced.graph.ops if op.opcode == "rng"] == ["threefry2x32"] * 2
    for key in _keys(3):
        (u, mask), (u_ref, mask_ref) = traced(key, x), jax.jit(draw)(key, x)
        np.testing.assert_array_equal(np.asarray(u), np.asarray(u_ref))
        np.testing.assert_array_equal(np.asarray(mask), np.asarray(mask_ref))


def test_dropout_step_with_a_key_per_step_equals_jax() -> None:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 32)) * 0.3, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 4)) * 0.3, "b2": jnp.zeros(4)}
    x, y = jax.random.normal(k3, (6, 8)), jnp.array([0, 1, 2, 3, 0, 1])
    optimizer = optax.adamw(1e-2)
    keys = _keys(3)
    step = trace_jax_train_step(loss_fn, params, optimizer, (x, y, keys[0]))
    losses = [float(step(x, y, key)) for key in keys]

    @jax.jit
    def update(params: dict[str, jax.Array], state: optax.OptState,
               key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], optax.OptState]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, state = optimizer.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    ref, state, expected = params, optimizer.init(params), []
    for key in keys:
        loss, ref, state = update(ref, state, key)
        expected.append(float(loss))
    assert losses == pytest.approx(expected, rel=1e-5)
    for name in params:  # the backward applied the forward's mask: the trained weights agree
        np.testing.assert_allclose(np.asarray(step.params[name]), np.asarray(ref[name]), atol=1e-5)
    # a different key gives a different mask (the losses move with it)
    assert len({round(v, 6) for v in losses}) == len(losses)


def test_keys_split_and_folded_inside_the_function_equal_jax() -> None:
    """``jax.random.split`` / ``fold_in`` of the key passed in: the derived key's words are Threefry
    of the input's words, evaluated by the rng op at run time, so the draws still equal JAX's."""
    def derived(w: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, b = jax.random.split(key)
        c = jax.random.fold_in(b, 7)
        return (w * jax.random.uniform(a, w.shape), jax.random.bernoulli(c, 0.3, (4, 6)),
                jax.random.uniform(jax.random.split(a, 3)[2], (5,)))

    w = jnp.ones((4, 9))
    traced = neuroncore.trace(derived, (w, _keys(1)[0]))
    for key in _keys(2):
        for got, want in zip(traced(w, key), jax.jit(derived)(w, key)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_random_words_used_otherwise_are_refused_in_one_line() -> None:
    def raw_bits(w: jax.Array, key: jax.Array) -> jax.Array:
        return w + jax.random.bits(key, w.shape).astype(jnp.float32)

    with pytest.raises(TraceError, match=r"JAX random words \(threefry2x32\) used other than") as info:
        neuroncore.trace(raw_bits, (jnp.ones((4,)), _keys(1)[0]))
    assert "\n" not in str(info.value)


def test_dropout_step_with_typed_keys_equals_jax() -> None:
    """``jax.random.key`` (JAX's recommended typed keys, what Flax NNX's ``Rngs`` hands a dropout
    layer) and the in-function split a dropout layer does with it: the typed key reaches the HLO as
    ``u32[2]`` wrapped in a ``Sharding`` custom-call (an identity on one device), and the host passes
    its ``key_data``. An AdamW step with a new typed key every step equals JAX's own jitted update."""
    def typed_loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        key, sub = jax.random.split(key)
        return loss_fn(params, x, y, sub)

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 32)) * 0.3, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 4)) * 0.3, "b2": jnp.zeros(4)}
    x, y = jax.random.normal(k3, (6, 8)), jnp.array([0, 1, 2, 3, 0, 1])
    optimizer = optax.adamw(1e-2)
    keys = list(jax.random.split(jax.random.key(42), 3))
    assert jax.dtypes.issubdtype(keys[0].dtype, jax.dtypes.prng_key)
    step = trace_jax_train_step(typed_loss, params, optimizer, (x, y, keys[0]))
    assert [op.attrs["algorithm"] for op in step.graph.ops if op.opcode == "rng"] == ["threefry2x32"]
    losses = [float(step(x, y, key)) for key in keys]

    @jax.jit
    def update(params: dict[str, jax.Array], state: optax.OptState,
               key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], optax.OptState]:
        loss, grads = jax.value_and_grad(typed_loss)(params, x, y, key)
        updates, state = optimizer.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    ref, state, expected = params, optimizer.init(params), []
    for key in keys:
        loss, ref, state = update(ref, state, key)
        expected.append(float(loss))
    assert losses == pytest.approx(expected, rel=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(step.params[name]), np.asarray(ref[name]), atol=1e-5)
    assert len({round(v, 6) for v in losses}) == len(losses)
