"""Cores and threads of the workers on one host: how many threads a worker gets, whether the
host's ranks outnumber its cores (then MPI is told to yield), and pinning each rank to its own
slice of the cores (``DistributedConfig.pin_cores``). Used by ``hvdtrack.distributed.workers``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional, Sequence

import tensorflow as tf


def cpu_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_process(processes_on_host: int) -> int:
    """Cores for one of ``processes_on_host`` workers: a launcher that bound this process to a
    subset of the cores (srun --cpu-bind, mpirun --bind-to) already divided them."""
    available = cpu_threads()
    if available < (os.cpu_count() or available):
        return available
    return max(1, available // processes_on_host)


# Ranks on this host, as launchers announce them before any communication starts.
_LOCAL_SIZE_VARIABLES = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def launcher_local_size(environ=os.environ) -> int:
    """Processes the launcher started on this host (1 when it does not say)."""
    for name in _LOCAL_SIZE_VARIABLES:
        try:
            return max(1, int(environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


def oversubscribed(local_size: int) -> bool:
    """True when this host's ranks outnumber the cores they may all use. A process the launcher
    bound to a subset of the cores (srun --cpu-bind, mpirun --bind-to core) got its share."""
    available = cpu_threads()
    if available < (os.cpu_count() or available):
        return False
    return local_size > available


def share_cores(local_size: int, environ=os.environ) -> bool:
    """Prepares ranks that outnumber this host's cores; call before MPI starts.

    Open MPI busy-polls while a rank waits at a collective unless told it is oversubscribed,
    which horovodrun's ``-H localhost:N`` hides from it: 8 ranks on 2 cores then spent a third
    of their CPU in the kernel and ran an epoch 1.7x slower than with yielding (18.1 s vs
    10.4 s, docs/results.md). An explicit setting wins. Returns True when ranks share cores.
    """
    if not oversubscribed(local_size):
        return False
    environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return True


def core_slice(cpus: Sequence[int], local_rank: int, local_size: int) -> list[int]:
    """The cores of local rank ``local_rank`` of ``local_size`` among ``cpus``: disjoint slices
    of ``len(cpus) // local_size`` cores in order (empty when ranks outnumber the cores)."""
    per_rank = len(cpus) // local_size
    return sorted(cpus)[local_rank * per_rank : (local_rank + 1) * per_rank]


def pin_cores(cpus: Sequence[int], local_rank: int, local_size: int) -> Optional[list[int]]:
    """Binds every thread of this process to its slice of ``cpus``, the cores the process had
    at start (see ``DistributedConfig.pin_cores``); returns the slice, or None when it leaves
    the process on every core."""
    if len(cpus) < (os.cpu_count() or len(cpus)):  # a launcher bound it already
        return None
    mine = core_slice(cpus, local_rank, local_size)
    if not mine or len(mine) == len(cpus):
        mine = sorted(cpus)  # one rank, or more ranks than cores: every core (elastic: again)
    for task in os.listdir("/proc/self/task"):  # threads started so far (Horovod's, TF's)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), mine)
    return None if len(mine) == len(cpus) else mine


def set_threads(threads: int) -> None:
    # Only possible before TensorFlow's runtime starts (before the first op); a process that
    # already ran ops (a notebook, a test) keeps its settings.
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    except RuntimeError:
        pass
