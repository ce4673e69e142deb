"""The work that the step benches (``model``, ``memory``, ``ceiling``) run: the configured
training step on one synthetic graph (or, for ``ceiling``, on graphs of the training split), and
the timing of calls.

``build_step(args)`` builds the step ``hvdtrack train`` runs (``hvdtrack.train.step.TrainStep``)
from the bench's command line (``--config``, ``--set`` overrides, ``--threads``);
``step_fn(step, *synthetic_graph(num_nodes, num_edges))`` is one training step per call (or
on ``training_graph``: graphs of a prepared dataset's training split, ``mean_size_graphs``);
``time_calls`` times such calls (median, spread, process CPU time, page faults);
``time_in_turn`` times several functions in alternating rounds, whose times ``round_ratios``
compares round by round.
``write_figures`` keeps a bench's configuration and records as JSON.

Public symbols: ``NUM_NODE_FEATURES``, ``NUM_EDGE_FEATURES``, ``EDGES_PER_NODE``, ``Timing``,
``time_calls``, ``time_in_turn``, ``round_ratios``, ``run_config``, ``build_step``,
``step_fn``, ``synthetic_graph``, ``mean_size_graphs``, ``training_graph``, ``write_figures``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import resource
import statistics
import time
from typing import Callable, Optional, Sequence

import numpy as np

NUM_NODE_FEATURES = 3  # the record schema's [r, phi, z]
NUM_EDGE_FEATURES = 4  # [dr, dphi, dz, deta]
EDGES_PER_NODE = 8  # of the benches' default graphs and of the memory bisection's


@dataclasses.dataclass
class Timing:
    """Wall and process-CPU seconds per call of one timed function (warm-up excluded), and the
    process's minor page faults per call (``time_calls``; empty where not counted)."""

    seconds: list[float]
    cpu_seconds: list[float]
    page_faults: list[int] = dataclasses.field(default_factory=list)
    median: float = dataclasses.field(init=False)
    cpu_median: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.median = statistics.median(self.seconds)
        self.cpu_median = statistics.median(self.cpu_seconds)

    def describe(self) -> str:
        ms = [1e3 * x for x in (self.median, min(self.seconds), max(self.seconds))]
        faults = ""
        if self.page_faults:  # fresh pages from the kernel: the allocator's cost, see entry.py
            faults = f"; {statistics.median(self.page_faults):,.0f} page faults"
        return (
            f"{ms[0]:.1f} ms (min {ms[1]:.1f}, max {ms[2]:.1f}; CPU {1e3 * self.cpu_median:.1f}"
            f"{faults})"
        )


def time_calls(fn: Callable[[], object], warmup: int, repeats: int) -> Timing:
    """Calls ``fn`` ``warmup`` times untimed, then times ``repeats`` calls (and counts the
    process's minor page faults over each)."""
    return time_in_turn([fn], warmup, repeats)[0]


def time_in_turn(fns: Sequence[Callable[[], object]], warmup: int, repeats: int) -> list[Timing]:
    """``time_calls`` for several functions called in turn, A B A B ...: ``warmup`` untimed
    rounds, then ``repeats`` timed rounds of one call each. A drift of the machine's speed
    between rounds then touches every function alike, so two functions' times in the same
    round compare like with like (``round_ratios``), where medians of runs one after the other
    would compare two moments of a noisy machine."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    timed: list[tuple[list, list, list]] = [([], [], []) for _ in fns]
    for _ in range(repeats):
        for fn, (seconds, cpu_seconds, faults) in zip(fns, timed):
            start, start_cpu = time.perf_counter(), time.process_time()
            start_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            fn()
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - start_cpu)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start_faults)
    return [Timing(*lists) for lists in timed]


def round_ratios(numerator: Timing, denominator: Timing, cpu: bool = False) -> list[float]:
    """Round by round (``time_in_turn``'s rounds), ``numerator``'s time over ``denominator``'s
    (wall, or process CPU with ``cpu``)."""
    top, bottom = (
        (numerator.cpu_seconds, denominator.cpu_seconds)
        if cpu
        else (numerator.seconds, denominator.seconds)
    )
    if len(top) != len(bottom):
        raise ValueError(f"{len(top)} rounds against {len(bottom)}: not timed in turn")
    return [a / b for a, b in zip(top, bottom)]


def run_config(args: argparse.Namespace):
    """The bench's ``Config``: ``args.config`` (None: the packaged default) with ``args.overrides``
    (a bare ``KEY=VALUE`` is a model key), local workers and ``args.threads`` intra-op threads
    (0: every core this process may use). ``model.keep_edge_term: auto`` is resolved as
    training resolves it (``cost.resolve_keep_edge_term``), for the largest of ``args.nodes`` /
    ``args.edges`` in ``args.memory_budget`` bytes (absent or None: the memory this process may
    use, ``usable_memory_bytes``)."""
    import dataclasses

    from hvdtrack.config import load_config, resolve_config_path
    from hvdtrack.model.cost import resolve_keep_edge_term
    from hvdtrack.utils.memory import usable_memory_bytes

    overrides = [s if "." in s.partition("=")[0] else f"model.{s}" for s in args.overrides]
    threads = "null" if args.threads == 0 else str(args.threads)
    forced = ["distributed.strategy=local", f"distributed.threads_per_worker={threads}"]
    config = load_config(resolve_config_path(args.config), overrides + forced)
    budget = getattr(args, "memory_budget", None)
    memory = usable_memory_bytes() if budget is None else budget
    model = resolve_keep_edge_term(config.model, max(args.nodes), max(args.edges), memory)
    return dataclasses.replace(config, model=model)


def build_step(args: argparse.Namespace):
    """The configured training step (``TrainStep``) over a fresh state, built from the same
    pieces as ``hvdtrack train``'s; its Workers set TensorFlow's threads before any op runs.
    No dataset: a constant learning rate at the configured (scaled) peak."""
    config = run_config(args)
    from hvdtrack.distributed.workers import make_workers
    from hvdtrack.train.optimizer import Schedule, scaled_learning_rate
    from hvdtrack.train.state import TrainState
    from hvdtrack.train.step import TrainStep
    from hvdtrack.train.trainer import make_stage_devices_for

    tc = config.train
    devices = make_stage_devices_for(config)
    workers = make_workers(config.distributed)
    peak = scaled_learning_rate(tc.learning_rate, workers.num_replicas, tc.lr_scaling)
    schedule = Schedule(peak=peak, warmup_steps=0, total_steps=1, decay="none")
    step = TrainStep(config, workers, TrainState(config, workers, schedule), devices)
    step.compile()
    return step


def step_fn(trainer, graphs, labels) -> Callable[[], object]:
    """One training step of ``trainer`` (a ``TrainStep``) on the same graph per call."""
    batches = itertools.repeat([(graphs, labels)])
    return lambda: trainer.run(batches)


def synthetic_graph(num_nodes: int, num_edges: int, seed: int = 0):
    """A random one-graph ``GraphsTuple`` (features N(0, 1), endpoints uniform) and 0/1 labels.

    Edges are in the order graph construction gives them (``build_hit_graph``): by sender, then
    receiver; the sender-side gathers and segment sums see sorted indices, as in training.

    Returns:
      (graphs, labels): nodes float32 [N, 3], edges float32 [E, 4], senders / receivers int32
      [E], globals zeros [1, 1]; labels float32 [E] (1 where the first edge feature is > 0).
    """
    import tensorflow as tf
    from graph_nets import utils_tf

    rng = np.random.default_rng(seed)
    edges = rng.standard_normal((num_edges, NUM_EDGE_FEATURES), dtype=np.float32)
    senders, receivers = rng.integers(0, num_nodes, (2, num_edges), dtype=np.int32)
    order = np.argsort(senders.astype(np.int64) * num_nodes + receivers, kind="stable")
    graph = dict(
        nodes=rng.standard_normal((num_nodes, NUM_NODE_FEATURES), dtype=np.float32),
        edges=edges,
        senders=senders[order],
        receivers=receivers[order],
        globals=np.zeros(1, np.float32),
    )
    graphs = utils_tf.data_dicts_to_graphs_tuple([graph])
    return graphs, tf.constant((edges[:, 0] > 0).astype(np.float32))


def mean_size_graphs(dataset_dir: str, graphs: float) -> tuple[np.ndarray, int, int]:
    """The ids of the ``graphs`` (rounded, at least 1) graphs of a prepared dataset's training
    split whose edges are nearest the split's mean, in id order, and their nodes and edges.
    DataError (naming the dataset) when it has no such split; ConfigError when it holds fewer
    graphs than asked for."""
    from hvdtrack.errors import ConfigError
    from hvdtrack.records.manifest import Manifest

    table = Manifest.load(dataset_dir).split_table("train", str(dataset_dir))
    count = max(1, round(graphs))
    if count > table.num_graphs:
        raise ConfigError(
            f"{dataset_dir}: {count} training graphs asked for, its training split holds "
            f"{table.num_graphs}"
        )
    distance = np.abs(table.num_edges - table.num_edges.mean())
    ids = np.sort(np.argsort(distance, kind="stable")[:count])
    return ids, int(table.num_nodes[ids].sum()), int(table.num_edges[ids].sum())


def training_graph(dataset_dir: str, graphs: float):
    """``mean_size_graphs``' graphs read from their records and merged into one ``GraphsTuple``
    (as a training batch), with their labels: the step on real hit graphs, whose edges join
    neighbouring hits (unlike ``synthetic_graph``'s uniform endpoints)."""
    import tensorflow as tf
    from graph_nets import utils_tf

    from hvdtrack.errors import DataError
    from hvdtrack.inputs.pipeline import eval_dataset, iterate_batches
    from hvdtrack.records.manifest import Manifest

    ids, _, _ = mean_size_graphs(dataset_dir, graphs)
    manifest = Manifest.load(dataset_dir)
    wanted = set(ids.tolist())
    read = eval_dataset(dataset_dir, manifest, "train", 0, 1, 1).take(int(ids[-1]) + 1)
    chosen = [b for i, b in enumerate(iterate_batches(read, dataset_dir, manifest)) if i in wanted]
    if len(chosen) != len(ids):
        raise DataError(
            f"{dataset_dir}: its training records hold fewer graphs than its manifest lists"
        )
    merged = utils_tf.concat([g for g, _ in chosen], axis=0)
    return merged, tf.concat([labels for _, labels in chosen], axis=0)


def write_figures(path: Optional[str], data: dict) -> None:
    """Writes ``data`` (a bench's figures) as JSON to ``path`` atomically; nothing when None."""
    if path:
        from hvdtrack.utils.io import write_json

        write_json(path, data)
        print(f"figures written to {path}")
