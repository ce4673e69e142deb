"""The compiled training step of one run, timed part by part, and the compiled evaluation step.

One optimizer step is three compiled functions, so the host can time each part on its own:

    local (forward + backward of every pass, graphs -> gradient sums; with
       ``distributed.stages``, through ``distributed.stages.StagedClassifier``)
    -> exchange (gradients and loss sums summed over all replicas: one collective, two with
       fp16 compression or Adasum)
    -> apply (Adam update with clipping).

The gradients pass between the parts as one vector (``split_gradients``): each input of a
compiled call costs host time, 28 gradients 1.4-1.8 ms a call (docs/scaling/README.md).
Each is traced once (input signatures with dynamic sizes; control flow by ``tf.cond`` and
``tf.while_loop``, so no AutoGraph). ``TrainStep.run`` runs them and returns a ``StepTimes``:
data wait, compute (local + apply) and exchange, which includes any wait for slower ranks. The
step holds no data (``data``) and owns no variables but its gradient accumulators (``state``).

Public symbols: ``TrainStep``, ``StepTimes``, ``REQUESTS``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Iterator

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed.stages import StagedClassifier
from hvdtrack.distributed.workers import Workers
from hvdtrack.errors import DataError
from hvdtrack.inputs import pipeline
from hvdtrack.model import metrics as metrics_lib
from hvdtrack.model.loss import weighted_bce_per_edge, weighted_bce_terms
from hvdtrack.train.state import TrainState
from hvdtrack.utils.memory import trim_heap

EPS = 1e-12
# What a rank can ask of all ranks through a step's exchange (a vector of flags, summed).
REQUESTS = ("stop", "checkpoint")


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """One optimizer step on this process: results and wall-clock parts in seconds."""

    loss: float
    grad_norm: float
    learning_rate: float
    stop: bool  # some rank asked to stop (a signal): every rank stops after this step
    checkpoint: bool  # some rank asked for a checkpoint (its clock): every rank saves now
    data_s: float
    compute_s: float
    exchange_s: float
    total_s: float


class TrainStep:
    """The compiled parts of a training step over ``state``'s variables, and evaluation.

    Args:
      config: the run configuration (``train`` and ``distributed`` sections).
      workers: the distribution seam (runs each part on every local replica, reduces).
      state: the model, optimizer and loss scale the step trains.
      stage_devices: with ``distributed.stages``, one device per stage: the local part then
        runs through a ``StagedClassifier`` (None: the plain model).
    """

    def __init__(
        self, config: Config, workers: Workers, state: TrainState, stage_devices: list | None = None
    ):
        self.config, self.workers, self.state = config, workers, state
        self.stages = None
        if stage_devices:
            self.stages = StagedClassifier(state.model, config.distributed.stages, stage_devices)
        with workers.scope():  # none with one backward pass a step
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="accumulate")
                for v in state.variables + [tf.constant(0.0), tf.constant(0.0)]
                if config.distributed.backward_passes_per_step > 1
            ]
        self.build()

    # ----------------------------------------------------------------------------- compiling
    def build(self) -> None:
        """(Re)defines the compiled parts, traced without AutoGraph (4 s of a tiny run's 11-12) on
        first call or by ``compile``; again when a trace's schedule changes (elastic resize)."""
        workers = self.workers
        scalar = tf.TensorSpec([], tf.float32)
        variables = self.state.variables
        self._sizes = [v.shape.num_elements() for v in variables]
        flat_spec = tf.TensorSpec([sum(self._sizes)], variables[0].dtype)

        def compiled(replica_fn, spec):
            # One input tuple per local replica, flattened; outputs: one list per local replica.
            size, signature = len(spec), list(spec) * workers.local_replicas

            def run(*flat):
                return workers.run(
                    replica_fn, [flat[i : i + size] for i in range(0, len(flat), size)]
                )

            return tf.function(run, input_signature=signature, autograph=False)

        graph_spec = list(pipeline.input_signature())
        self._local = compiled(self._replica_local, graph_spec)
        self._accumulate = compiled(self._replica_accumulate, graph_spec)
        flags = tf.TensorSpec([len(REQUESTS)], tf.float32)
        self._exchange = compiled(self._replica_exchange, [scalar, scalar, flags, flat_spec])
        self._apply = compiled(self._replica_apply, [flat_spec])
        self._eval = tf.function(self._eval_batch, input_signature=graph_spec, autograph=False)

    def compile(self) -> float:
        """Traces the step's compiled parts now, so that no step times a trace; returns the
        seconds it took.

        Then runs the local part once on a one-edge graph: the runtime optimizes and
        instantiates a compiled function on its first call, which takes seconds and about
        100 MiB of heap that is free again afterwards. Done here, the first real step neither
        times it nor holds it at its own memory peak (``trim_heap`` returns it to the system).
        The call changes no variable: the local part only reads the model, and the
        accumulators it clears are already clear between optimizer steps.
        """
        start = time.perf_counter()
        parts = [self._local, self._exchange, self._apply]
        if self.accumulators:
            parts.append(self._accumulate)
        for part in parts:
            part.get_concrete_function()
        one_edge = (pipeline.placeholder_graph(), tf.zeros([1], tf.float32))
        float(self._local(*one_edge * self.workers.local_replicas)[0][0])
        trim_heap()
        return time.perf_counter() - start

    def trace_count(self) -> int:
        """Traces of the step's compiled parts (1 each once it has run: one graph per part)."""
        parts = (self._local, self._exchange, self._apply, self._accumulate)
        return max(f.experimental_get_tracing_count() for f in parts)

    # ----------------------------------------------------------------------------- replica code
    def _local_terms(self, graphs, labels):
        """(loss sum, weight sum, gradients of the loss sum) of one replica's batch; through
        the stages and micro-batches of ``distributed.stages`` when it has stages."""
        tc, state = self.config.train, self.state
        if self.stages is not None:  # float32 only (config check): no loss scale
            return self.stages.local_terms(
                graphs, labels, state.variables, tc.true_weight, tc.fake_weight
            )
        scale = state.loss_scale.scale if state.loss_scale else None
        with tf.GradientTape() as tape:
            logits = state.model(graphs)
            loss_sum, weight_sum = weighted_bce_terms(
                logits, labels, tc.true_weight, tc.fake_weight
            )
            target = loss_sum if scale is None else loss_sum * scale
        grads = tape.gradient(target, state.variables)
        if scale is not None:
            grads = [None if g is None else tf.convert_to_tensor(g) / scale for g in grads]
        # Sonnet-style optimizers expect every variable: no gradient means a zero update.
        grads = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, state.variables)
        ]
        return loss_sum, weight_sum, grads

    def _replica_local(self, graphs, labels):
        # The last pass of a step: adds (and clears) what earlier passes accumulated.
        loss_sum, weight_sum, grads = self._local_terms(graphs, labels)
        if self.accumulators:
            acc = [a.read_value() for a in self.accumulators]
            for a in self.accumulators:
                a.assign(tf.zeros_like(a))
            grads = [g + a for g, a in zip(grads, acc[:-2])]
            loss_sum, weight_sum = loss_sum + acc[-2], weight_sum + acc[-1]
        return [loss_sum, weight_sum, _flatten(grads)]

    def _replica_accumulate(self, graphs, labels):
        loss_sum, weight_sum, grads = self._local_terms(graphs, labels)
        for a, value in zip(self.accumulators, grads + [loss_sum, weight_sum]):
            a.assign_add(value)
        return loss_sum

    def _replica_exchange(self, loss_sum, weight_sum, requests, flat):
        workers = self.workers
        # Inputs of a compiled function carry no device; collectives of tf.distribute want
        # their values placed on the replica's device (the identity does that, no copy).
        loss_sum, weight_sum, requests, flat = [
            tf.identity(x) for x in (loss_sum, weight_sum, requests, flat)
        ]
        # Exact global mean over edges: sums of (gradient of the loss sum, loss sum, weight)
        # over all replicas, divided once, so 2 workers x b graphs == 1 worker x 2b graphs.
        # ``requests`` (1.0 where this rank asks for one of ``REQUESTS``) are summed too: every
        # rank learns at the same step that one of them asked, at no extra collective.
        if workers.exact_gradient_exchange:
            # One collective per step: the scalar sums ride with the gradients.
            flat, total_loss, total_weight, asked = workers.reduce_gradients(
                [flat, loss_sum, weight_sum, requests]
            )
            flat = flat / tf.maximum(total_weight, EPS)
            return [total_loss / tf.maximum(total_weight, EPS), asked, flat]
        # fp16 compression or Adasum: the sums stay exact and uncompressed (a weight sum can
        # exceed float16's range), the gradients are normalised before the exchange, and
        # reduced variable by variable (Adasum's combination depends on the split).
        total_loss, total_weight, asked = workers.reduce_sum([loss_sum, weight_sum, requests])
        norm = weight_sum if workers.adaptive_reduction else total_weight
        grads = [g / tf.maximum(norm, EPS) for g in self.split_gradients(flat)]
        flat = _flatten(workers.reduce_gradients(grads))
        return [total_loss / tf.maximum(total_weight, EPS), asked, flat]

    def _replica_apply(self, flat):
        grads, state = self.split_gradients(flat), self.state
        optimizer, loss_scale, variables = state.optimizer, state.loss_scale, state.variables
        lr = optimizer.learning_rate()
        if loss_scale is None:
            return [optimizer.apply(list(grads), variables), lr]
        # float16: a step whose gradients overflowed is skipped (reported with norm 0) and the
        # loss scale lowered; every replica sees the same reduced gradients, so all skip alike.
        finite = loss_scale.update(grads)
        norm = tf.cond(finite, lambda: optimizer.apply(list(grads), variables), lambda: 0.0)
        return [norm, lr]

    def _eval_batch(self, graphs, labels):
        tc = self.config.train
        logits = self.state.model(graphs)
        per_edge, weights = weighted_bce_per_edge(logits, labels, tc.true_weight, tc.fake_weight)
        return tf.sigmoid(logits[-1]), per_edge, weights

    # ----------------------------------------------------------------------------- running
    def run(
        self, batches: Iterator[list[tuple[Any, tf.Tensor]]], stop=False, checkpoint=False
    ) -> StepTimes:
        """Runs one optimizer step on the next batches of ``batches`` (one per pass), timed.

        ``stop`` / ``checkpoint``: this process asks every rank to stop / to save after this
        step; the step's exchange tells every rank (``StepTimes.stop``, ``.checkpoint``), so
        that all act after the same step.

        Each part ends with a host read of a scalar it produced, so its time is its own (on
        CPU a compiled call returns when done; on GPU the read waits for the device).
        """
        passes = self.config.distributed.backward_passes_per_step
        data_s = compute_s = 0.0
        start = done = time.perf_counter()
        for p in range(passes):
            flat = [x for pair in next(batches) for x in pair]
            fed = time.perf_counter()
            data_s += fed - done
            if p < passes - 1:
                _ = [float(out) for out in self._accumulate(*flat)]
            else:
                terms = self._local(*flat)
                float(terms[0][0])
            done = time.perf_counter()
            compute_s += done - fed
        reduced = self._exchange(*_exchange_inputs(terms, [float(stop), float(checkpoint)]))
        loss, asked = float(reduced[0][0]), reduced[0][1].numpy()
        exchanged = time.perf_counter()
        norm, lr = self._apply(*[x for replica in reduced for x in replica[2:]])[0]
        norm, lr = float(norm), float(lr)
        end = time.perf_counter()
        return StepTimes(
            loss=loss,
            grad_norm=norm,
            learning_rate=lr,
            stop=bool(asked[0] > 0),
            checkpoint=bool(asked[1] > 0),
            data_s=data_s,
            compute_s=compute_s + (end - exchanged),
            exchange_s=exchanged - done,
            total_s=end - start,
        )

    def gradients(self, batches: list[tuple[Any, tf.Tensor]]) -> tuple[float, list[np.ndarray]]:
        """The reduced (global mean) gradients for one step's batches, without applying them.

        ``batches`` holds one (GraphsTuple, labels) pair per local replica. Used by the
        equivalence tests; the training step runs exactly the same local and exchange parts.
        """
        terms = self._local(*[t for pair in batches for t in pair])
        reduced = self._exchange(*_exchange_inputs(terms, [0.0] * len(REQUESTS)))[0]
        return float(reduced[0]), [g.numpy() for g in self.split_gradients(reduced[2])]

    def split_gradients(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """The gradients per variable (``state.variables``' shapes) in the flat vector that the
        step's parts pass on."""
        parts = tf.split(flat, self._sizes)
        return [tf.reshape(p, v.shape) for p, v in zip(parts, self.state.variables)]

    def evaluate(self, batches: Iterable[tuple[Any, tf.Tensor]], where: str) -> dict[str, float]:
        """Loss and edge metrics over ``batches`` (this process's share of a split), gathered
        from every worker and reduced exactly.

        Raises:
          DataError: no worker had an edge (``where`` names the split).
        """
        tc = self.config.train
        columns = []
        for graphs, labels in batches:
            scores, per_edge, weights = self._eval(graphs, labels)
            columns.append(
                np.stack(
                    [scores.numpy(), labels.numpy(), per_edge.numpy(), weights.numpy()], axis=1
                )
            )
        local = np.concatenate(columns) if columns else np.zeros((0, 4), np.float32)
        gathered = self.workers.allgather_host(local).astype(np.float64)
        if gathered.shape[0] == 0:
            raise DataError(f"{where} holds no edges to validate on")
        result = metrics_lib.edge_metrics(gathered[:, 0], gathered[:, 1], tc.thresholds)
        result["loss"] = float(gathered[:, 2].sum() / max(gathered[:, 3].sum(), EPS))
        return result


def _flatten(grads: list[tf.Tensor]) -> tf.Tensor:
    """The gradients as one vector, variable after variable (``TrainStep.split_gradients``)."""
    return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)


def _exchange_inputs(terms, flags: list[float]) -> list:
    """The exchange's inputs: per local replica (loss sum, weight sum, flags, gradient vector)."""
    requests = tf.constant(flags, tf.float32)
    return [x for replica in terms for x in (replica[0], replica[1], requests, *replica[2:])]
