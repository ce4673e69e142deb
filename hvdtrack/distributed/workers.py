"""The one distribution seam: local, Horovod, MirroredStrategy and MultiWorker differ only here.

The training loop sees a ``Workers`` object and nothing else of the strategy:

* identity: ``rank`` (process index), ``num_processes``, ``num_replicas`` (data-parallel workers in
  all), ``replica_ids`` (the global worker ids this process feeds), ``is_chief``;
* ``scope()`` to create variables in, ``run(fn, batches)`` to run a replica step in a compiled
  function, ``reduce_sum`` inside that step, ``reduce_gradients`` for the gradient exchange,
  ``broadcast_variables`` once after variables exist;
* host-side collectives over processes for metrics: ``allreduce_host`` (sums) and
  ``allgather_host`` (concatenation in rank order).

Threads and cores of the workers: ``hvdtrack.distributed.cores``. Public symbols: ``Workers``,
``HorovodWorkers``, ``StrategyWorkers``, ``make_workers``.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdtrack.distributed.config import DistributedConfig
from hvdtrack.distributed.cores import (
    cpu_threads,
    launcher_local_size,
    oversubscribed,
    pin_cores,
    set_threads,
    share_cores,
    threads_per_process,
)
from hvdtrack.distributed.watchdog import Watchdog
from hvdtrack.errors import ConfigError


class Workers:
    """A single process with no communication (``distributed.strategy: local``)."""

    name = "local"

    def __init__(self, config: DistributedConfig):
        self.config = config
        self.rank = 0
        self.num_processes = 1
        self.local_replicas = 1
        self.local_rank, self.local_size = 0, 1  # this process among those on its host
        self.threads = config.threads_per_worker or cpu_threads()
        set_threads(self.threads)
        self.shares_cores = False  # more processes on this host than cores

    # ------------------------------------------------------------------ identity
    @property
    def num_replicas(self) -> int:
        """Data-parallel workers in all (the N of the scaling laws)."""
        return self.num_processes * self.local_replicas

    @property
    def replica_ids(self) -> list[int]:
        """Global worker ids whose batches this process feeds, in local-replica order."""
        first = self.rank * self.local_replicas
        return list(range(first, first + self.local_replicas))

    @property
    def host_cores(self) -> int:
        """Cores this process may run on."""
        return cpu_threads()

    @property
    def is_chief(self) -> bool:
        """Only the chief writes files (TensorBoard, checkpoints, reports)."""
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "num_processes": self.num_processes,
            "num_workers": self.num_replicas,
            "threads_per_worker": self.threads,
        }

    # ------------------------------------------------------------------ in-graph
    def scope(self) -> contextlib.AbstractContextManager:
        """Context in which model and optimizer variables are created."""
        return contextlib.nullcontext()

    def run(self, fn: Callable, batches: Sequence[tuple]) -> list:
        """Runs ``fn(*batch)`` as each local replica; returns one output per local replica."""
        return [fn(*batches[0])]

    def reduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        """Sums each tensor over all replicas, exactly (no compression). Call inside ``run``."""
        return list(tensors)

    def reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """The gradient exchange: sums already-normalised gradients over all replicas.

        Subclasses may compress (fp16) or combine adaptively (Adasum); see ``HorovodWorkers``.
        """
        return self.reduce_sum(grads)

    @property
    def adaptive_reduction(self) -> bool:
        """True when ``reduce_gradients`` expects per-replica mean gradients (Adasum)."""
        return False

    @property
    def exact_gradient_exchange(self) -> bool:
        """True when ``reduce_gradients`` is an exact sum (no compression, no Adasum), so other
        sums may share its collective."""
        return True

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        """Makes every replica hold rank 0's values (after lazy variable creation)."""

    # ------------------------------------------------------------------ host side
    def allreduce_host(self, values: np.ndarray) -> np.ndarray:
        """Sums a float64 array over processes (each process passes its local total)."""
        return np.asarray(values, np.float64)

    def allgather_host(self, values: np.ndarray) -> np.ndarray:
        """Concatenates arrays (same trailing shape, any length) over processes in rank order."""
        return np.asarray(values)

    def barrier(self) -> None:
        """Waits until every process reaches this point."""

    def shutdown(self) -> None:
        """Releases the communication layer."""


class HorovodWorkers(Workers):
    """One process per worker under horovodrun, mpirun or srun; allreduce over MPI or Gloo."""

    name = "horovod"

    def __init__(self, config: DistributedConfig):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.config = config
        if config.horovod_cycle_time_ms is not None:
            # Read by Horovod's background thread at hvd.init(); the config is the one source.
            os.environ["HOROVOD_CYCLE_TIME"] = f"{config.horovod_cycle_time_ms:g}"
        self.shares_cores = share_cores(launcher_local_size())
        if config.deadline_s is not None:
            _set_horovod_deadline(config.deadline_s)
        hvd.init()
        self.rank = hvd.rank()
        self.num_processes = hvd.size()
        self.local_replicas = 1
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        # Pin one GPU per local rank; on CPU split the cores between the ranks of this host.
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            if self.local_rank >= len(gpus):
                raise ConfigError(
                    f"'distributed.strategy' horovod: local rank {self.local_rank} has no GPU "
                    f"({len(gpus)} visible); start at most {len(gpus)} ranks per node"
                )
            tf.config.set_visible_devices(gpus[self.local_rank], "GPU")
            tf.config.experimental.set_memory_growth(gpus[self.local_rank], True)
        self.threads = config.threads_per_worker or threads_per_process(hvd.local_size())
        self._host_cpus, self._gpus = sorted(os.sched_getaffinity(0)), bool(gpus)
        self.pin_cores()
        set_threads(self.threads)
        self.shares_cores = self.shares_cores or oversubscribed(hvd.local_size())
        self._op = hvd.Adasum if config.reduce_op == "adasum" else hvd.Sum
        self._compression = (
            hvd.Compression.fp16 if config.compression == "fp16" else hvd.Compression.none
        )
        self.watchdog = None
        if config.deadline_s is not None and self.num_processes > 1 and not _elastic():
            # MPI waits for ever on a stopped rank; Gloo's timeout does not say which rank.
            self.watchdog = Watchdog(
                self.rank,
                self.num_processes,
                config.deadline_s,
                lambda value: hvd.broadcast_object(value, root_rank=0, name="watchdog"),
            )

    def pin_cores(self) -> None:
        """On CPU, binds this rank to its slice of the host's cores by its local rank (again
        after an elastic reset renumbers the ranks); ``self.cores`` is the slice or None."""
        self.cores = None
        if self.config.pin_cores and not self._gpus:
            self.cores = pin_cores(self._host_cpus, self.local_rank, self.local_size)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            controller="mpi" if self.hvd.mpi_enabled() and self.hvd.mpi_built() else "gloo",
            local_size=self.hvd.local_size(),
            compression=self.config.compression,
            reduce_op=self.config.reduce_op,
        )
        return info

    @property
    def alone(self) -> bool:
        """One rank, not elastic: the sums over ranks are the rank's own tensors, taken as they
        are, as Horovod's ``DistributedGradientTape`` takes them (its ``_allreduce_cond``), not
        sent through Horovod's background loop (a one-rank allreduce waited 14-15 ms a step
        there at a 20 ms cycle, docs/scaling/README.md). Elastic jobs keep the collective: the
        ranks may grow after a reset."""
        return self.num_processes == 1 and not _elastic()

    def reduce_sum(self, tensors):
        # Exact sums (loss and weight totals): never compressed, never Adasum.
        if self.alone:
            return list(tensors)
        return self.hvd.grouped_allreduce(list(tensors), op=self.hvd.Sum, name="exact_sums")

    def reduce_gradients(self, grads):
        # What hvd.DistributedGradientTape does after tape.gradient: one grouped allreduce
        # (none on one rank).
        if self.alone:
            return list(grads)
        if self._op is self.hvd.Adasum:
            # Horovod 0.28.1's grouped_allreduce fails on its Adasum path (it reads an undefined
            # `tensor`); DistributedGradientTape reduces Adasum tensor by tensor, and so do we.
            return [
                self.hvd.allreduce(
                    g, op=self._op, compression=self._compression, name=f"adasum_{i}"
                )
                for i, g in enumerate(grads)
            ]
        return self.hvd.grouped_allreduce(
            list(grads), op=self._op, compression=self._compression, name="gradients"
        )

    @property
    def adaptive_reduction(self) -> bool:
        return self.config.reduce_op == "adasum"

    @property
    def exact_gradient_exchange(self) -> bool:
        return self.config.reduce_op == "sum" and self.config.compression == "none"

    def broadcast_variables(self, variables):
        self.hvd.broadcast_variables(list(variables), root_rank=0)

    def allreduce_host(self, values):
        values = np.asarray(values, np.float64)
        if self.num_processes == 1:
            return values
        return self.hvd.allreduce(tf.constant(values), op=self.hvd.Sum).numpy()

    def allgather_host(self, values):
        values = np.asarray(values)
        if self.num_processes == 1:
            return values
        return self.hvd.allgather(tf.constant(values)).numpy()

    def barrier(self):
        self.allreduce_host(np.zeros(1))

    def shutdown(self):
        if self.watchdog is not None:
            self.watchdog.stop()
        self.hvd.shutdown()


def _elastic() -> bool:
    # Elastic Horovod restarts on the workers left when one fails: no rank may end the job then.
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _set_horovod_deadline(deadline_s: float) -> None:
    """Horovod's own deadlines, read at ``hvd.init()``; an explicit environment setting wins.

    * Stall inspector: a collective that some rank's training thread has not joined (hung,
      deadlocked) is reported at half the deadline and shuts Horovod down at the deadline.
    * Gloo: any of its operations (the rendezvous at start, each cycle's negotiation, the
      collectives) fails after 1.5 deadlines (its default, 30 s, held a stopped rank's peers
      43 s in all). Later than the heartbeats (``Watchdog``), whose message names the lost
      rank: Gloo's says only that a receive timed out. It is the bound where they are off.
    """
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", f"{deadline_s / 2:g}")
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", f"{deadline_s:g}")
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", f"{math.ceil(1.5 * deadline_s)}")


def _replica_local_creator(next_creator, **kwargs):
    # As snt.distribute.Replicator: every replica owns a copy of each variable and updates it in
    # replica context; copies stay equal because every replica applies the same reduced update.
    if (
        kwargs.get("synchronization", tf.VariableSynchronization.AUTO)
        == tf.VariableSynchronization.AUTO
    ):
        kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
        if kwargs.get("aggregation", tf.VariableAggregation.NONE) == tf.VariableAggregation.NONE:
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        if kwargs.get("trainable") is None:
            kwargs["trainable"] = True
    return next_creator(**kwargs)


class StrategyWorkers(Workers):
    """``tf.distribute``: MirroredStrategy (one process) or MultiWorkerMirroredStrategy."""

    def __init__(self, config: DistributedConfig):
        self.config = config
        if config.strategy == "multiworker":
            resolver = _cluster_resolver()
            self.local_rank, hosts_here = _local_worker(resolver)
            self.threads = config.threads_per_worker or threads_per_process(hosts_here)
            self.cores = None  # on CPU, this host's workers on disjoint cores, as Horovod's
            if config.pin_cores and not tf.config.list_physical_devices("GPU"):
                cpus = sorted(os.sched_getaffinity(0))
                self.cores = pin_cores(cpus, self.local_rank, hosts_here)
            set_threads(self.threads)
            if config.deadline_s is not None:
                _set_coordination_deadline(resolver, config.deadline_s)
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
            self.rank = int(resolver.task_id or 0)
            self.num_processes = max(1, resolver.cluster_spec().num_tasks("worker"))
            self.name = "multiworker"
            self.local_size = hosts_here
            self.shares_cores = oversubscribed(hosts_here)
        else:
            self.threads = config.threads_per_worker or cpu_threads()
            set_threads(self.threads)
            devices = _mirrored_devices(config.num_cpu_devices)
            self.strategy = tf.distribute.MirroredStrategy(devices=devices)
            self.rank = 0
            self.num_processes = 1
            self.name = "mirrored"
            self.local_rank, self.local_size = 0, 1
            self.shares_cores = False
        self.local_replicas = self.strategy.num_replicas_in_sync // self.num_processes

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["devices"] = list(self.strategy.extended.worker_devices)
        return info

    def scope(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.strategy.scope())
        stack.enter_context(tf.variable_creator_scope(_replica_local_creator))
        return stack

    def run(self, fn, batches):
        local = self.local_replicas

        def value_fn(context):
            return batches[context.replica_id_in_sync_group % local]

        per_replica = self.strategy.experimental_distribute_values_from_function(value_fn)
        outputs = self.strategy.run(lambda batch: fn(*batch), args=(per_replica,))
        results = self.strategy.experimental_local_results
        return [tf.nest.map_structure(lambda v, i=i: results(v)[i], outputs) for i in range(local)]

    def reduce_sum(self, tensors):
        context = tf.distribute.get_replica_context()
        return list(context.all_reduce(tf.distribute.ReduceOp.SUM, list(tensors)))

    def allreduce_host(self, values):
        values = np.asarray(values, np.float64)
        if self.num_processes == 1:
            return values
        local = self.local_replicas
        zeros = np.zeros_like(values)
        per_replica = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(values if ctx.replica_id_in_sync_group % local == 0 else zeros)
        )
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()

    def allgather_host(self, values):
        values = np.asarray(values)
        if self.num_processes == 1:
            return values
        local = self.local_replicas
        # Collective gathers take 32/64-bit types only: widen small integers, narrow back after.
        wide = values.astype(np.int32) if values.dtype.itemsize < 4 else values
        empty = wide[:0]
        per_replica = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(wide if ctx.replica_id_in_sync_group % local == 0 else empty)
        )
        return self.strategy.gather(per_replica, axis=0).numpy().astype(values.dtype)

    def barrier(self):
        self.allreduce_host(np.zeros(1))


def _set_coordination_deadline(resolver, deadline_s: float) -> None:
    """MultiWorker: a worker whose heartbeats stop for ``deadline_s`` (killed, stopped, its host
    gone) fails the job. TensorFlow's coordination service, which MultiWorkerMirroredStrategy
    configures with the default heartbeat timeout unless it was configured before, has no
    public setting for it: this is the strategy's own call (TF 2.18) with the timeout added."""
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context
    from tensorflow.tsl.protobuf import coordination_config_pb2

    cluster = resolver.cluster_spec()
    if context.context().coordination_service is not None:
        return  # configured by the caller
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        heartbeat_timeout_in_ms=int(deadline_s * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
            for job in ("chief", "worker")
            if job in cluster.jobs
        ],
    )


def _mirrored_devices(num_cpu_devices: int) -> list[str]:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in range(len(gpus))]
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_cpu_devices)]
        )
    except RuntimeError:
        pass  # TensorFlow already started: keep whatever logical devices exist.
    devices = tf.config.list_logical_devices("CPU")
    return [d.name for d in devices[:num_cpu_devices]]


def _cluster_resolver():
    resolver_cls = tf.distribute.cluster_resolver
    if "TF_CONFIG" in os.environ:
        from hvdtrack.distributed.launch import tf_config_tasks

        tf_config_tasks(os.environ["TF_CONFIG"])  # a one-line error for a malformed cluster
        return resolver_cls.TFConfigClusterResolver()
    if "SLURM_PROCID" in os.environ:
        if tf.config.list_physical_devices("GPU"):
            return resolver_cls.SlurmClusterResolver()
        # On CPU nodes the resolver would call nvidia-smi; tell it there is nothing to pin.
        tasks = int(os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)
        return resolver_cls.SlurmClusterResolver(
            gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False
        )
    raise ConfigError(
        "'distributed.strategy' is multiworker but neither TF_CONFIG nor a SLURM job environment "
        "is set: set TF_CONFIG on every worker or launch with srun"
    )


def _local_worker(resolver) -> tuple[int, int]:
    """(this worker's index among the cluster's workers on its host, their number)."""
    try:
        addresses = resolver.cluster_spec().job_tasks("worker")
    except (ValueError, KeyError):
        return 0, 1
    task = int(resolver.task_id or 0)
    local_names = {
        addresses[task].rsplit(":", 1)[0],
        "localhost",
        "127.0.0.1",
        socket.gethostname(),
    }
    here = [i for i, a in enumerate(addresses) if a.rsplit(":", 1)[0] in local_names]
    return here.index(task), len(here)


def make_workers(config: DistributedConfig) -> Workers:
    """The ``Workers`` for ``config.strategy``; call before any TensorFlow op runs."""
    if config.strategy == "horovod":
        return HorovodWorkers(config)
    if config.strategy in ("mirrored", "multiworker"):
        return StrategyWorkers(config)
    return Workers(config)
