"""The ``train:`` section of a run configuration (no TensorFlow: reading a config stays cheap)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from hvdtrack.configtools import check
from hvdtrack.inputs.subgraphs import SubgraphConfig

# Upper bounds, far above real use, so that a typo is refused by name (see TrainConfig).
MAX_EPOCHS = 1_000_000
MAX_BATCH_GRAPHS = 65536
MAX_SORT_WINDOW = 1_000_000
MAX_KEEP_CHECKPOINTS = 1000
MAX_THRESHOLDS = 64


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How one training run proceeds (the same on every worker).

    ``batch_graphs`` is per worker (per replica) and per step; the global batch is
    ``batch_graphs * num_workers * backward_passes_per_step``.

    ``subgraphs`` (``hvdtrack.inputs.subgraphs.SubgraphConfig``) switches training to subgraph
    mini-batches: seed edges with their k-hop neighbourhoods, the loss on the seeds only;
    validation stays on whole graphs.

    ``sort_window``: the epoch's shuffled graphs are taken this many steps at a time, sorted by
    cost (edges, and nodes weighted by the model's FLOPs per node against per edge) and cut
    into steps again, in a random order: a step's graphs are of similar size, so the workers of
    a synchronous step finish together (``hvdtrack.inputs.balance``; bucketing by size, as
    ``tf.data``'s ``bucket_by_sequence_length``). Which graphs share a step depends on the
    global batch only, not on the number of workers. 1 keeps the steps as read. Graphs read
    by offset only (uncompressed shards); streamed shards keep their order.

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

    ``run_dir`` may not be empty (the run would be written into the current directory). Upper
    bounds, far above real use: ``epochs`` 1,000,000, ``batch_graphs`` 65536 (``MAX_BATCH_GRAPHS``),
    ``sort_window`` 1,000,000,
    ``keep_checkpoints`` 1000, 64 ``thresholds``.
    """

    run_dir: str = "runs/default"
    epochs: int = 10
    batch_graphs: int = 1
    sort_window: int = 8
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
        check(
            bool(self.run_dir.strip()),
            "run_dir",
            "must not be empty (a directory for the run's files, e.g. runs/NAME)",
        )
        check(1 <= self.epochs <= MAX_EPOCHS, "epochs", f"must be in [1, {MAX_EPOCHS}]")
        check(
            1 <= self.batch_graphs <= MAX_BATCH_GRAPHS,
            "batch_graphs",
            f"must be in [1, {MAX_BATCH_GRAPHS}] (graphs per worker and step)",
        )
        check(
            1 <= self.sort_window <= MAX_SORT_WINDOW,
            "sort_window",
            f"must be in [1, {MAX_SORT_WINDOW}] (steps per window of graphs sorted by cost; "
            "1: steps as read)",
        )
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
        check(
            1 <= len(self.thresholds) <= MAX_THRESHOLDS,
            "thresholds",
            f"needs 1 to {MAX_THRESHOLDS} thresholds, got {len(self.thresholds)}",
        )
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
        check(
            1 <= self.keep_checkpoints <= MAX_KEEP_CHECKPOINTS,
            "keep_checkpoints",
            f"must be in [1, {MAX_KEEP_CHECKPOINTS}]",
        )
        check(self.validate_every_epochs >= 1, "validate_every_epochs", "must be >= 1")
        check(self.log_every_steps >= 1, "log_every_steps", "must be >= 1")
        check(self.progress_interval_s > 0, "progress_interval_s", "must be > 0")
        check(
            self.profile_steps is None or 0 <= self.profile_steps[0] < self.profile_steps[1],
            "profile_steps",
            "must be [first, last) with 0 <= first < last",
        )
