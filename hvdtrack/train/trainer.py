"""The trainer: model, optimizer and the compiled training step of one run, timed part by part.

One optimizer step is three compiled functions, so the host can time each part on its own:

    local (forward + backward of every pass, graphs -> gradient sums; with
       ``distributed.stages``, through ``distributed.stages.StagedClassifier``)
    -> exchange (gradients and loss sums summed over all replicas: one collective, two with
       fp16 compression or Adasum)
    -> apply (Adam update with clipping).

Each is traced once (input signatures with dynamic sizes). ``Trainer.step`` runs them and
returns a ``StepTimes``: data wait, compute (local + apply) and exchange, which includes any
wait for slower ranks. The epoch loop is ``hvdtrack.train.loop``.

Public symbols: ``Trainer``, ``StepTimes``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed.stages import StagedClassifier, make_stage_devices, stage_devices
from hvdtrack.distributed.workers import Workers, make_workers
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.inputs import pipeline
from hvdtrack.inputs.balance import EpochPlan
from hvdtrack.model import metrics as metrics_lib
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.loss import weighted_bce_per_edge, weighted_bce_terms
from hvdtrack.model.precision import cpu_flags, unsupported_reason
from hvdtrack.records.manifest import MANIFEST_NAME, open_dataset
from hvdtrack.train.optimizer import Adam, LossScale, Schedule, scaled_learning_rate

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


class Trainer:
    """Builds the model, optimizer and compiled steps for one run; ``fit`` trains it.

    Args:
      config: the resolved run configuration.
      workers: the distribution seam (made from ``config.distributed`` if not given).
      dataset: False builds the model, optimizer and compiled step without opening
        ``config.data.dataset_dir`` (no plan, no pipelines, a constant learning rate at the
        configured peak): ``step`` then runs on batches the caller makes, as ``hvdtrack bench
        model`` does with synthetic graphs.
    """

    def __init__(self, config: Config, workers: Workers | None = None, *, dataset: bool = True):
        self.config = config
        pc = config.distributed.stages
        if pc.num_stages > 1:
            # Logical CPU devices for the stages exist only if made before TensorFlow starts:
            # before the workers, whose Horovod heartbeats start it (configuration only, the
            # workers still set the threads). A process that ran ops already (a test) shares
            # the devices it has; the results are the same.
            make_stage_devices(pc.num_stages)
        self.workers = workers or make_workers(config.distributed)
        stage_device_names = stage_devices(pc.num_stages) if pc.num_stages > 1 else None
        has_gpu = bool(tf.config.list_logical_devices("GPU"))
        reason = unsupported_reason(config.model.precision, has_gpu, cpu_flags())
        if reason:
            raise ConfigError(reason)
        if config.model.recompute:
            # tf.recompute_grad defers each step's recomputation to the backward pass through a
            # data dependency that these grappler passes fold away (the recomputation then runs
            # in the forward pass and the memory is not saved: 638 MB peak instead of 412 MB,
            # 5k nodes / 40k edges). Process-wide: they are off for every function from here on.
            tf.config.optimizer.set_experimental_options(
                {
                    "constant_folding": False,
                    "arithmetic_optimization": False,
                    "dependency_optimization": False,
                }
            )
        self.dataset_dir = Path(config.data.dataset_dir)
        tc, dc = config.train, config.distributed
        self._plan: EpochPlan | None = None
        if dataset:
            # Validation runs at least after the last epoch: an empty val split is refused now.
            self.manifest = open_dataset(
                self.dataset_dir, verify=tc.verify_checksums, required=("train", "val")
            )
            manifest_bytes = (self.dataset_dir / MANIFEST_NAME).read_bytes()
            self.dataset_digest = hashlib.sha256(manifest_bytes).hexdigest()[:16]
            table = self.manifest.split_table("train", str(self.dataset_dir))
            self.train_edges = np.asarray(table.num_edges)
            schedule = self._fit_to_workers()  # steps per epoch, learning rate, ... for the workers
        else:
            workers = self.workers.num_replicas
            self.learning_rate = scaled_learning_rate(tc.learning_rate, workers, tc.lr_scaling)
            schedule = Schedule(
                peak=self.learning_rate, warmup_steps=0, total_steps=1, decay="none"
            )
        self.graph_spec, self.label_spec = pipeline.input_signature()
        # Different initial weights per rank: the broadcast below, not the seed, makes them equal.
        tf.random.set_seed(tc.seed + 1000 * self.workers.rank)
        with self.workers.scope():
            self.model = SegmentClassifier(config.model)
            self.optimizer = Adam(
                schedule, tc.adam_beta1, tc.adam_beta2, tc.adam_epsilon, tc.grad_clip_norm
            )
            self.model(pipeline.placeholder_graph())  # Sonnet creates variables lazily
            # distributed.stages: the training batches run as stages x micro-batches.
            self.stages = (
                StagedClassifier(self.model, pc, stage_device_names) if stage_device_names else None
            )
            self.variables = list(self.model.trainable_variables)
            self.optimizer.build(self.variables)
            # float16 gradients underflow without it (bfloat16 has float32's range).
            self.loss_scale = LossScale() if config.model.precision == "float16" else None
            self.accumulators = (
                [
                    tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="accumulate")
                    for v in self.variables + [tf.constant(0.0), tf.constant(0.0)]
                ]
                if dc.backward_passes_per_step > 1
                else []
            )
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        scaling = dict(loss_scale=self.loss_scale) if self.loss_scale else {}
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
            **scaling,
        )
        self._build_steps()

    def _fit_to_workers(self) -> Schedule:
        """Sets what follows from the worker count (global batch, the epoch plan, steps per
        epoch, learning rate) and returns the learning-rate schedule for it."""
        tc, dc = self.config.train, self.config.distributed
        workers = self.workers.num_replicas
        self.global_batch = tc.batch_graphs * workers * dc.backward_passes_per_step
        self._plan = None
        first_plan = self.plan(0)
        self.edge_imbalance = first_plan.mean_imbalance  # max/mean edges per worker per step
        self.steps_per_epoch = first_plan.num_steps // dc.backward_passes_per_step
        if tc.max_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, tc.max_steps_per_epoch)
        if self.steps_per_epoch < 1:
            raise DataError(
                f"{self.dataset_dir}: {len(self.train_edges)} training graphs give no full step of "
                f"{self.global_batch} graphs ({tc.batch_graphs} per worker x "
                f"{workers} workers x {dc.backward_passes_per_step} passes); "
                "prepare more events or lower train.batch_graphs"
            )
        self.learning_rate = scaled_learning_rate(tc.learning_rate, workers, tc.lr_scaling)
        return Schedule(
            peak=self.learning_rate,
            warmup_steps=int(round(tc.warmup_epochs * self.steps_per_epoch)),
            total_steps=tc.epochs * self.steps_per_epoch,
            decay=tc.decay,
            decay_rate=tc.decay_rate,
            min_fraction=tc.min_learning_rate_fraction,
            warmup_start_divisor=float(workers) if tc.lr_scaling != "none" else 1.0,
        )

    def resize(self) -> bool:
        """Follows a change of the worker count (elastic training) or a state restored from a
        run with another one: re-plans, rescales the learning rate, continues the schedule at
        the epoch position the state holds, and recompiles the step. True when anything changed.
        """
        schedule = self._fit_to_workers()
        position = int(self.epoch.numpy()) * self.steps_per_epoch + int(self.step_in_epoch.numpy())
        schedule = dataclasses.replace(schedule, offset=position - int(self.optimizer.step.numpy()))
        if schedule == self.optimizer.schedule:
            return False
        self.optimizer.schedule = schedule
        self._build_steps()
        self.compile()
        return True

    def state_variables(self) -> list[tf.Variable]:
        """Everything a worker needs to continue the run: weights, Adam, position."""
        scaling = [self.loss_scale.scale, self.loss_scale.finite_steps] if self.loss_scale else []
        return (
            self.variables
            + self.optimizer.m
            + self.optimizer.v
            + [self.optimizer.step, self.epoch, self.step_in_epoch]
            + scaling
        )

    # ----------------------------------------------------------------------------- planning
    def plan(self, epoch: int) -> EpochPlan:
        """The balanced assignment of training graphs to workers and steps for ``epoch``.

        Identical on every worker (a function of the seed and the epoch); every worker runs the
        same number of steps, so no collective waits on a worker that ran out of data. The
        last plan made is kept (the loop asks for the epoch's plan several times).
        """
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = self._make_plan(epoch)
        return self._plan

    def _make_plan(self, epoch: int) -> EpochPlan:
        tc = self.config.train
        return pipeline.plan_train_epoch(
            self.manifest,
            self.workers.num_replicas,
            tc.batch_graphs,
            tc.seed,
            epoch,
            dataset=str(self.dataset_dir),
            # train.subgraphs.enabled: units of seed edges with their neighbourhoods
            subgraphs=tc.subgraphs.sampling(
                self.config.model.num_message_passing_steps, tc.true_weight, tc.fake_weight
            ),
        )

    # ----------------------------------------------------------------------------- compiled steps
    def _build_steps(self) -> None:
        tc, workers, model = self.config.train, self.workers, self.model
        scalar = tf.TensorSpec([], tf.float32)
        grad_specs = [tf.TensorSpec(v.shape, v.dtype) for v in self.variables]

        def compiled(replica_fn, spec):
            # One input tuple per local replica, flattened; outputs: one list per local replica.
            size = len(spec)

            def run(*flat):
                return workers.run(
                    replica_fn, [flat[i : i + size] for i in range(0, len(flat), size)]
                )

            return tf.function(run, input_signature=list(spec) * workers.local_replicas)

        graph_spec = [self.graph_spec, self.label_spec]
        self._local = compiled(self._replica_local, graph_spec)
        self._accumulate = compiled(self._replica_accumulate, graph_spec)
        flags = tf.TensorSpec([len(REQUESTS)], tf.float32)
        self._exchange = compiled(self._replica_exchange, [scalar, scalar, flags, *grad_specs])
        self._apply = compiled(self._replica_apply, grad_specs)

        @tf.function(input_signature=graph_spec)
        def eval_step(graphs, labels):
            logits = model(graphs)
            per_edge, weights = weighted_bce_per_edge(
                logits, labels, tc.true_weight, tc.fake_weight
            )
            return tf.sigmoid(logits[-1]), per_edge, weights

        self._eval_step = eval_step

    def _local_terms(self, graphs, labels):
        """(loss sum, weight sum, gradients of the loss sum) of one replica's batch; through
        the stages and micro-batches of ``distributed.stages`` when it has stages."""
        tc = self.config.train
        if self.stages is not None:  # float32 only (config check): no loss scale
            return self.stages.local_terms(
                graphs, labels, self.variables, tc.true_weight, tc.fake_weight
            )
        scale = self.loss_scale.scale if self.loss_scale else None
        with tf.GradientTape() as tape:
            logits = self.model(graphs)
            loss_sum, weight_sum = weighted_bce_terms(
                logits, labels, tc.true_weight, tc.fake_weight
            )
            target = loss_sum if scale is None else loss_sum * scale
        grads = tape.gradient(target, self.variables)
        if scale is not None:
            grads = [None if g is None else tf.convert_to_tensor(g) / scale for g in grads]
        # Sonnet-style optimizers expect every variable: no gradient means a zero update.
        grads = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, self.variables)
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
        return [loss_sum, weight_sum, *grads]

    def _replica_accumulate(self, graphs, labels):
        loss_sum, weight_sum, grads = self._local_terms(graphs, labels)
        for a, value in zip(self.accumulators, grads + [loss_sum, weight_sum]):
            a.assign_add(value)
        return loss_sum

    def _replica_exchange(self, loss_sum, weight_sum, requests, *grads):
        workers = self.workers
        # Inputs of a compiled function carry no device; collectives of tf.distribute want
        # their values placed on the replica's device (the identity does that, no copy).
        loss_sum, weight_sum, requests, *grads = [
            tf.identity(x) for x in (loss_sum, weight_sum, requests, *grads)
        ]
        # Exact global mean over edges: sums of (gradient of the loss sum, loss sum, weight)
        # over all replicas, divided once, so 2 workers x b graphs == 1 worker x 2b graphs.
        # ``requests`` (1.0 where this rank asks for one of ``REQUESTS``) are summed too: every
        # rank learns at the same step that one of them asked, at no extra collective.
        if workers.exact_gradient_exchange:
            # One collective per step: the scalar sums ride with the gradients.
            *grads, total_loss, total_weight, asked = workers.reduce_gradients(
                [*grads, loss_sum, weight_sum, requests]
            )
            grads = [g / tf.maximum(total_weight, EPS) for g in grads]
            return [total_loss / tf.maximum(total_weight, EPS), asked, *grads]
        # fp16 compression or Adasum: the sums stay exact and uncompressed (a weight sum can
        # exceed float16's range), the gradients are normalised before the exchange.
        total_loss, total_weight, asked = workers.reduce_sum([loss_sum, weight_sum, requests])
        norm = weight_sum if workers.adaptive_reduction else total_weight
        grads = workers.reduce_gradients([g / tf.maximum(norm, EPS) for g in grads])
        return [total_loss / tf.maximum(total_weight, EPS), asked, *grads]

    def _replica_apply(self, *grads):
        lr = self.optimizer.learning_rate()
        if self.loss_scale is None:
            return [self.optimizer.apply(list(grads), self.variables), lr]
        # float16: a step whose gradients overflowed is skipped (reported with norm 0) and the
        # loss scale lowered; every replica sees the same reduced gradients, so all skip alike.
        finite = self.loss_scale.update(grads)
        norm = tf.cond(
            finite, lambda: self.optimizer.apply(list(grads), self.variables), lambda: 0.0
        )
        return [norm, lr]

    def compile(self) -> float:
        """Traces the step's compiled parts now (no op runs), so that no step times a trace;
        returns the seconds it took."""
        start = time.perf_counter()
        parts = [self._local, self._exchange, self._apply]
        if self.accumulators:
            parts.append(self._accumulate)
        for part in parts:
            part.get_concrete_function()
        return time.perf_counter() - start

    def step(
        self,
        batches: Iterator[list[tuple[Any, tf.Tensor]]],
        stop: bool = False,
        checkpoint: bool = False,
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
        flags = tf.constant([float(stop), float(checkpoint)])
        reduced = self._exchange(
            *[x for replica in terms for x in (replica[0], replica[1], flags, *replica[2:])]
        )
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
        flags = tf.zeros([len(REQUESTS)])
        reduced = self._exchange(
            *[x for replica in terms for x in (replica[0], replica[1], flags, *replica[2:])]
        )[0]
        return float(reduced[0]), [g.numpy() for g in reduced[2:]]

    def trace_count(self) -> int:
        """Traces of the step's compiled parts (1 each once it has run: one graph per part)."""
        parts = (self._local, self._exchange, self._apply, self._accumulate)
        return max(f.experimental_get_tracing_count() for f in parts)

    # ----------------------------------------------------------------------------- validation
    def evaluate(self, split: str = "val") -> dict[str, float]:
        """Loss and edge metrics over the whole split, sharded over workers, reduced exactly."""
        tc = self.config.train
        columns = []
        for worker in self.workers.replica_ids:
            data = pipeline.eval_dataset(
                self.dataset_dir,
                self.manifest,
                split,
                worker,
                self.workers.num_replicas,
                tc.batch_graphs,
            )
            for graphs, labels in data:
                scores, per_edge, weights = self._eval_step(graphs, labels)
                columns.append(
                    np.stack(
                        [scores.numpy(), labels.numpy(), per_edge.numpy(), weights.numpy()], axis=1
                    )
                )
        local = np.concatenate(columns) if columns else np.zeros((0, 4), np.float32)
        gathered = self.workers.allgather_host(local).astype(np.float64)
        if gathered.shape[0] == 0:
            raise DataError(f"{self.dataset_dir}: the {split} split holds no edges to validate on")
        result = metrics_lib.edge_metrics(gathered[:, 0], gathered[:, 1], tc.thresholds)
        result["loss"] = float(gathered[:, 2].sum() / max(gathered[:, 3].sum(), EPS))
        return result

    # ----------------------------------------------------------------------------- training
    def restore(self, directory: Path | None, broadcast: bool = True) -> str | None:
        """Restores the newest checkpoint under ``directory`` (None: none), then makes every
        replica hold rank 0's values (unless ``broadcast`` is False: elastic training syncs
        its workers itself); returns the checkpoint's path or None."""
        latest = tf.train.latest_checkpoint(str(directory)) if directory is not None else None
        if latest:
            try:
                self.checkpoint.restore(latest).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as err:
                raise ConfigError(
                    f"checkpoint {latest} does not fit the configured model ({str(err).splitlines()[0]}); "
                    f"it was written with the model settings in {directory.parent / 'config.yaml'}. "
                    "Use another train.run_dir, or train.resume=false to start afresh"
                ) from None
        # Whatever each rank holds now, rank 0's values win (fresh start: the random init).
        # The position to resume from too: a rank that read another checkpoint (a stale
        # shared-filesystem cache) would otherwise run other steps and hang the collectives.
        if broadcast:
            self.workers.broadcast_variables(self.state_variables())
        return latest

    def batches(self, epoch: int, first_step: int) -> Iterator[list[tuple[Any, tf.Tensor]]]:
        """The epoch's pipelines from step ``first_step`` on, built now (so that the time to
        build them is not the first step's data wait); the iterator yields, per pass, one
        (graphs, labels) batch per local replica, in plan order."""
        plan = self.plan(epoch)
        passes = self.config.distributed.backward_passes_per_step
        limit = (self.steps_per_epoch - first_step) * passes
        # Resuming mid-epoch: the plan is the one made before the interruption; skip what ran.
        datasets = [
            pipeline.train_dataset(self.dataset_dir, self.manifest, plan, worker)
            .skip(first_step * passes)
            .take(limit)
            for worker in self.workers.replica_ids
        ]
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            iterators = [iter(d) for d in datasets]
        return self._read(iterators, limit)

    def _read(self, iterators: list, limit: int) -> Iterator[list[tuple[Any, tf.Tensor]]]:
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            for _ in range(limit):
                yield [next(it) for it in iterators]
