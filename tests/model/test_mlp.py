"""The MLPs' lean layers (``hvdtrack.model.mlp``): parts kept instead of their concatenation, a
narrow input's first layer computed again instead of kept, a last layer whose bias gradient
comes from the layer norm's kernel. The values and gradients are TensorFlow's own, and the
compiled backward pass holds neither the concatenation nor the narrow layer's output."""

from __future__ import annotations

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

from hvdtrack.model import mlp as mlp_module
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import plain_ops, vector_code
from hvdtrack.model.mlp import (
    NARROW_INPUT,
    FusedMLP,
    NormedMLP,
    linear_freeing_input,
    linear_norm,
    make_mlp,
)
from hvdtrack.model.norm import LayerNorm, NormOutput


def _reference(mlp: FusedMLP, x: tf.Tensor) -> tf.Tensor:
    """The same MLP in plain TensorFlow ops on the concatenated input."""
    count = len(mlp.layers)
    for i, layer in enumerate(mlp.layers):
        x = x @ layer.w + layer.b
        if i < count - 1 or mlp._activate_final:
            x = tf.nn.relu(x)
    return x


def _values_and_gradients(fn, inputs, variables, upstream):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = fn(inputs)
        total = tf.reduce_sum(out * upstream)
    return [out, *tape.gradient(total, [*inputs, *variables])]


@pytest.mark.parametrize("sizes", [(8, 5), (8, 6, 5), (8,)])
@pytest.mark.parametrize("activate_final", [True, False])
@pytest.mark.parametrize("widths", [(3,), (3, 2, 4), (NARROW_INPUT + 1,), (NARROW_INPUT,)])
def test_values_and_gradients_are_tensorflows_own(sizes, activate_final, widths):
    rng = np.random.default_rng(4)
    parts = [tf.constant(rng.standard_normal((30, w)), tf.float32) for w in widths]
    mlp = FusedMLP(list(sizes), activation=tf.nn.relu, activate_final=activate_final)
    mlp(tuple(parts) if len(parts) > 1 else parts[0])  # variables created
    upstream = tf.constant(rng.standard_normal((30, sizes[-1])), tf.float32)
    ours = _values_and_gradients(
        lambda p: mlp(tuple(p) if len(p) > 1 else p[0]), parts, mlp.trainable_variables, upstream
    )
    theirs = _values_and_gradients(
        lambda p: _reference(mlp, tf.concat(p, axis=-1)), parts, mlp.trainable_variables, upstream
    )
    assert len(ours) == len(theirs) == 1 + len(parts) + 2 * len(sizes)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


def _compiled_backward(mlp: FusedMLP, parts: list[tf.Tensor]) -> tf.Graph:
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(parts)
            out = mlp(tuple(parts) if len(parts) > 1 else parts[0])
            total = tf.reduce_sum(out**2)
        return tape.gradient(total, [*parts, *mlp.trainable_variables])

    return step.get_concrete_function().graph


def _forward_op(graph: tf.Graph, op_type: str) -> tf.Operation:
    """The first op of that type in the MLP over the 20 rows."""
    ops = [
        op
        for op in graph.get_operations()
        if op.type == op_type and "mlp" in op.name and op.outputs[0].shape[0] == 20
    ]
    assert ops, [op.type for op in graph.get_operations()]
    return ops[0]


def test_the_backward_pass_does_not_hold_the_concatenation():
    rng = np.random.default_rng(5)
    parts = [tf.constant(rng.standard_normal((20, w)), tf.float32) for w in (3, 2, 4)]
    mlp = FusedMLP([8, 5], activation=tf.nn.relu, activate_final=True)
    graph = _compiled_backward(mlp, parts)
    concat = _forward_op(graph, "ConcatV2")
    # read by the forward product only (grappler may fuse its bias and ReLU in later)
    assert [op.type for op in concat.outputs[0].consumers()] == ["MatMul"]


def test_the_narrow_first_layer_is_computed_again_when_the_gradient_comes():
    rng = np.random.default_rng(6)
    x = tf.constant(rng.standard_normal((20, 4)), tf.float32)
    mlp = FusedMLP([8, 5], activation=tf.nn.relu, activate_final=True)
    graph = _compiled_backward(mlp, [x])
    hidden = _forward_op(graph, "Relu")
    # the forward hidden layer feeds the forward second product only: not the backward pass
    assert [op.type for op in hidden.outputs[0].consumers()] == ["MatMul"]
    # the backward pass's own first layer reads x through an identity that waits for the
    # upstream gradient (not the product itself: grappler would not fuse it then)
    waits = [op for op in graph.get_operations() if op.type == "Identity" and op.control_inputs]
    assert any(
        op.type == "MatMul" for wait in waits for op in wait.outputs[0].consumers()
    ), "the recomputed first layer does not wait: it would run as soon as x exists"


def test_linear_freeing_input_gives_tensorflows_gradients_weight_gradient_first():
    rng = np.random.default_rng(7)
    x, w, b = (
        tf.constant(rng.standard_normal(shape), tf.float32) for shape in ((30, 8), (8, 5), (5,))
    )
    upstream = tf.constant(rng.standard_normal((30, 5)), tf.float32)
    ours = _values_and_gradients(lambda p: linear_freeing_input(*p), [x, w, b], [], upstream)
    theirs = _values_and_gradients(lambda p: p[0] @ p[1] + p[2], [x, w, b], [], upstream)
    for a, c in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-6, atol=1e-6)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch([x, w, b])
            total = tf.reduce_sum(linear_freeing_input(x, w, b) ** 2)
        return tape.gradient(total, [x, w, b])

    graph = step.get_concrete_function().graph
    # x's gradient (a product with w) waits for the weight gradient (a product reading x: here
    # [8, 5], taken as the transpose of a [5, 8] product, weight_gradient's TensorFlow route)
    waiting = [op for op in graph.get_operations() if op.type == "MatMul" and op.control_inputs]
    assert waiting and all(
        op.get_attr("transpose_b")
        and inp.type == "Transpose"
        and inp.inputs[0].op.type == "MatMul"
        and inp.inputs[0].op.get_attr("transpose_a")
        for op in waiting
        for inp in op.control_inputs
    )


def _linear_norm_case(relu: bool, given_back: bool):
    """x, w, b [2500, 24], [24, 16], [16], upstream, and a LayerNorm whose scale has a zero
    column (which y cannot give the normalised product back through) unless ``given_back``."""
    rng = np.random.default_rng(8)
    x, w, b = (
        tf.constant(rng.standard_normal(shape), tf.float32)
        for shape in ((2500, 24), (24, 16), (16,))  # more rows than one block of the kernel
    )
    upstream = tf.constant(rng.standard_normal((2500, 16)), tf.float32)
    norm = LayerNorm(relu=relu)
    norm.parameters(16)
    scale = 1 + 0.3 * rng.standard_normal(16)
    scale[3] = scale[3] if given_back else 0.0  # a column y cannot give back (norm._invertible)
    norm.scale.assign(scale), norm.offset.assign(rng.random(16))
    return x, w, b, upstream, norm


def _tensorflows_linear_norm(x, w, b, upstream, norm):
    with plain_ops():  # TensorFlow's ops and autodiff: the bias's gradient a BiasAddGrad
        return _values_and_gradients(
            lambda p: norm(tf.nn.bias_add(p[0] @ p[1], p[2])),
            [x, w, b], [norm.scale, norm.offset], upstream,
        )  # fmt: skip


def _assert_close(ours, theirs):
    assert len(ours) == len(theirs) == 6
    for a, c in zip(ours, theirs):
        scale = max(1.0, np.abs(c.numpy()).max())
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=0, atol=1e-5 * scale)


@pytest.fixture(params=["one kernel", "product, then norm"])
def one_kernel(request, monkeypatch):
    """Whether linear_norm may take HvdtrackLinearNorm (where this CPU has vector code)."""
    if request.param != "one kernel":
        monkeypatch.setattr(mlp_module, "_in_one_kernel", lambda x, norm: False)
    return request.param == "one kernel" and vector_code()


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("given_back", [True, False])  # by y; else x @ w + b computed again
def test_linear_norm_gives_tensorflows_gradients_with_the_bias_from_the_norm(
    relu, given_back, one_kernel
):
    x, w, b, upstream, norm = _linear_norm_case(relu, given_back)
    variables = [norm.scale, norm.offset]
    ours = _values_and_gradients(lambda p: linear_norm(*p, norm), [x, w, b], variables, upstream)
    theirs = _tensorflows_linear_norm(x, w, b, upstream, norm)
    _assert_close(ours, theirs)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch([x, w, b])
            total = tf.reduce_sum(linear_norm(x, w, b, norm) ** 2)
        return tape.gradient(total, [x, w, b, *variables])

    graph = step.get_concrete_function().graph
    types = [op.type for op in graph.get_operations()]
    # one kernel each way, the bias's gradient among the backward kernel's outputs; with
    # vector code the forward product in the norm's kernel
    assert "BiasAddGrad" not in types, types
    assert types.count("HvdtrackLayerNormGrad") == 1
    if one_kernel:
        assert types.count("HvdtrackLinearNorm") == 1 and "HvdtrackLayerNorm" not in types
    else:
        assert types.count("HvdtrackLayerNorm") == 1 and "HvdtrackLinearNorm" not in types
    waiting = [op for op in graph.get_operations() if op.type == "MatMul" and op.control_inputs]
    assert waiting, "x's gradient does not wait for the weight gradient"


@pytest.mark.parametrize("given_back", [True, False])
def test_linear_norm_from_a_kept_output_gives_tensorflows_gradients(given_back, one_kernel):
    # a recomputed step's: the forward pass kept (kept=True), its backward pass from that
    x, w, b, upstream, norm = _linear_norm_case(True, given_back)
    kept = linear_norm(x, w, b, norm, kept=True)
    assert isinstance(kept, NormOutput)
    variables = [norm.scale, norm.offset]
    ours = _values_and_gradients(
        lambda p: linear_norm(*p, norm, kept=kept), [x, w, b], variables, upstream
    )
    _assert_close(ours, _tensorflows_linear_norm(x, w, b, upstream, norm))


@pytest.mark.parametrize("sizes", [(32, 16), (32, 24, 16)])
@pytest.mark.parametrize("widths", [(3, 2, 4), (NARROW_INPUT + 1,), (3,)])
def test_make_mlp_with_a_norm_gives_tensorflows_values_and_gradients(sizes, widths, one_kernel):
    # the node update's parts, an edge update's wide input, an encoder's narrow one (whose
    # first two layers run as one: with two layers, the sequence as it is)
    rng = np.random.default_rng(8)
    parts = [tf.constant(rng.standard_normal((40, w)), tf.float32) for w in widths]
    model = make_mlp(sizes, ModelConfig(), with_layer_norm=True, activate_final=True)
    assert isinstance(model, NormedMLP)

    def ours(p):
        return model(tuple(p) if len(p) > 1 else p[0])

    ours(parts)  # variables created
    mlp, norm = model._layers  # (snt.Sequential has no public list)
    norm.scale.assign(1 + rng.random(16)), norm.offset.assign(rng.random(16))

    def theirs(p):
        with plain_ops():
            return norm(tf.nn.relu(_reference(mlp, tf.concat(p, axis=-1))))

    upstream = tf.constant(rng.standard_normal((40, 16)), tf.float32)
    variables = model.trainable_variables
    mine = _values_and_gradients(ours, parts, variables, upstream)
    want = _values_and_gradients(theirs, parts, variables, upstream)
    assert len(mine) == len(want) == 1 + len(parts) + 2 * len(sizes) + 2
    for a, c in zip(mine, want):
        scale = max(1.0, np.abs(c.numpy()).max())
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=0, atol=1e-5 * scale)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(parts)
            total = tf.reduce_sum(ours(parts) ** 2)
        return tape.gradient(total, [*parts, *variables])

    types = [op.type for op in step.get_concrete_function().graph.get_operations()]
    # a BiasAddGrad per layer but the last, whose bias gradient is the norm's gradient
    # kernel's, except where the two layers run as one (narrow input): both theirs
    narrow = len(widths) == 1 and widths[0] <= NARROW_INPUT
    assert types.count("BiasAddGrad") == (2 if narrow and len(sizes) == 2 else len(sizes) - 1)
    assert types.count("HvdtrackLayerNormGrad") == 1
    fused = not (narrow and len(sizes) == 2) and one_kernel
    assert types.count("HvdtrackLinearNorm") == (1 if fused else 0), types


def test_make_mlp_with_a_norm_in_bfloat16_has_the_sequences_values():
    # no kernels in bfloat16: linear_norm's fallback, the same ops as the sequence's
    rng = np.random.default_rng(9)
    parts = tuple(tf.constant(rng.standard_normal((40, w)), tf.bfloat16) for w in (3, 2, 4))
    ours = make_mlp((32, 16), ModelConfig(), with_layer_norm=True, activate_final=True)
    theirs = snt.Sequential([FusedMLP([32, 16], tf.nn.relu, False), LayerNorm(relu=True)])
    results = []
    for model in (ours, theirs):
        model(tuple(tf.cast(p, tf.float32) for p in parts))  # variables created, float32
        for v, value in zip(model.variables, (0.1 * np.arange(1, 7)).tolist()):
            v.assign(
                tf.fill(v.shape.as_list(), value) + tf.random.stateless_normal(v.shape, [1, 2])
            )
        with snt.custom_variable_getter(lambda v: tf.cast(v, tf.bfloat16)):
            results.append(model(parts))
    assert results[0].dtype == tf.bfloat16
    np.testing.assert_array_equal(results[0].numpy(), results[1].numpy())


def test_normed_mlp_refuses_what_make_mlp_does_not_build():
    with pytest.raises(ValueError, match="final ReLU is the norm's"):
        NormedMLP(FusedMLP([8, 4], tf.nn.relu, True), LayerNorm(relu=True))
    with pytest.raises(ValueError, match="norm relu=False"):
        NormedMLP(FusedMLP([8, 4], tf.nn.relu, False), LayerNorm())
    with pytest.raises(ValueError, match="activation tanh"):
        NormedMLP(FusedMLP([8, 4], tf.nn.tanh, False), LayerNorm(relu=True))


def test_make_mlp_with_a_norm_keeps_the_sequences_checkpoint_keys(tmp_path):
    config = ModelConfig()
    x = tf.ones([2, NARROW_INPUT + 1])
    ours = make_mlp((8, 4), config, with_layer_norm=True, activate_final=True)
    theirs = snt.Sequential([FusedMLP([8, 4], tf.nn.relu, False), LayerNorm(relu=True)])
    ours(x), theirs(x)
    path = tf.train.Checkpoint(model=theirs).write(str(tmp_path / "sequence"))
    keys = sorted(name for name, _ in tf.train.list_variables(path))
    assert any("_layers/1" in k for k in keys)  # the norm, second in the sequence
    tf.train.Checkpoint(model=ours).read(path).assert_consumed()
    assert sorted(v.name for v in ours.variables) == sorted(v.name for v in theirs.variables)
