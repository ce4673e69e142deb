"""Stages: pipeline parallelism for the segment classifier (``distributed.stages``): message-passing steps in S stages on S
devices, a batch in M micro-batches run GPipe-style, gradients accumulated and applied once.

The classifier (``model.classifier``) encodes, then applies its core K times, with an edge
output after each step. ``stage_steps`` gives stage s the contiguous steps
[s*K/S, (s+1)*K/S) (stage 0 also runs the encoders); a stage hands the next one the encoded and
current latents of a micro-batch. ``split_batch`` cuts a merged batch into M micro-batches of
whole graphs (or subgraphs): graphs of a batch do not interact, so every edge's logits, hence
the loss sums and their gradients, are those of the whole batch, summed over micro-batches.

The schedule is GPipe's forward: stage s runs micro-batch m once it has m from stage s-1 and has
finished m-1 itself (a control dependency: one micro-batch at a time per device); TensorFlow's
executor then runs stage s on m alongside stage s+1 on m-1. The backward pass is the tape's
gradient of the summed loss over all micro-batches, its ops placed with the forward ops they
differentiate. So one call gives ``(loss sum, weight sum, gradient sums)``, exactly what
``TrainStep._local_terms`` returns for a batch: the trainer's exchange (Horovod allreduce across
workers, one set of stages per worker) and apply parts stay as they are.

Devices (``stage_devices``): GPUs when present (stage s on GPU s mod #GPUs), otherwise logical
CPU devices made at start-up. Logical CPU devices share the process's thread pools: on CPU the
stages overlap only as far as inter-op threads and cores allow (2 cores here), so the bench
(``hvdtrack.bench.stages``) measures the schedule and its bubble, not a GPU pipeline's speedup.

The stages call the classifier's own parts, ``SegmentClassifier.encode`` (stage 0) and
``.core_step`` (each step), as ``SegmentClassifier.__call__`` does; ``tests/train/test_stages.py``
checks logits and gradients against the classifier itself.

Public symbols: ``StagedClassifier``, ``stage_steps``, ``split_batch``,
``stage_devices``, ``make_stage_devices``, ``bubble_fraction``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf
from graph_nets.graphs import GraphsTuple

from hvdtrack.distributed.config import StagesConfig
from hvdtrack.errors import ConfigError
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.loss import weighted_bce_terms


def stage_steps(num_steps: int, stages: int) -> list[range]:
    """The message-passing steps of each stage: contiguous, sizes differing by at most one.

    Raises:
      ConfigError: for more stages than steps.
    """
    if not 1 <= stages <= num_steps:
        raise ConfigError(
            f"'stages' ({stages}) must be between 1 and model.num_message_passing_steps "
            f"({num_steps}): a stage runs at least one message-passing step"
        )
    return [range(s * num_steps // stages, (s + 1) * num_steps // stages) for s in range(stages)]


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction of the devices, (S - 1) / (M + S - 1), for equal stages."""
    return (stages - 1) / (micro_batches + stages - 1)


def split_batch(
    graphs: GraphsTuple, labels: tf.Tensor, parts: int
) -> list[tuple[GraphsTuple, tf.Tensor]]:
    """Cuts a merged batch into ``parts`` micro-batches of consecutive whole graphs.

    Args:
      graphs: B graphs merged (nodes [sum N, F_n], senders/receivers offset into them, ...).
      labels: float32 [sum E].
      parts: M; part p holds graphs [p*B/M, (p+1)*B/M) (empty parts when B < M).

    Returns:
      M ``(GraphsTuple, labels)`` pairs, senders and receivers offset within the part.
    """
    num_graphs = tf.shape(graphs.n_node)[0]
    node_start = tf.concat([[0], tf.cumsum(graphs.n_node)], 0)
    edge_start = tf.concat([[0], tf.cumsum(graphs.n_edge)], 0)
    bounds = [p * num_graphs // parts for p in range(parts + 1)]
    out = []
    for first, last in zip(bounds[:-1], bounds[1:]):
        n0, n1 = node_start[first], node_start[last]
        e0, e1 = edge_start[first], edge_start[last]
        part = GraphsTuple(
            nodes=graphs.nodes[n0:n1],
            edges=graphs.edges[e0:e1],
            senders=graphs.senders[e0:e1] - n0,
            receivers=graphs.receivers[e0:e1] - n0,
            globals=graphs.globals[first:last],
            n_node=graphs.n_node[first:last],
            n_edge=graphs.n_edge[first:last],
        )
        out.append((part, labels[e0:e1]))
    return out


def make_stage_devices(stages: int) -> None:
    """Makes ``stages`` logical CPU devices when there is no GPU, unless TensorFlow has started.

    Configuration only: it does not start TensorFlow, so it can run before the workers are
    made (``Trainer``: Horovod's rank heartbeats run ops, which start it). Once TensorFlow runs
    it leaves the devices as they are.
    """
    if tf.config.list_physical_devices("GPU"):
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(stages)]
        )
    except RuntimeError:
        pass  # TensorFlow already started: share the devices it has


def stage_devices(stages: int) -> list[str]:
    """Device names for the stages: GPUs if any, else logical CPU devices.

    Logical CPU devices can only be made before TensorFlow starts (they are, by a first call
    made then, or by ``make_stage_devices`` before it: ``stages`` of them). Once TensorFlow
    runs, the stages share the devices it has (stage s on device s mod count).
    """
    make_stage_devices(stages)  # listing logical devices starts TensorFlow: configure first
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [gpus[s % len(gpus)].name for s in range(stages)]
    cpus = tf.config.list_logical_devices("CPU")
    return [cpus[s % len(cpus)].name for s in range(stages)]


class StagedClassifier:
    """A ``SegmentClassifier`` run as S stages over M micro-batches (same variables).

    Args:
      model: the classifier (its variables are used as they are, wherever they live).
      config: stages and micro-batches.
      devices: one device name per stage (default: ``stage_devices(config.num_stages)``).

    Raises:
      ConfigError: more stages than message-passing steps, a device list of another length,
        or a model setting the stages do not follow (``precision`` other than float32,
        ``recompute``).
    """

    def __init__(
        self,
        model: SegmentClassifier,
        config: StagesConfig,
        devices: Optional[Sequence[str]] = None,
    ):
        for key, plain in (("precision", "float32"), ("recompute", False)):
            value = getattr(model.config, key, plain)
            if value != plain:
                raise ConfigError(
                    f"'model.{key}' is {value!r}: the stages run the float32 forward "
                    f"without recompute; set model.{key}={plain} or distributed.stages.num_stages=1"
                )
        self.model = model
        self.config = config
        self.steps = stage_steps(model.config.num_message_passing_steps, config.num_stages)
        self.devices = list(devices) if devices is not None else stage_devices(config.num_stages)
        if len(self.devices) != config.num_stages:
            raise ConfigError(
                f"StagedClassifier: {len(self.devices)} devices for {config.num_stages} stages"
            )

    # ------------------------------------------------------------------------ one stage
    def _run_stage(self, stage: int, state: tuple) -> tuple:
        """Stage ``stage`` on one micro-batch: state (encoded, latent, invariant, logits)."""
        m = self.model
        last = m.config.num_message_passing_steps - 1
        if stage == 0:
            encoded, invariant = m.encode(state[0])
            state = (encoded, encoded, invariant, [])
        encoded, latent, invariant, logits = state
        logits = list(logits)
        for step in self.steps[stage]:
            output = m.config.output_every_step or step == last
            latent, step_logits = m.core_step(latent, encoded, invariant, output, step == last)
            if output:
                logits.append(step_logits)
        return encoded, latent, invariant, logits

    def forward(self, graphs: GraphsTuple, labels: tf.Tensor) -> list[tuple[list, tf.Tensor]]:
        """GPipe forward: per micro-batch, (its logits per output step, its labels).

        Stage s of micro-batch m waits for stage s of m - 1 (one micro-batch at a time per
        device) and for stage s - 1 of m (its input); inside a ``tf.function`` the executor
        overlaps the rest. Eagerly the stages simply run in order.
        """
        parts = split_batch(graphs, labels, self.config.micro_batches)
        busy: list[Optional[tf.Tensor]] = [None] * self.config.num_stages  # last output per stage
        out = []
        for part_graphs, part_labels in parts:
            state: tuple = (part_graphs,)
            for stage, device in enumerate(self.devices):
                wait = [busy[stage]] if busy[stage] is not None else []
                with tf.device(device), tf.control_dependencies(wait):
                    state = self._run_stage(stage, state)
                busy[stage] = state[1].nodes
            out.append((state[3], part_labels))
        return out

    def loss_terms(
        self, graphs: GraphsTuple, labels: tf.Tensor, true_weight: float, fake_weight: float
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """(weighted loss sum, weight sum) over every micro-batch (see ``model.loss``)."""
        loss_sum = weight_sum = tf.constant(0.0)
        with tf.device(self.devices[-1]):
            for logits, part_labels in self.forward(graphs, labels):
                part_loss, part_weight = weighted_bce_terms(
                    logits, part_labels, true_weight, fake_weight
                )
                loss_sum += part_loss
                weight_sum += part_weight
        return loss_sum, weight_sum

    def local_terms(
        self,
        graphs: GraphsTuple,
        labels: tf.Tensor,
        variables: Sequence[tf.Variable],
        true_weight: float,
        fake_weight: float,
    ) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """What ``TrainStep._local_terms`` returns, staged: (loss sum, weight sum, gradients of
        the loss sum accumulated over the micro-batches; zeros for unused variables)."""
        with tf.GradientTape() as tape:
            loss_sum, weight_sum = self.loss_terms(graphs, labels, true_weight, fake_weight)
        grads = tape.gradient(loss_sum, list(variables))
        grads = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)
        ]
        return loss_sum, weight_sum, grads
