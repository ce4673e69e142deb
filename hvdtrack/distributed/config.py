"""The ``distributed:`` section of a run configuration and its ``stages`` sub-section, and the
launcher that started this process (``launched_processes``: read by every entry point, before
any config section is used).

No TensorFlow here: reading a config stays cheap. The code these sections configure lives beside
them: ``workers`` (the distribution seam), ``stages`` (pipeline parallelism inside a worker).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal, Mapping, Optional

from hvdtrack.configtools import check
from hvdtrack.errors import ConfigError

# Upper bounds, far above real use, so that a typo is refused by name rather than by the
# machine (a million logical devices or threads): processes, devices and threads of one host.
MAX_PER_HOST = 4096


@dataclasses.dataclass(frozen=True)
class StagesConfig:
    """The ``distributed.stages`` section: pipeline parallelism inside each worker, in stages.

    With ``num_stages`` > 1 the trainer's step runs every training batch through a
    ``hvdtrack.distributed.stages.StagedClassifier``: the message-passing steps split over
    ``num_stages`` devices (``stage_devices``: GPUs, else logical CPU devices made at start-up),
    the batch cut into ``micro_batches`` parts of whole graphs (subgraphs with
    ``train.subgraphs``) run GPipe-style. The loss and weight sums and the gradients are those
    of the plain step (to float rounding), so the gradient exchange across workers
    (``distributed.strategy: horovod``: data x stage parallelism, one set of stages per process)
    and the optimizer step are unchanged. Validation and evaluation run the plain model on whole
    graphs. run.json records ``stages: {num_stages, micro_batches}`` (null with one stage).

    Before this section had its name it was ``distributed.pipeline: {stages, micro_batches}``;
    a config (or an override) in that form is still read, with a deprecation warning
    (``hvdtrack.config.load_config``), and so are run directories that recorded it.

    Attributes:
      num_stages: S, devices the message-passing steps are split over (1: no stages); at most
        ``model.num_message_passing_steps`` (a stage runs at least one step).
      micro_batches: M, parts of a worker's batch run through the stages in turn; more parts
        than ``train.batch_graphs`` leaves some empty (allowed, pure overhead). GPipe's idle
        fraction is (S - 1) / (M + S - 1).

    Refused (``hvdtrack.config.Config``): num_stages > 1 with ``distributed.strategy`` mirrored
    or multiworker (tf.distribute places each replica on a device of its own, the stages need
    theirs), with ``model.precision`` other than float32 or with ``model.recompute`` (the
    stages run the plain float32 forward).

    Resuming: the section may change between a run and its resume (``rundir.RESUMABLE_CHANGES``):
    it changes neither the variables, the checkpoint nor the data order, and the gradients
    equal the plain step's to float rounding (``tests/train/test_stages*.py``); it changes how
    fast a step runs, as ``distributed.strategy`` or ``threads_per_worker`` do.
    """

    num_stages: int = 1
    micro_batches: int = 1

    def __post_init__(self) -> None:
        for key in ("num_stages", "micro_batches"):
            value = getattr(self, key)
            check(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                key,
                f"must be an integer >= 1, got {value!r}",
            )
        check(
            self.micro_batches <= MAX_PER_HOST,
            "micro_batches",
            f"must be at most {MAX_PER_HOST}, got {self.micro_batches}",
        )

    def run_info(self) -> Optional[dict[str, int]]:
        """run.json's ``stages``: ``{"num_stages": S, "micro_batches": M}``, None for S == 1."""
        if self.num_stages == 1:
            return None
        return {"num_stages": self.num_stages, "micro_batches": self.micro_batches}


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
    on 2 cores: 20 ms made a 1-graph step 0.59 s instead of 0.72 s); the last rank to reach a
    collective then waits three quarters of a cycle on average at 2 ranks (its own loop, then
    the latest rank's: ``scaling.maths.cycle_wait``), so keep it short on GPUs.

    ``deadline_s``: a rank that dies or stops answering ends the whole job, with an error naming
    it, within about this many seconds (MultiWorker: the workers still running exit). Under
    Horovod (horovodrun with Gloo or MPI, mpirun, srun) every rank exchanges heartbeats with
    rank 0 beside the collectives (``hvdtrack.distributed.watchdog``): a closed connection ends the job
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

    ``stages`` (``StagesConfig``): each worker runs the model as ``num_stages`` stages over
    ``micro_batches`` micro-batches (1: no stages).

    ``num_cpu_devices``, ``threads_per_worker``, ``backward_passes_per_step`` and
    ``stages.micro_batches`` are at most ``MAX_PER_HOST`` (4096).
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
    stages: StagesConfig = dataclasses.field(default_factory=StagesConfig)

    def __post_init__(self):
        most = MAX_PER_HOST
        check(
            1 <= self.backward_passes_per_step <= most,
            "backward_passes_per_step",
            f"must be in [1, {most}]",
        )
        check(
            self.threads_per_worker is None or 1 <= self.threads_per_worker <= most,
            "threads_per_worker",
            f"must be in [1, {most}] or null",
        )
        check(1 <= self.num_cpu_devices <= most, "num_cpu_devices", f"must be in [1, {most}]")
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


# (launcher, its rank variable, its process-count variable), in order: horovodrun --gloo;
# mpirun / horovodrun --mpi with Open MPI; MPICH / Intel MPI (Hydra) and srun --mpi=pmi2; PMIx
# (srun --mpi=pmix, which says the count only in SLURM's variable); an srun step. The first one
# set wins: horovodrun or mpirun inside a SLURM job still see the batch step's SLURM_PROCID
# (hence SLURM last), and a batch script's own SLURM_NTASKS is the job's size, not a count of
# started processes (only an srun step sets SLURM_STEP_NUM_TASKS).
LAUNCHERS = (
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE"),
    ("Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("an MPI launcher (PMI)", "PMI_RANK", "PMI_SIZE"),
    ("a PMIx launcher", "PMIX_RANK", "SLURM_STEP_NUM_TASKS"),
    ("srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
)


def launched_processes(environ: Mapping[str, str] | None = None) -> tuple[str, int | None] | None:
    """(launcher, processes it started) when a launcher started this process; else None.

    The launcher is the first of ``LAUNCHERS`` whose rank variable is set; the count is None
    when it does not say (PMIx outside an srun step). A SLURM batch script's own environment
    (``SLURM_PROCID`` but no ``SLURM_STEP_NUM_TASKS``: one process, whatever ``SLURM_NTASKS``
    says) is no launch.

    Raises:
      ConfigError: a rank variable that is not an integer >= 0, a count not an integer >= 1.
    """
    env = os.environ if environ is None else environ
    for launcher, rank_name, size_name in LAUNCHERS:
        if not env.get(rank_name, "").strip():
            continue
        launcher_number(rank_name, env[rank_name], 0)
        size = env.get(size_name, "").strip()
        if size:
            return launcher, launcher_number(size_name, size, 1)
        return None if launcher == "srun" else (launcher, None)
    return None


def launcher_number(name: str, value: str, least: int) -> int:
    """``value`` of launcher variable ``name`` as an integer >= ``least`` (0: a rank, 1: a count).

    Raises:
      ConfigError: it is not.
    """
    value = value.strip()
    if not value.isdigit() or int(value) < least:
        what = (
            "rank is not an integer >= 0" if least == 0 else "process count is not an integer >= 1"
        )
        raise ConfigError(f"{name}={value!r}: the launcher's {what}")
    return int(value)
