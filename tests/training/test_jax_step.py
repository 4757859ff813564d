"""A JAX value_and_grad step with an optax optimizer on the core, against JAX's own jitted update
(several steps, fp32 tight and bf16 within bf16 error), laid out in forward/backward/optimizer."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

from neuroncore.frontends.tracing import TraceError  # noqa: E402
from neuroncore.training import trace_jax_train_step  # noqa: E402


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 4)).mean()


def _init() -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 16)) * 0.3, "b1": jnp.zeros(16),
              "w2": jax.random.normal(k2, (16, 4)) * 0.3, "b2": jnp.zeros(4)}
    x = jax.random.normal(k3, (6, 8))
    return params, x, jnp.array([0, 1, 2, 3, 0, 1])


def _reference(params: dict[str, jax.Array], optimizer: optax.GradientTransformation, x: jax.Array,
               y: jax.Array, steps: int) -> tuple[list[float], dict[str, jax.Array]]:
    state = optimizer.init(params)

    @jax.jit
    def update(params: dict[str, jax.Array], state: optax.OptState) -> tuple[jax.Array, ...]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    losses = []
    for _ in range(steps):
        loss, params, state = update(params, state)
        losses.append(float(loss))
    return losses, params


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum"])
def test_fp32_jax_steps_match_jax(name: str) -> None:
    optimizer = {"adamw": optax.adamw(1e-2, weight_decay=0.01),
                 "sgd-momentum": optax.sgd(0.1, momentum=0.9)}[name]
    params, x, y = _init()
    step = trace_jax_train_step(loss_fn, params, optimizer, (x, y))
    losses = [float(step(x, y)) for _ in range(4)]
    expected, ref_params = _reference(params, optimizer, x, y, steps=4)
    assert losses == pytest.approx(expected, rel=1e-5)
    for key in params:
        np.testing.assert_allclose(np.asarray(step.params[key]), np.asarray(ref_params[key]), atol=1e-5)
    if name == "adamw":
        assert int(step.opt_state[0].count) == 4  # optax's own state, on the host


def test_bf16_jax_step_within_bf16_error() -> None:
    params, x, y = _init()
    optimizer = optax.adamw(1e-2)
    step = trace_jax_train_step(loss_fn, params, optimizer, (x, y), precision="bf16")
    losses = [float(step(x, y)) for _ in range(3)]
    expected, ref_params = _reference(params, optimizer, x, y, steps=3)
    assert losses == pytest.approx(expected, rel=2e-2)
    for key in params:
        np.testing.assert_allclose(np.asarray(step.params[key]), np.asarray(ref_params[key]),
                                   atol=3 * 1e-2 + 2**-8)


def test_jax_step_is_laid_out_by_phase() -> None:
    params, x, y = _init()
    step = trace_jax_train_step(loss_fn, params, optax.adam(1e-3), (x, y))
    phases = {op.layer.split("/")[1] for op in step.graph.ops if op.opcode != "parameter"}
    assert phases == {"forward", "backward", "optimizer"}
    dots = {op.layer.split("/")[1] for op in step.graph.ops if op.opcode == "dot"}
    assert dots == {"forward", "backward"}  # 2 forward matmuls, their 3 gradient matmuls
    with pytest.raises(TraceError, match="batch of shapes"):
        step(x[:2], y[:2])
