"""Before training starts: this process's rank and launcher, read from the launcher's environment
(a strategy that does not fit the launch is refused), and the dataset prepared on first use - by
exactly one rank, before Horovod, MPI or tf.distribute is initialised.

Forking the preparation's process pool after ``hvd.init`` (or MPI_Init) is unsafe, and a rank that
waits minutes at a Horovod collective triggers stall warnings; so the rank comes from the
environment variables the launchers set (nothing is initialised), rank 0 prepares the dataset with
``hvdtrack.prepare.local.prepare_dataset``, and the other ranks poll the file system until it is
complete.

``resolve_model`` then settles what depends on the dataset and the machine: ``model.keep_edge_term:
auto``, from the largest training graph and this process's share of the host's memory.

Public symbols: ``launcher_rank``, ``check_start``, ``check_launch``, ``check_memory``,
``read_tf_config``, ``tf_config_tasks``, ``dataset_status``, ``ensure_dataset``,
``wait_for_dataset``, ``resolve_model``, ``one_keep_edge_term``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

from hvdtrack.config import Config
from hvdtrack.distributed.config import LAUNCHERS, launched_processes, launcher_number
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.prepare.jobs import PREPARE_INFO, stale_reason, up_to_date
from hvdtrack.prepare.local import prepare_dataset
from hvdtrack.records.manifest import MANIFEST_NAME, manifest_digest
from hvdtrack.runs.timing import RUN_INFO_FILE
from hvdtrack.utils.memory import usable_memory_bytes

# The launchers' rank variables in order (``LAUNCHERS``); TF_CONFIG comes after them.
RANK_VARIABLES = tuple(rank for _, rank, _ in LAUNCHERS)
POLL_SECONDS = 2.0


def launcher_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank as its launcher announced it; 0 when not launched by one.

    Reads ``RANK_VARIABLES``, then ``TF_CONFIG`` (chief is rank 0, then workers in index order;
    worker 0 is rank 0 when there is no chief). Initialises nothing.

    Raises:
      ConfigError: a rank variable that is not a non-negative integer, or TF_CONFIG not JSON.
    """
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return launcher_number(name, value, 0)
    if env.get("TF_CONFIG", "").strip():
        return _tf_config_rank(env["TF_CONFIG"])
    return 0


def check_launch(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """Refuses a strategy that does not fit how the processes were launched; call it before
    anything is written (before the dataset is prepared and the run directory made).

    Several processes (``launched_processes``) must run ``distributed.strategy: horovod``:
    with any other strategy each would train on its own and all write one run directory. The
    exception is ``multiworker`` with a well-formed TF_CONFIG cluster of as many tasks, or
    without TF_CONFIG as the tasks of an srun step (SLURM's resolver makes the cluster). One
    process is fine.

    Raises:
      ConfigError: naming the launcher, the process count and the key to set; or a malformed
        TF_CONFIG (``tf_config_tasks``) with strategy multiworker.
    """
    env = os.environ if environ is None else environ
    strategy = config.distributed.strategy
    tf_config = env.get("TF_CONFIG", "").strip()
    tasks = tf_config_tasks(tf_config) if strategy == "multiworker" and tf_config else None
    launch = launched_processes(env)
    if launch is None or launch[1] == 1 or strategy == "horovod":
        return
    launcher, count = launch
    srun_step = env.get("SLURM_STEP_NUM_TASKS", "").strip() == str(count)  # all of the step
    if strategy == "multiworker" and (tasks == count or (not tf_config and srun_step)):
        return
    started = f"{count} processes" if count else "several processes (it does not say how many)"
    if strategy == "multiworker" and tasks is not None:
        started += f" while TF_CONFIG's cluster has {tasks} tasks"
    raise ConfigError(
        f"started by {launcher} as {started}, but 'distributed.strategy' is {strategy}: each "
        f"process would train on its own, all writing {config.train.run_dir}. Set "
        "distributed.strategy=horovod, or start one process"
    )


# Bytes one float32 parameter takes in training: the weight, its gradient, Adam's two moments.
TRAIN_BYTES_PER_PARAMETER = 16


def check_start(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """What ``hvdtrack train`` checks before it writes anything: ``check_launch`` and
    ``check_memory``."""
    check_launch(config, environ)
    check_memory(config)


def check_memory(config: Config, memory_bytes: int | None = None) -> None:
    """Refuses a model whose weights, gradients and Adam state alone (``TRAIN_BYTES_PER_PARAMETER``
    a parameter; activations come on top) exceed this machine's memory (``memory_bytes``:
    its physical memory), naming the model key that holds most of them.

    Raises:
      ConfigError: the model does not fit.
    """
    from hvdtrack.model.cost import linear_layers, num_parameters
    from hvdtrack.records.schema import EDGE_FEATURE_SIZE, NODE_FEATURE_SIZE

    total = usable_memory_bytes() if memory_bytes is None else memory_bytes
    widths = (config.model, NODE_FEATURE_SIZE, EDGE_FEATURE_SIZE)
    need = TRAIN_BYTES_PER_PARAMETER * num_parameters(*widths)
    if not total or need <= total:
        return
    by_module: dict[str, int] = {}
    for layer in linear_layers(*widths):
        by_module[layer.module] = by_module.get(layer.module, 0) + layer.fan_in * layer.fan_out
    largest = max(by_module, key=by_module.get)
    key = "output_head" if largest == "edge_output" else largest
    raise ConfigError(
        f"'model.{key}' {list(getattr(config.model, key))}: the model has "
        f"{num_parameters(*widths):,} parameters, whose weights, gradients and Adam state take "
        f"{need / 2**30:.1f} GiB, more than this machine's {total / 2**30:.1f} GiB of memory; "
        "use smaller model layer sizes"
    )


def read_tf_config(text: str) -> tuple[dict, dict]:
    """TF_CONFIG's (cluster, task) mappings, each {} when not given.

    Raises:
      ConfigError: not JSON, or not of the form {"cluster": {...}, "task": {...}}.
    """
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object with cluster and task, got {text!r}")
    cluster, task = spec.get("cluster") or {}, spec.get("task") or {}
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError("TF_CONFIG's cluster and task must be JSON objects")
    return cluster, task


def tf_config_tasks(text: str) -> int:
    """The tasks of TF_CONFIG's cluster that train (chief and workers); refuses a cluster that
    is not well formed: no worker lists, or this task's type or index not in them.

    Raises:
      ConfigError: naming what is wrong.
    """
    cluster, task = read_tf_config(text)
    jobs = {job: cluster.get(job) for job in ("chief", "worker") if job in cluster}
    if not jobs or not all(isinstance(hosts, list) and hosts for hosts in jobs.values()):
        raise ConfigError(
            'TF_CONFIG\'s cluster needs a non-empty "worker" (and optionally "chief") list of '
            f"host:port addresses, got {json.dumps(cluster)}"
        )
    kind, index = task.get("type"), task.get("index")
    if kind not in jobs or not isinstance(index, int) or not 0 <= index < len(jobs[kind]):
        raise ConfigError(
            f"TF_CONFIG's task {json.dumps(task)} is not one of its cluster's "
            + ", ".join(f"{job} 0..{len(hosts) - 1}" for job, hosts in jobs.items())
        )
    return sum(len(hosts) for hosts in jobs.values())


def _tf_config_rank(text: str) -> int:
    cluster, task = read_tf_config(text)
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if kind == "chief":
        return index
    if kind == "worker":
        return chiefs + index
    return max(1, chiefs + workers + index)  # evaluator / ps: never the one that prepares


def dataset_status(config: Config) -> str:
    """``ready`` (built by ``hvdtrack prepare`` from this data config), ``foreign`` (a dataset with
    no ``prepare.json``, e.g. from ``records.write_dataset``: used as it is), ``missing`` (absent
    or an empty directory), ``stale`` (out of date: ``stale_reason`` says why), ``other``
    (a directory holding something else, which is never replaced)."""
    target = Path(config.data.dataset_dir)
    if not target.exists():
        return "missing"
    has_manifest = (target / MANIFEST_NAME).is_file()
    if (target / PREPARE_INFO).is_file():
        return "ready" if has_manifest and up_to_date(config) else "stale"
    if has_manifest:
        return "foreign"
    if target.is_dir() and not any(target.iterdir()):
        return "missing"
    return "other"


def ensure_dataset(
    config: Config, rank: int | None = None, poll_seconds: float = POLL_SECONDS
) -> str:
    """Makes sure ``config.data.dataset_dir`` holds this config's dataset before training.

    Rank 0 prepares a missing or stale dataset (saying why), unless ``train.run_dir`` holds a
    run to resume that was trained on it (refused first); the other ranks wait for it, at most
    ``data.prepare_timeout_s``. Call it before anything initialises Horovod / MPI / TensorFlow's
    distribution. Returns the status it found (see ``dataset_status``).

    Raises:
      DataError: rank 0's preparation failed, ``dataset_dir`` holds something that is not a
        dataset, or (other ranks) the dataset was not ready in time.
    """
    rank = launcher_rank() if rank is None else rank
    status = dataset_status(config)
    target = config.data.dataset_dir
    if status == "other":
        raise DataError(
            f"data.dataset_dir {target} exists but holds no dataset (no {MANIFEST_NAME}); training "
            "will not replace it: remove it, or point data.dataset_dir elsewhere"
        )
    if status == "foreign" and rank == 0:
        _say(
            f"dataset {target} has no {PREPARE_INFO} (not built by hvdtrack prepare): used as it is"
        )
    if status in ("ready", "foreign"):
        return status
    if rank != 0:
        wait_for_dataset(config, config.data.prepare_timeout_s, poll_seconds, rank)
        return status
    reason = "not found" if status == "missing" else f"is out of date: {stale_reason(config)}"
    _refuse_rebuild_under_resume(config, reason)
    _say(f"dataset {target} {reason}: preparing it ({_what(config)}) ...")
    started = time.perf_counter()
    prepare_dataset(config, progress=config.train.progress_bar)
    _say(f"dataset {target} prepared in {time.perf_counter() - started:.1f} s")
    return status


def _refuse_rebuild_under_resume(config: Config, reason: str) -> None:
    """Refuses, before anything is replaced, to rebuild the dataset a run to be resumed was
    trained on (its ``run.json`` records that manifest's digest): the resume would be refused
    once the dataset had changed, and the old dataset would be gone."""
    run_dir = Path(config.train.run_dir)
    manifest = Path(config.data.dataset_dir) / MANIFEST_NAME
    if not (config.train.resume and (run_dir / RUN_INFO_FILE).is_file() and manifest.is_file()):
        return
    if config.train.allow_changed_config:
        return
    try:
        trained_on = json.loads((run_dir / RUN_INFO_FILE).read_text()).get("dataset_digest")
        digest = manifest_digest(config.data.dataset_dir)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return  # the resume check itself says what is wrong with the run
    if trained_on == digest:
        raise ConfigError(
            f"train.run_dir {run_dir} resumes a run trained on data.dataset_dir "
            f"{config.data.dataset_dir} (manifest digest {digest}), which {reason}; rebuilding "
            "it would make the resume impossible, so nothing was changed. Use another "
            "data.dataset_dir or train.run_dir, train.resume=false to start afresh, or run "
            "hvdtrack prepare first if the dataset is to be replaced"
        )


def wait_for_dataset(
    config: Config, timeout_s: float, poll_seconds: float = POLL_SECONDS, rank: int = 1
) -> None:
    """Polls until rank 0 has put a complete, up-to-date dataset in place (its manifest and
    ``prepare.json`` appear together, by an atomic rename); after ``timeout_s`` raises DataError."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = dataset_status(config)
        if status in ("ready", "foreign"):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(poll_seconds, remaining))
    target = config.data.dataset_dir
    raise DataError(
        f"rank {rank}: dataset {target} ({Path(target).resolve()}) was not ready after waiting "
        f"{timeout_s:g} s (data.prepare_timeout_s) for rank 0 to prepare it. Rank 0 may have "
        "failed (see its output), or the dataset directory is not on a filesystem all ranks "
        "share: put data.dataset_dir on a shared filesystem, or run `python -m hvdtrack.prepare` "
        "with the same config where every rank can see the result"
    )


def resolve_model(
    config: Config,
    environ: Mapping[str, str] | None = None,
    memory_bytes: int | None = None,
    say: bool = True,
) -> Config:
    """``config`` with ``model.keep_edge_term: auto`` made true or false
    (``hvdtrack.model.cost.resolve_keep_edge_term``) for the largest training batch of its
    dataset (``train.batch_graphs`` of its largest graph per replica, its report.json's
    ``nodes_max`` / ``edges_max``; MirroredStrategy's replicas share a process) in this process's
    share of the host's memory (``memory_bytes``, default ``usable_memory_bytes``, over the
    ranks on the host: ``_ranks_on_host``), said on rank 0 (``say``). A run resumed
    (``train.resume``, its run.json there) keeps the value it was trained with. Call it once the
    dataset is there and before TensorFlow's allocator is chosen
    (``hvdtrack.entry.choose_allocator``); the run records the resolved value. Without a report
    (a dataset not built by ``hvdtrack prepare``) the graphs are unknown: false (memory first)."""
    from hvdtrack.model.cost import resolve_keep_edge_term, speed_first_bytes

    model = config.model
    if model.keep_edge_term != "auto":
        return config
    environ = os.environ if environ is None else environ
    say = say and model.recompute and model.factorized_edge_update and launcher_rank(environ) == 0
    trained = _trained_keep_edge_term(config)
    if trained is not None:
        if say:
            _say(f"model.keep_edge_term auto: {str(trained).lower()}, as the resumed run had it")
        return dataclasses.replace(config, model=dataclasses.replace(model, keep_edge_term=trained))
    memory = usable_memory_bytes() if memory_bytes is None else memory_bytes
    share = memory // _ranks_on_host(environ) if memory else None
    largest = _largest_training_graph(config)
    replicas = 1
    if config.distributed.strategy in ("mirrored", "multiworker"):
        replicas = config.distributed.num_cpu_devices
    nodes, edges = (replicas * config.train.batch_graphs * n for n in largest or (0, 0))
    resolved = resolve_keep_edge_term(model, nodes, edges, share if largest else None)
    if say:
        keep = resolved.keep_edge_term
        why = (
            "the dataset's report.json gives no graph sizes"
            if largest is None
            else f"a process training its largest batch ({nodes:,} nodes, {edges:,} edges) "
            f"keeping it needs about {speed_first_bytes(model, nodes, edges) / 2**30:.2f} GiB, "
            f"this one has {(share or 0) / 2**30:.2f} GiB"
        )
        _say(
            f"model.keep_edge_term auto: {str(keep).lower()} "
            f"({'speed' if keep else 'memory'} first): {why}"
        )
    return dataclasses.replace(config, model=resolved)


def one_keep_edge_term(
    config: Config, layouts: Sequence[tuple[int, int]], memory_bytes: int | None = None
) -> str | None:
    """The override ``model.keep_edge_term=true|false`` that runs of ``config`` compared with
    each other (a scaling sweep, ``bench distributed``) all take, when its model leaves it
    ``auto`` (and recomputes, factorized; else None): true only if each layout, (ranks on this
    host, graphs per rank and step), would keep it (``resolve_model``, in ``memory_bytes``, by
    default the host's). Runs that resolved it
    apart would train different steps, and their comparison would measure that."""
    model = config.model
    if model.keep_edge_term != "auto" or not (model.recompute and model.factorized_edge_update):
        return None
    kept = True
    for ranks, graphs in layouts:
        sized = dataclasses.replace(
            config, train=dataclasses.replace(config.train, batch_graphs=graphs, resume=False)
        )
        environ = {"HOROVOD_LOCAL_SIZE": str(ranks)}
        resolved = resolve_model(sized, environ, memory_bytes, say=False)
        kept = kept and resolved.model.keep_edge_term is True
    return f"model.keep_edge_term={str(kept).lower()}"


def _trained_keep_edge_term(config: Config) -> bool | None:
    """``model.keep_edge_term`` of the run ``train.run_dir`` resumes (its run.json), if any."""
    run_info = Path(config.train.run_dir) / RUN_INFO_FILE
    if not config.train.resume or not run_info.is_file():
        return None
    try:
        value = json.loads(run_info.read_text())["config"]["model"]["keep_edge_term"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the resume check says what is wrong with the run
    return value if isinstance(value, bool) else None


def _ranks_on_host(environ: Mapping[str, str]) -> int:
    """Ranks on this host: as horovodrun / mpirun say (``cores.launcher_local_size``), or srun's
    tasks on this node (SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1", at SLURM_NODEID)."""
    from hvdtrack.distributed.cores import launcher_local_size  # imports TensorFlow

    local = launcher_local_size(environ)
    counts = []
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        count, _, repeat = part.partition("(x")
        if count.isdigit():
            times = repeat.rstrip(")")
            counts += [int(count)] * (int(times) if times.isdigit() else 1)
    node = environ.get("SLURM_NODEID", "0")
    if local == 1 and counts and node.isdigit() and int(node) < len(counts):
        return max(1, counts[int(node)])
    return local


def _largest_training_graph(config: Config) -> tuple[int, int] | None:
    """(nodes, edges) of the dataset's largest training graph by its report.json (the whole
    dataset's when it has no train split); None where the report does not say."""
    try:
        report = json.loads((Path(config.data.dataset_dir) / "report.json").read_text())
        sizes = report.get("splits", {}).get("train") or report["all"]
        return int(sizes["nodes_max"]), int(sizes["edges_max"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _what(config: Config) -> str:
    data = config.data
    if data.source == "synthetic":
        return f"{data.num_events} events"
    if data.num_events is None:
        return f"every event of {data.trackml_dir}"
    return f"{data.num_events} events of {data.trackml_dir}"


def _say(message: str) -> None:
    print(f"[hvdtrack] {message}", flush=True)
