"""The one training loop, for every distribution strategy (local, Horovod, Mirrored, MultiWorker).

Data flow of one run::

    manifest -> balanced epoch plan -> per-worker tf.data -> compiled step (model, loss,
    gradient exchange through ``Workers``, Adam) -> validation reduced over workers ->
    TensorBoard, checkpoints and timing records (chief only).

Public symbols: ``Trainer``, ``train``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config, config_to_dict
from hvdtrack.errors import ConfigError, DataError, TrainingError
from hvdtrack.inputs import pipeline
from hvdtrack.inputs.balance import EpochPlan
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.loss import weighted_bce_per_edge, weighted_bce_terms
from hvdtrack.records.manifest import open_dataset
from hvdtrack.scaling import timing
from hvdtrack.scaling.energy import EnergyMeter
from hvdtrack.train import metrics as metrics_lib
from hvdtrack.train import rundir
from hvdtrack.train.distribute import Workers, make_workers
from hvdtrack.train.optimizer import Adam, Schedule, scaled_learning_rate

EPS = 1e-12


@dataclasses.dataclass
class StepTiming:
    """Wall-clock split of one step on one worker, in seconds."""

    data_s: float
    compute_s: float
    total_s: float


class Trainer:
    """Builds the model, optimizer and compiled steps for one run; ``fit`` trains it.

    Args:
      config: the resolved run configuration.
      workers: the distribution seam (made from ``config.distributed`` if not given).
    """

    def __init__(self, config: Config, workers: Workers | None = None):
        self.config = config
        self.workers = workers or make_workers(config.distributed)
        self.dataset_dir = Path(config.data.dataset_dir)
        self.manifest = open_dataset(self.dataset_dir, verify=config.train.verify_checksums)
        table = self.manifest.split_table("train", str(self.dataset_dir))
        self.train_edges = np.asarray(table.num_edges)
        tc, dc = config.train, config.distributed
        self.global_batch = (
            tc.batch_graphs * self.workers.num_replicas * dc.backward_passes_per_step
        )
        first_plan = self.plan(0)
        self.steps_per_epoch = first_plan.num_steps // dc.backward_passes_per_step
        if tc.max_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, tc.max_steps_per_epoch)
        if self.steps_per_epoch < 1:
            raise DataError(
                f"{self.dataset_dir}: {len(self.train_edges)} training graphs give no full step of "
                f"{self.global_batch} graphs ({tc.batch_graphs} per worker x "
                f"{self.workers.num_replicas} workers x {dc.backward_passes_per_step} passes); "
                "prepare more events or lower train.batch_graphs"
            )
        self.learning_rate = scaled_learning_rate(
            tc.learning_rate, self.workers.num_replicas, tc.lr_scaling
        )
        schedule = Schedule(
            peak=self.learning_rate,
            warmup_steps=int(round(tc.warmup_epochs * self.steps_per_epoch)),
            total_steps=tc.epochs * self.steps_per_epoch,
            decay=tc.decay,
            decay_rate=tc.decay_rate,
            min_fraction=tc.min_learning_rate_fraction,
            warmup_start_divisor=float(self.workers.num_replicas)
            if tc.lr_scaling != "none"
            else 1.0,
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
            self.variables = list(self.model.trainable_variables)
            self.optimizer.build(self.variables)
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
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
        )
        self._build_steps()

    # ----------------------------------------------------------------------------- planning
    def plan(self, epoch: int) -> EpochPlan:
        """The balanced assignment of training graphs to workers and steps for ``epoch``.

        Identical on every worker (a function of the seed and the epoch); every worker runs the
        same number of steps, so no collective waits on a worker that ran out of data.
        """
        return pipeline.plan_train_epoch(
            self.manifest,
            self.workers.num_replicas,
            self.config.train.batch_graphs,
            self.config.train.seed,
            epoch,
            dataset=str(self.dataset_dir),
        )

    # ----------------------------------------------------------------------------- compiled steps
    def _build_steps(self) -> None:
        tc = self.config.train
        signature = [self.graph_spec, self.label_spec] * self.workers.local_replicas
        workers, model, variables = self.workers, self.model, self.variables

        def local_terms(graphs, labels):
            with tf.GradientTape() as tape:
                logits = model(graphs)
                loss_sum, weight_sum = weighted_bce_terms(
                    logits, labels, tc.true_weight, tc.fake_weight
                )
            grads = tape.gradient(loss_sum, variables)
            # Sonnet-style optimizers expect every variable: no gradient means a zero update.
            grads = [
                tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, variables)
            ]
            return loss_sum, weight_sum, grads

        def reduced(loss_sum, weight_sum, grads):
            # Exact global mean over edges: sums of (gradient of the loss sum, loss sum, weight)
            # over all replicas, divided once, so 2 workers x b graphs == 1 worker x 2b graphs.
            if workers.exact_gradient_exchange:
                # One collective per step: the scalar sums ride with the gradients.
                *grads, total_loss, total_weight = workers.reduce_gradients(
                    [*grads, loss_sum, weight_sum]
                )
                grads = [g / tf.maximum(total_weight, EPS) for g in grads]
                return total_loss / tf.maximum(total_weight, EPS), grads
            # fp16 compression or Adasum: the sums stay exact and uncompressed (a weight sum can
            # exceed float16's range), the gradients are normalised before the exchange.
            total_loss, total_weight = workers.reduce_sum([loss_sum, weight_sum])
            norm = weight_sum if workers.adaptive_reduction else total_weight
            grads = workers.reduce_gradients([g / tf.maximum(norm, EPS) for g in grads])
            return total_loss / tf.maximum(total_weight, EPS), grads

        def with_accumulated(loss_sum, weight_sum, grads):
            if not self.accumulators:
                return loss_sum, weight_sum, grads
            acc = [a.read_value() for a in self.accumulators]
            for a in self.accumulators:
                a.assign(tf.zeros_like(a))
            grads = [g + a for g, a in zip(grads, acc[:-2])]
            return loss_sum + acc[-2], weight_sum + acc[-1], grads

        def replica_step(graphs, labels):
            loss, grads = reduced(*with_accumulated(*local_terms(graphs, labels)))
            lr = self.optimizer.learning_rate()
            norm = self.optimizer.apply(grads, variables)
            return {"loss": loss, "grad_norm": norm, "learning_rate": lr}

        def replica_accumulate(graphs, labels):
            loss_sum, weight_sum, grads = local_terms(graphs, labels)
            for a, value in zip(self.accumulators, grads + [loss_sum, weight_sum]):
                a.assign_add(value)
            return {"local_loss": loss_sum / tf.maximum(weight_sum, EPS)}

        def replica_gradients(graphs, labels):
            loss, grads = reduced(*local_terms(graphs, labels))
            return {"loss": loss, "grads": grads}

        def pairs(flat):
            return [tuple(flat[i : i + 2]) for i in range(0, len(flat), 2)]

        self._train_step = tf.function(
            lambda *flat: workers.run(replica_step, pairs(flat)), input_signature=signature
        )
        self._accumulate_step = tf.function(
            lambda *flat: workers.run(replica_accumulate, pairs(flat)), input_signature=signature
        )
        self._gradients = tf.function(
            lambda *flat: workers.run(replica_gradients, pairs(flat)), input_signature=signature
        )

        @tf.function(input_signature=[self.graph_spec, self.label_spec])
        def eval_step(graphs, labels):
            logits = model(graphs)
            per_edge, weights = weighted_bce_per_edge(
                logits, labels, tc.true_weight, tc.fake_weight
            )
            return tf.sigmoid(logits[-1]), per_edge, weights

        self._eval_step = eval_step

    def gradients(self, batches: list[tuple[Any, tf.Tensor]]) -> tuple[float, list[np.ndarray]]:
        """The reduced (global mean) gradients for one step's batches, without applying them.

        ``batches`` holds one (GraphsTuple, labels) pair per local replica. Used by the
        equivalence tests; the training step runs exactly the same reduction.
        """
        out = self._gradients(*[t for pair in batches for t in pair])[0]
        return float(out["loss"]), [g.numpy() for g in out["grads"]]

    def trace_count(self) -> int:
        """How many times the training step was traced (1 once it has run: one compiled graph)."""
        return self._train_step.experimental_get_tracing_count()

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
    def restore(self, directory: Path | None) -> str | None:
        """Restores the newest checkpoint under ``directory`` (None: none), then makes every
        replica hold rank 0's values; returns the checkpoint's path or None."""
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
        self.workers.broadcast_variables(
            self.variables + self.optimizer.m + self.optimizer.v + [self.optimizer.step]
        )
        return latest

    def batches(self, epoch: int, first_step: int) -> Iterator[list[tuple[Any, tf.Tensor]]]:
        """Yields, per step, one (graphs, labels) batch per local replica, in plan order."""
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
        iterators = [iter(d) for d in datasets]
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            for _ in range(limit):
                yield [next(it) for it in iterators]
            # Run each pipeline to its end: an iterator dropped while its prefetch is in flight
            # can stall for seconds in its destructor (seen under Horovod on 2 cores).
            for it in iterators:
                for _ in it:
                    pass

    def fit(self) -> dict[str, Any]:
        """Trains for ``train.epochs`` epochs (resuming if a checkpoint exists); returns run info."""
        return _Fit(self).run()


class _Fit:
    """One call of ``Trainer.fit``: the epoch/step loop with its logging and checkpointing."""

    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.cfg = trainer.config
        self.workers = trainer.workers
        self.run_dir = Path(self.cfg.train.run_dir)
        self.chief = self.workers.is_chief
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.best_dir = self.run_dir / "best"
        self.steps: list[timing.StepRecord] = []
        self.epochs: list[timing.EpochRecord] = []
        self.prior_steps: list[timing.StepRecord] = []  # resumed run: all ranks' earlier records
        self.prior_epochs: list[timing.EpochRecord] = []
        self.graphs_done = 0
        self.edges_done = 0

    # -- bookkeeping -------------------------------------------------------------------
    def _info(self, status: str, metrics: dict[str, float] | None, energy=None) -> dict[str, Any]:
        cfg_dict = config_to_dict(self.cfg)
        hashed = json.loads(json.dumps(cfg_dict))
        hashed["train"].pop("run_dir", None)
        info = {
            "config_name": self.cfg.name,
            "config_hash": hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[
                :16
            ],
            **self.workers.describe(),
            "batch_graphs": self.cfg.train.batch_graphs,
            "global_batch_graphs": self.t.global_batch,
            "learning_rate": self.t.learning_rate,
            "epochs": self.cfg.train.epochs,
            "steps_per_epoch": self.t.steps_per_epoch,
            # max/mean edges per worker per step, mean over the steps of the first epoch's plan
            "edge_imbalance": self.t.plan(0).mean_imbalance,
            "status": status,
            "started": self.started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S") if status != "running" else None,
            "host": rundir.hostname(),
            "device_kind": self.cfg.scaling.device_kind,
            "num_params": int(sum(np.prod(v.shape) for v in self.t.variables)),
            "gradient_bytes": int(sum(np.prod(v.shape) * v.dtype.size for v in self.t.variables)),
            "graphs_processed": self.graphs_done,
            "edges_processed": self.edges_done,
            "metrics": metrics or {},
            "config": cfg_dict,
        }
        if energy is not None:
            info["energy"] = energy
        return info

    def _gather(self, records: list, cls: type) -> list:
        """``records`` (dataclasses) of every rank, concatenated in rank order, on every rank."""
        payload = np.frombuffer(
            json.dumps([dataclasses.asdict(r) for r in records]).encode(), np.uint8
        )
        sizes = self.workers.allgather_host(np.array([payload.size], np.int64))
        joined = self.workers.allgather_host(payload).tobytes()
        out, start = [], 0
        for size in sizes:
            out += [cls(**d) for d in json.loads(joined[start : start + int(size)])]
            start += int(size)
        return out

    def _gather_records(self) -> tuple[list, list]:
        """Step and epoch records of every rank (those of earlier invocations first)."""
        # Every rank runs the same steps, so every rank reaches these collectives.
        self.prior_steps += self._gather(self.steps, timing.StepRecord)
        self.prior_epochs += self._gather(self.epochs, timing.EpochRecord)
        self.steps, self.epochs = [], []
        return self.prior_steps, self.prior_epochs

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t, cfg, workers = self.t, self.cfg, self.workers
        tc = cfg.train
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")
        if self.chief:
            rundir.prepare(self.run_dir, cfg)
        workers.barrier()
        manager = tf.train.CheckpointManager(
            t.checkpoint, str(self.ckpt_dir), max_to_keep=tc.keep_checkpoints
        )
        best = tf.train.CheckpointManager(t.checkpoint, str(self.best_dir), max_to_keep=1)
        previous = (
            timing.read_run(self.run_dir)
            if tc.resume and (self.run_dir / "run.json").exists()
            else None
        )
        restored = t.restore(self.ckpt_dir if tc.resume else None)
        if restored and previous is not None:
            self.prior_steps, self.prior_epochs = list(previous.steps), list(previous.epochs)
            self.graphs_done = int(previous.info.get("graphs_processed", 0))
            self.edges_done = int(previous.info.get("edges_processed", 0))
        start_epoch, start_step = int(t.epoch.numpy()), int(t.step_in_epoch.numpy())
        if start_epoch >= tc.epochs:
            return self._info("finished", previous.info.get("metrics") if previous else None)
        writer = (
            tf.summary.create_file_writer(str(self.run_dir / "tensorboard"))
            if self.chief
            else tf.summary.create_noop_writer()
        )
        if self.chief and not restored:
            rundir.write_hparams(writer, cfg, workers.num_replicas, t.global_batch)
            print(
                f"[hvdtrack] {workers.name}: {workers.num_replicas} workers, global batch "
                f"{t.global_batch} graphs, learning rate {t.learning_rate:.3g} "
                f"({tc.lr_scaling} scaling of {tc.learning_rate:g}), {t.steps_per_epoch} steps/epoch, "
                f"edge imbalance max/mean per step {t.plan(start_epoch).mean_imbalance:.3f}",
                flush=True,
            )
        meter = EnergyMeter(
            cfg.scaling,
            devices=workers.local_replicas,
            local_rank=workers.local_rank,
            local_size=workers.local_size,
        )
        meter.start()
        # The best checkpoint so far, also across an interruption.
        best_loss = min((e.val["loss"] for e in self.prior_epochs if e.val), default=math.inf)
        val_metrics: dict[str, float] = {}
        warmup = cfg.scaling.timing_warmup_steps
        global_step = start_epoch * t.steps_per_epoch + start_step
        stop_at = global_step + tc.stop_after_steps if tc.stop_after_steps else None
        stopped = False
        passes = cfg.distributed.backward_passes_per_step
        try:
            for epoch in range(start_epoch, tc.epochs):
                plan = t.plan(epoch)
                first = start_step if epoch == start_epoch else 0
                epoch_start = time.perf_counter()
                losses, epoch_graphs, epoch_edges, my_epoch_graphs, my_epoch_edges = [], 0, 0, 0, 0
                bar = rundir.progress(
                    self.chief and tc.progress_bar, t.steps_per_epoch, first, epoch
                )
                batches = t.batches(epoch, first)
                for step in range(first, t.steps_per_epoch):
                    if tc.profile_steps and self.chief and global_step == tc.profile_steps[0]:
                        tf.profiler.experimental.start(str(self.run_dir / "tensorboard"))
                    step_start = time.perf_counter()
                    data_s = compute_s = 0.0
                    for p in range(passes):
                        tick = time.perf_counter()
                        step_batches = next(batches)
                        tock = time.perf_counter()
                        flat = [x for pair in step_batches for x in pair]
                        if p < passes - 1:
                            t._accumulate_step(*flat)
                        else:
                            out = t._train_step(*flat)[0]
                            loss = float(out["loss"])  # also the host sync of this step
                        data_s += tock - tick
                        compute_s += time.perf_counter() - tock
                    total_s = time.perf_counter() - step_start
                    if not math.isfinite(loss):
                        raise TrainingError(
                            f"the training loss is {loss} at epoch {epoch} step {step} (global step "
                            f"{global_step}); stopped without saving. Last good checkpoint: "
                            f"{manager.latest_checkpoint or 'none'}. Lower train.learning_rate or set "
                            "train.grad_clip_norm"
                        )
                    plan_steps = slice(step * passes, (step + 1) * passes)
                    my_graphs = tc.batch_graphs * passes * workers.local_replicas
                    my_edges = int(plan.edges[plan_steps][:, workers.replica_ids].sum())
                    step_graphs = t.global_batch
                    step_edges = int(plan.edges[plan_steps].sum())
                    self.steps.append(
                        timing.StepRecord(
                            epoch=epoch,
                            step=step,
                            rank=workers.rank,
                            data_s=data_s,
                            compute_s=compute_s,
                            exchange_s=None,
                            total_s=total_s,
                            graphs=my_graphs,
                            edges=my_edges,
                            warmup=(step - first) < warmup,
                        )
                    )
                    losses.append(loss)
                    epoch_graphs += step_graphs
                    epoch_edges += step_edges
                    my_epoch_graphs += my_graphs
                    my_epoch_edges += my_edges
                    global_step += 1
                    if self.chief and global_step % tc.log_every_steps == 0:
                        with writer.as_default(step=global_step):
                            tf.summary.scalar("train/loss", loss)
                            tf.summary.scalar("train/learning_rate", float(out["learning_rate"]))
                            tf.summary.scalar("train/grad_norm", float(out["grad_norm"]))
                            tf.summary.scalar("throughput/graphs_per_s", step_graphs / total_s)
                            tf.summary.scalar("throughput/edges_per_s", step_edges / total_s)
                            tf.summary.scalar(
                                "throughput/edges_per_s_per_worker",
                                step_edges / total_s / workers.num_replicas,
                            )
                            tf.summary.scalar("time/step_s", total_s)
                            tf.summary.scalar("time/data_wait_s", data_s)
                            tf.summary.scalar(
                                "balance/edge_imbalance",
                                float(plan.step_imbalance[plan_steps].max()),
                            )
                    if tc.profile_steps and self.chief and global_step == tc.profile_steps[1]:
                        tf.profiler.experimental.stop()
                    bar.update(loss, step_edges / total_s)
                    t.step_in_epoch.assign(step + 1)
                    if tc.checkpoint_every_steps and global_step % tc.checkpoint_every_steps == 0:
                        self._save(manager, epoch, step + 1)
                    if (
                        stop_at is not None
                        and global_step >= stop_at
                        and step + 1 < t.steps_per_epoch
                    ):
                        self._save(manager, epoch, step + 1)
                        stopped = True
                        break
                if stopped:
                    bar.close()
                    break
                for _ in batches:  # lets the epoch's pipelines finish cleanly
                    pass
                bar.close()
                epoch_s = time.perf_counter() - epoch_start
                self.graphs_done += epoch_graphs
                self.edges_done += epoch_edges
                t.epoch.assign(epoch + 1)
                t.step_in_epoch.assign(0)
                if (epoch + 1) % tc.validate_every_epochs == 0 or epoch + 1 == tc.epochs:
                    val_metrics = t.evaluate("val")
                self.epochs.append(
                    timing.EpochRecord(
                        epoch=epoch,
                        rank=workers.rank,
                        time_s=epoch_s,
                        steps=t.steps_per_epoch - first,
                        graphs=my_epoch_graphs,  # this rank's share; ranks add up
                        edges=my_epoch_edges,
                        train_loss=float(np.mean(losses)) if losses else float("nan"),
                        val=dict(val_metrics) if val_metrics else None,
                    )
                )
                self._save(manager, epoch + 1, 0)
                if val_metrics and val_metrics["loss"] < best_loss:
                    best_loss = val_metrics["loss"]
                    if self.chief:
                        best.save(checkpoint_number=epoch + 1)
                if self.chief:
                    with writer.as_default(step=global_step):
                        tf.summary.scalar("time/epoch_s", epoch_s)
                        tf.summary.scalar("throughput/epoch_edges_per_s", epoch_edges / epoch_s)
                        tf.summary.scalar("balance/epoch_edge_imbalance", plan.mean_imbalance)
                        for key, value in val_metrics.items():
                            if key != "num_edges":
                                tf.summary.scalar(f"val/{key}", value)
                    writer.flush()
                    print(
                        rundir.epoch_line(epoch, tc.epochs, epoch_s, losses, val_metrics),
                        flush=True,
                    )
                steps, epochs = self._gather_records()
                if self.chief:
                    timing.write_run(
                        self.run_dir, self._info("running", val_metrics), steps, epochs
                    )
                if stop_at is not None and global_step >= stop_at and epoch + 1 < tc.epochs:
                    stopped = True
                    break
        except BaseException:
            # No collective here: another rank may already be gone. Rank 0 keeps its own records.
            steps, epochs = self.prior_steps + self.steps, self.prior_epochs + self.epochs
            if self.chief:
                timing.write_run(self.run_dir, self._info("failed", val_metrics), steps, epochs)
            raise
        reading = meter.stop()
        energy = dataclasses.asdict(reading)
        energy["joules"] = float(workers.allreduce_host(np.array([reading.joules]))[0])
        steps, epochs = self._gather_records()
        info = self._info("stopped" if stopped else "finished", val_metrics, energy)
        if self.chief:
            timing.write_run(self.run_dir, info, steps, epochs)
            note = " (stopped: run the same command again to resume)" if stopped else ""
            print(f"[hvdtrack] run directory: {self.run_dir}{note}", flush=True)
        writer.close()
        return info

    def _save(self, manager: tf.train.CheckpointManager, epoch: int, step: int) -> None:
        self.t.epoch.assign(epoch)
        self.t.step_in_epoch.assign(step)
        if self.chief:
            manager.save(checkpoint_number=epoch * self.t.steps_per_epoch + step)
        self.workers.barrier()


def train(config: Config) -> dict[str, Any]:
    """Trains one run as configured; returns the run info written to ``run.json``."""
    trainer = Trainer(config)
    try:
        return trainer.fit()
    finally:
        trainer.workers.shutdown()
