"""The ``train:`` and ``distributed:`` sections of a run configuration."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from hvdtrack.configtools import check
from hvdtrack.inputs.subgraphs import SubgraphConfig
from hvdtrack.train.pipeline import PipelineConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How one training run proceeds (the same on every worker).

    ``batch_graphs`` is per worker (per replica) and per step; the global batch is
    ``batch_graphs * num_workers * backward_passes_per_step``.

    ``subgraphs`` (``hvdtrack.inputs.subgraphs.SubgraphConfig``) switches training to subgraph
    mini-batches: seed edges with their k-hop neighbourhoods, the loss on the seeds only;
    validation stays on whole graphs.

    ``stop_after_steps`` ends this invocation after that many optimizer steps with a checkpoint
    (status "stopped"), e.g. to fit a batch job's time limit; running the same command again
    resumes exactly where it stopped. A resume is refused before anything is written when the
    run was trained with other settings (model, optimiser, data, batch...; the key is named),
    on another dataset, or with another worker count inside an epoch;
    ``allow_changed_config`` lets the first two pass.

    Checkpoints are saved at every epoch end, every ``checkpoint_every_steps`` steps, and
    ``checkpoint_every_minutes`` after the last save (the chief's clock; every rank saves at
    the same step), so that a killed or preempted job loses at most that much work.

    ``progress_bar``: the chief shows progress; on a terminal as a bar, otherwise (SLURM,
    horovodrun, CI logs) as one plain line every ``progress_interval_s`` seconds.
    """

    run_dir: str = "runs/default"
    epochs: int = 10
    batch_graphs: int = 1
    max_steps_per_epoch: Optional[int] = None
    learning_rate: float = 1e-3
    lr_scaling: Literal["none", "linear", "sqrt"] = "sqrt"
    warmup_epochs: float = 1.0
    decay: Literal["none", "cosine", "exponential"] = "cosine"
    decay_rate: float = 0.1
    min_learning_rate_fraction: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    grad_clip_norm: Optional[float] = None
    true_weight: float = 2.0
    fake_weight: float = 1.0
    thresholds: tuple[float, ...] = (0.5,)
    seed: int = 1
    checkpoint_every_steps: Optional[int] = None
    checkpoint_every_minutes: Optional[float] = 10.0
    stop_after_steps: Optional[int] = None
    keep_checkpoints: int = 3
    resume: bool = True
    allow_changed_config: bool = False
    validate_every_epochs: int = 1
    log_every_steps: int = 10
    profile_steps: Optional[tuple[int, int]] = None
    progress_bar: bool = True
    progress_interval_s: float = 30.0
    verify_checksums: bool = True
    subgraphs: SubgraphConfig = dataclasses.field(default_factory=SubgraphConfig)

    def __post_init__(self):
        check(self.epochs >= 1, "epochs", "must be >= 1")
        check(self.batch_graphs >= 1, "batch_graphs", "must be >= 1")
        check(
            self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1,
            "max_steps_per_epoch",
            "must be >= 1 or null",
        )
        check(self.learning_rate > 0, "learning_rate", "must be > 0")
        check(self.warmup_epochs >= 0, "warmup_epochs", "must be >= 0")
        check(0 < self.decay_rate <= 1, "decay_rate", "must be in (0, 1]")
        check(
            0 <= self.min_learning_rate_fraction <= 1,
            "min_learning_rate_fraction",
            "must be in [0, 1]",
        )
        check(
            0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1,
            "adam_beta1",
            "betas must be in [0, 1)",
        )
        check(
            self.grad_clip_norm is None or self.grad_clip_norm > 0,
            "grad_clip_norm",
            "must be > 0 or null",
        )
        check(
            self.true_weight > 0 and self.fake_weight > 0,
            "true_weight",
            "class weights must be > 0",
        )
        check(len(self.thresholds) >= 1, "thresholds", "needs at least one threshold")
        check(
            all(0 < t < 1 for t in self.thresholds),
            "thresholds",
            "must lie strictly between 0 and 1",
        )
        check(
            self.checkpoint_every_steps is None or self.checkpoint_every_steps >= 1,
            "checkpoint_every_steps",
            "must be >= 1 or null",
        )
        check(
            self.stop_after_steps is None or self.stop_after_steps >= 1,
            "stop_after_steps",
            "must be >= 1 or null",
        )
        check(
            self.checkpoint_every_minutes is None or self.checkpoint_every_minutes > 0,
            "checkpoint_every_minutes",
            "must be > 0 or null",
        )
        check(self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
        check(self.validate_every_epochs >= 1, "validate_every_epochs", "must be >= 1")
        check(self.log_every_steps >= 1, "log_every_steps", "must be >= 1")
        check(self.progress_interval_s > 0, "progress_interval_s", "must be > 0")
        check(
            self.profile_steps is None or 0 <= self.profile_steps[0] < self.profile_steps[1],
            "profile_steps",
            "must be [first, last) with 0 <= first < last",
        )


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Which distribution strategy runs the one training loop, and its options.

    strategy:
      local: one process, no communication.
      horovod: one process per worker, launched by horovodrun / mpirun / srun (Gloo or MPI).
      mirrored: tf.distribute.MirroredStrategy over the local devices (GPUs, or
        ``num_cpu_devices`` logical CPU devices).
      multiworker: tf.distribute.MultiWorkerMirroredStrategy, one process per host
        (TF_CONFIG, or SLURM's environment).

    ``horovod_cycle_time_ms`` sets Horovod's background-loop period (HOROVOD_CYCLE_TIME). On CPU
    nodes where ranks fill every core, a longer cycle leaves more CPU to compute (here, 2 ranks
    on 2 cores: 20 ms made a 1-graph step 0.59 s instead of 0.72 s); each collective may then wait
    up to one cycle, so keep it short on GPUs.

    ``deadline_s``: a rank that dies or stops answering ends the whole job, with an error naming
    it, within about this many seconds (MultiWorker: the workers still running exit). Under
    Horovod (horovodrun with Gloo or MPI, mpirun, srun) every rank exchanges heartbeats with
    rank 0 beside the collectives (``hvdtrack.train.watchdog``): a closed connection ends the job
    at once, a silence of ``deadline_s`` at the deadline. Horovod's stall shutdown ends a job
    whose rank is alive but has not joined a collective for ``deadline_s`` (hung, deadlocked),
    and Gloo's timeout is 1.5 deadlines. MultiWorker: the coordination service's heartbeat
    timeout. Legitimate waits must stay shorter than the stall shutdown: the longest seen is
    tracing with 8 ranks on 2 cores (25 s); a checkpoint write of these models takes
    milliseconds. null waits for ever.

    ``pin_cores``: on CPU, each Horovod rank (or MultiWorker worker: its index among the
    cluster's workers on its host) binds itself to its own slice of the cores this host's ranks
    may use (local rank r of n gets cores [r*k, (r+1)*k), k = cores // n) and runs
    ``threads_per_worker`` threads there, so ranks never share a core. Left alone when a
    launcher already bound the process (srun --cpu-bind, mpirun --bind-to), with GPUs, or when
    ranks outnumber cores.

    ``pipeline`` (``hvdtrack.train.pipeline.PipelineConfig``): each worker runs the model as
    ``stages`` pipeline stages over ``micro_batches`` micro-batches (1: no pipeline).
    """

    strategy: Literal["local", "horovod", "mirrored", "multiworker"] = "local"
    compression: Literal["none", "fp16"] = "none"
    reduce_op: Literal["sum", "adasum"] = "sum"
    backward_passes_per_step: int = 1
    threads_per_worker: Optional[int] = None
    num_cpu_devices: int = 2
    horovod_cycle_time_ms: Optional[float] = None
    deadline_s: Optional[float] = 60.0
    pin_cores: bool = True
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)

    def __post_init__(self):
        check(self.backward_passes_per_step >= 1, "backward_passes_per_step", "must be >= 1")
        check(
            self.threads_per_worker is None or self.threads_per_worker >= 1,
            "threads_per_worker",
            "must be >= 1 or null",
        )
        check(self.num_cpu_devices >= 1, "num_cpu_devices", "must be >= 1")
        check(
            self.deadline_s is None or self.deadline_s >= 10,
            "deadline_s",
            "must be >= 10 seconds or null (wait for ever)",
        )
        check(
            self.horovod_cycle_time_ms is None or self.horovod_cycle_time_ms > 0,
            "horovod_cycle_time_ms",
            "must be > 0 or null (Horovod's default)",
        )
        check(
            self.reduce_op == "sum" or self.strategy == "horovod",
            "reduce_op",
            "adasum is a Horovod operation: set distributed.strategy=horovod",
        )
        check(
            self.compression == "none" or self.strategy == "horovod",
            "compression",
            "fp16 compression is a Horovod option: set distributed.strategy=horovod",
        )
