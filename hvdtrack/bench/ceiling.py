"""The machine's ceiling for ranks on one host: a rank's training step alone, then once per core
slice in as many processes at the same time, the way ranks run.

  python -m hvdtrack.bench ceiling [--config configs/default.yaml] [--processes 2]
                                   [--nodes N --edges E | --training-graphs] [--repeats 10]
                                   [--rounds 3]

Each process is pinned to its own slice of this process's cores (``core_slice``: the slices
Horovod ranks get with ``distributed.pin_cores``) and runs the training step of ``bench model``
with one intra-op thread per core of its slice, on one synthetic graph of ``--nodes`` /
``--edges`` (default: a rank's share of a strong-scaling step, ``--graphs`` mean graphs of the
config's prepared training split), or with ``--training-graphs`` on ``--graphs`` real graphs of
that split, those nearest its mean size (``workload.mean_size_graphs``): hit graphs, whose edges
join neighbouring hits, read memory with more locality than the synthetic graph's uniform
endpoints, and two processes at once may contend less for it. Every process builds and warms
up its step; then, for each of ``--rounds`` rounds, process 0 times ``--repeats`` steps alone
(the others wait idle at a barrier) and all time ``--repeats`` steps together. Alternating the two, A B A B, keeps a machine
whose speed drifts over minutes (a shared VM) from passing its drift off as a ceiling: each round
gives its own ratio, and their spread shows the noise.

ceiling = the median over rounds of t_alone / t_together (median step times; t_together the
slowest process's median): what strong-scaling efficiency t1 / (N tN) can reach on this host
when the N ranks share its memory bandwidth and caches, with a perfect exchange and perfect
balance. ``bench distributed`` states its efficiencies against 1 and against this ceiling, so a
figure that moves between machines says whether the machine or hvdtrack moved it.

Public symbols: ``Ceiling``, ``measure_ceiling``, ``rank_share``, ``main``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import queue
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

from hvdtrack.errors import ConfigError, HvdtrackError

BARRIER_TIMEOUT_S = 600.0  # building and warming up a step; a process that never gets there fails


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """Median step seconds, per round, of one process alone and of each of N at once."""

    processes: int
    nodes: int
    edges: int
    alone_s: list[float]  # per round
    together_s: list[list[float]]  # per round, per process in core-slice order
    graphs: str = "synthetic"  # or "training": real graphs of the training split

    @classmethod
    def from_json(cls, fields: dict) -> Ceiling:
        """From ``ceiling.json``; one written before rounds (a number and a list) is one round,
        one without "graphs" of the synthetic graph."""
        alone, together = fields["alone_s"], fields["together_s"]
        if not isinstance(alone, list):
            alone, together = [alone], [together]
        graphs = fields.get("graphs", "synthetic")
        return cls(fields["processes"], fields["nodes"], fields["edges"], alone, together, graphs)

    @property
    def ratios(self) -> list[float]:
        """t_alone / t_together of each round (t_together: the slowest process)."""
        return [a / max(t) for a, t in zip(self.alone_s, self.together_s)]

    @property
    def ceiling(self) -> float:
        return float(statistics.median(self.ratios))

    def figures(self) -> dict:
        return {**dataclasses.asdict(self), "ratios": self.ratios, "ceiling": self.ceiling}

    def describe(self) -> str:
        def ms(values):
            return ", ".join(f"{1e3 * v:.1f}" for v in values)

        return (
            f"step of {self.nodes} nodes / {self.edges} edges ({self.graphs} graphs), "
            f"{len(self.alone_s)} rounds: "
            f"alone {ms(self.alone_s)} ms; {self.processes} at once (slowest) "
            f"{ms(max(t) for t in self.together_s)} ms -> t_alone/t_together "
            f"{', '.join(f'{r:.3f}' for r in self.ratios)}; ceiling (median) {self.ceiling:.3f}"
        )


def rank_share(dataset_dir: str | os.PathLike, graphs: float) -> tuple[int, int]:
    """(nodes, edges) of ``graphs`` mean graphs of a prepared dataset's training split (its
    ``report.json``). ConfigError naming the file when it is missing or holds no such split."""
    path = Path(dataset_dir) / "report.json"
    try:
        train = json.loads(path.read_text())["splits"]["train"]
        nodes, edges = float(train["nodes_mean"]), float(train["edges_mean"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{path}: no mean graph size of a training split ({err}); prepare the dataset "
            "first (python -m hvdtrack.prepare --config ...) or give --nodes and --edges"
        ) from None
    return max(1, round(nodes * graphs)), max(1, round(edges * graphs))


def measure_ceiling(
    config: Optional[str],
    processes: int,
    nodes: int,
    edges: int,
    repeats: int = 10,
    warmup: int = 2,
    overrides: Sequence[str] = (),
    rounds: int = 3,
    training: Optional[tuple[str, float]] = None,
) -> Ceiling:
    """Times the step alone and ``processes`` at once, ``rounds`` times in turn (see the
    module docstring), on a synthetic graph of ``nodes`` / ``edges``, or with ``training``
    (dataset directory, graphs) on that many mean-size graphs of its training split
    (``nodes`` / ``edges`` then theirs).

    Raises:
      HvdtrackError: fewer cores than processes, or a process that failed or did not reach
        a barrier within ``BARRIER_TIMEOUT_S``; with ``training``, a dataset without a
        training split of that many graphs (``workload.mean_size_graphs``).
    """
    cpus = sorted(os.sched_getaffinity(0))
    if processes < 1 or len(cpus) < processes:
        raise ConfigError(
            f"--processes {processes}: this process may run on {len(cpus)} cores; the ceiling "
            "needs one core slice per process"
        )
    if training is not None:
        from hvdtrack.bench.workload import mean_size_graphs

        _, nodes, edges = mean_size_graphs(*training)
    job = dict(config=config, nodes=nodes, edges=edges, repeats=repeats, warmup=warmup)
    job.update(overrides=list(overrides), rounds=rounds, processes=processes, training=training)
    per = len(cpus) // processes
    results = _run_together(job, [cpus[i * per : (i + 1) * per] for i in range(processes)])
    alone = results[0][0]
    together = [[results[i][1][r] for i in range(processes)] for r in range(rounds)]
    graphs = "synthetic" if training is None else "training"
    return Ceiling(processes, nodes, edges, alone, together, graphs)


def _run_together(job: dict, slices: list[list[int]]) -> list[tuple[list, list]]:
    """Per process (one per core slice): its median step seconds alone (process 0 only) and
    together, per round."""
    context = multiprocessing.get_context("spawn")  # a fresh TensorFlow in each
    barrier, results = context.Barrier(len(slices)), context.Queue()
    workers = [
        context.Process(target=_time_step, args=(job, cores, i, barrier, results), daemon=True)
        for i, cores in enumerate(slices)
    ]
    for worker in workers:
        worker.start()
    medians: dict[int, tuple[list, list]] = {}
    limit = 2 * BARRIER_TIMEOUT_S * (1 + 2 * job["rounds"])
    try:
        while len(medians) < len(workers):
            try:
                index, alone, together, error = results.get(timeout=limit)
            except queue.Empty:
                raise HvdtrackError(
                    f"a ceiling process gave no result within {limit:g} s"
                ) from None
            if error:
                raise HvdtrackError(f"ceiling process {index} failed: {error}")
            medians[index] = (alone, together)
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    return [medians[i] for i in range(len(workers))]


def _time_step(job: dict, cores: list[int], index: int, barrier, results) -> None:
    """One process: pinned to ``cores`` before TensorFlow starts, one thread per core; per
    round, times the step alone (process 0; the others wait), then with the others."""
    try:
        os.sched_setaffinity(0, cores)
        from hvdtrack.bench import model, workload
        from hvdtrack.entry import TRAINING, choose_allocator, start

        start(TRAINING)
        argv = ["--threads", str(len(cores)), "--nodes", str(job["nodes"])]
        argv += ["--edges", str(job["edges"])]
        argv += [] if job["config"] is None else ["--config", job["config"]]
        for override in job["overrides"]:
            argv += ["--set", override]
        args = model.parse_args(argv)
        # model.keep_edge_term: auto, for this process's share of the memory (as training's ranks)
        from hvdtrack.utils.memory import usable_memory_bytes

        memory = usable_memory_bytes()
        args.memory_budget = memory // job["processes"] if memory else None
        choose_allocator(workload.run_config(args).model.memory_first)
        if job["training"] is None:
            graph = workload.synthetic_graph(job["nodes"], job["edges"])
        else:
            graph = workload.training_graph(*job["training"])
        step = workload.step_fn(workload.build_step(args), *graph)
        for _ in range(job["warmup"]):
            step()
        alone, together = [], []
        for _ in range(job["rounds"]):
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            if index == 0:
                alone.append(workload.time_calls(step, 0, job["repeats"]).median)
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            together.append(workload.time_calls(step, 0, job["repeats"]).median)
        results.put((index, alone, together, None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises
        _abort(barrier)
        results.put((index, [], [], f"{type(err).__name__}: {err}"))


def _abort(barrier) -> None:
    """Releases the other processes waiting at ``barrier`` (they fail at once, not at its
    timeout)."""
    try:
        barrier.abort()
    except Exception:  # noqa: BLE001 - best effort
        pass


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench ceiling", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--config", default="configs/default.yaml")
    add("--processes", type=int, default=2, help="processes at once (ranks per host; default 2)")
    add("--graphs", type=float, default=1.0, help="mean graphs per process step (default 1)")
    add("--nodes", type=int, default=None, help="nodes of the step's graph (default: --graphs)")
    add("--edges", type=int, default=None, help="edges of the step's graph (default: --graphs)")
    add(
        "--training-graphs",
        action="store_true",
        help="the step on --graphs real graphs of the training split, not a synthetic graph",
    )
    add("--repeats", type=int, default=10, help="timed steps (default 10)")
    add("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    add("--rounds", type=int, default=3, help="alone / together rounds in turn (default 3)")
    add("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if (args.nodes is None) != (args.edges is None):
        parser.error("give both --nodes and --edges, or neither")
    if args.training_graphs and args.nodes is not None:
        parser.error("--training-graphs takes its graphs' sizes: no --nodes / --edges")
    if min(args.repeats, args.warmup, args.processes, args.rounds) < 1:
        parser.error("--repeats, --warmup, --processes and --rounds must be >= 1")
    if not (math.isfinite(args.graphs) and args.graphs > 0):
        parser.error(f"--graphs {args.graphs}: a number of graphs > 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    nodes, edges, training = args.nodes, args.edges, None
    if nodes is None:
        from hvdtrack.config import load_config, resolve_config_path

        config = load_config(resolve_config_path(args.config), [])
        if args.training_graphs:  # sizes from the graphs chosen (measure_ceiling)
            nodes, edges, training = 0, 0, (config.data.dataset_dir, args.graphs)
        else:
            nodes, edges = rank_share(config.data.dataset_dir, args.graphs)
    result = measure_ceiling(
        args.config, args.processes, nodes, edges, args.repeats, args.warmup, rounds=args.rounds,
        training=training,
    )  # fmt: skip
    print(result.describe())
    if args.json:
        from hvdtrack.utils.io import write_json

        write_json(args.json, result.figures())
    return 0


if __name__ == "__main__":
    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
