"""Benchmark of the training step that ``hvdtrack train`` runs: time, share of the matmul rate, memory.

    python -m hvdtrack.bench model --nodes 5000 10000 --edges 40000 80000 --threads 1
    python -m hvdtrack.bench model --nodes 5000 --edges 40000 --breakdown
    python -m hvdtrack.bench model --memory --nodes 1250 5000 20000 80000 --edges 10000 40000 160000 640000
    python -m hvdtrack.bench model --memory-budget 4GiB --set model.recompute=true

The step is the one ``hvdtrack train`` runs (``hvdtrack.train.step.TrainStep``): the configuration ``--config``
(default: the packaged default) with local workers and ``--set`` overrides (``model.KEY=VALUE``,
``train.KEY=VALUE``; a bare ``KEY=VALUE`` is a model key), the same model, optimizer, gradient
exchange and compiled parts (local, exchange, apply), run by ``TrainStep.run`` on one synthetic graph
per step (random features and endpoints). TensorFlow's intra-op threads are ``--threads``
(``distributed.threads_per_worker``; 0: every core this process may use).

For each size it prints the median wall time of ``--repeats`` steps after ``--warmup`` (with min,
max and the process's CPU time: on shared cores wall time also counts other processes), the
step's matmul FLOPs (``hvdtrack.model.cost``: 2*m*k*n per product, forward and both backward
products), and the step's share of the matmul rate: the rate at which this machine runs the
step's own matmul shapes alone (each [m, k] @ [k, n] and its two gradient products, compiled,
timed in the same run just before the step). ``--breakdown`` groups the step's op time from the
TensorFlow profiler into matmul, gather, segment sum, layer norm, optimizer and other.

``--memory`` measures each size in a fresh process (the allocator keeps what it once held): the
growth of the resident set over the first step and TensorFlow's allocator peak over a later one.
``--memory-budget`` bisects the edge count (nodes = edges / 8) for the largest graph whose step
keeps the process's peak resident set within the budget. ``--json PATH`` keeps every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np

from hvdtrack.bench.profile import CATEGORIES, breakdown, profile_ops
from hvdtrack.entry import TRAINING, start
from hvdtrack.errors import ConfigError, HvdtrackError

NUM_NODE_FEATURES = 3  # the record schema's [r, phi, z]
NUM_EDGE_FEATURES = 4  # [dr, dphi, dz, deta]
EDGES_PER_NODE = 8  # of the bisection's graphs


@dataclasses.dataclass
class Timing:
    """Wall and process-CPU seconds per call of one timed function (warm-up excluded)."""

    seconds: list[float]
    cpu_seconds: list[float]
    median: float = dataclasses.field(init=False)
    cpu_median: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.median = statistics.median(self.seconds)
        self.cpu_median = statistics.median(self.cpu_seconds)

    def describe(self) -> str:
        ms = [1e3 * x for x in (self.median, min(self.seconds), max(self.seconds))]
        return f"{ms[0]:.1f} ms (min {ms[1]:.1f}, max {ms[2]:.1f}; CPU {1e3 * self.cpu_median:.1f})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark; returns the process exit code."""
    args = parse_args(argv)
    # Training's process settings (its allocator), before TensorFlow starts; explicit values win.
    start(TRAINING)
    try:
        if args.probe:
            return _probe(args)
        return _run(args)
    except HvdtrackError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench model", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--config", default=None, help="run configuration (default: the packaged default)")
    add("--nodes", type=int, nargs="+", default=[5000, 10000], help="node counts (5000 10000)")
    add("--edges", type=int, nargs="+", default=None, help="edge counts, one per size or one")
    add("--threads", type=int, default=1, help="intra-op threads, 0 = all cores (default: 1)")
    add("--repeats", type=int, default=5, help="timed steps per size (default: 5)")
    add("--warmup", type=int, default=2, help="untimed steps first, >= 1 (default: 2)")
    add("--breakdown", action="store_true", help="op time by class, from the TF profiler")
    add("--memory", action="store_true", help="peak memory of a step, a fresh process per size")
    add(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="find the largest graph whose step fits in SIZE (e.g. 4GiB, 512MiB)",
    )
    add(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. --set model.layer_norm=false (repeatable)",
    )
    add("--seed", type=int, default=0)
    add("--json", default=None, help="write all figures to this JSON file")
    add("--probe", action="store_true", help=argparse.SUPPRESS)  # one memory measurement
    args = parser.parse_args(argv)
    if args.edges is None:
        args.edges = [EDGES_PER_NODE * n for n in args.nodes]
    elif len(args.edges) == 1:
        args.edges = args.edges * len(args.nodes)
    if len(args.edges) != len(args.nodes):
        parser.error(f"--edges takes 1 or {len(args.nodes)} values, got {len(args.edges)}")
    if min(args.nodes) < 1 or min(args.edges) < 1:
        parser.error("--nodes and --edges must be >= 1")
    if (args.repeats < 1 and not args.probe) or args.warmup < 1:
        parser.error("--repeats and --warmup must be >= 1 (the first step traces and compiles)")
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    if args.memory_budget is not None:
        try:
            args.memory_budget = parse_bytes(args.memory_budget)
        except ValueError as err:
            parser.error(f"--memory-budget: {err}")
    return args


def parse_bytes(text: str) -> int:
    """``"4GiB"`` -> 4294967296; units B, KiB, MiB, GiB, TiB (powers of 1024) and kB, MB, GB, TB."""
    units = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    units.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})
    number = text.strip().rstrip("BbIiKkMmGgTt")
    unit = text.strip()[len(number) :].lower()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size like 4GiB or 512MiB") from None
    if unit not in units or value <= 0:
        raise ValueError(f"{text!r} is not a size like 4GiB or 512MiB")
    return int(value * units[unit])


def _config(args: argparse.Namespace):
    from hvdtrack.config import load_config, resolve_config_path

    overrides = [s if "." in s.partition("=")[0] else f"model.{s}" for s in args.overrides]
    threads = "null" if args.threads == 0 else str(args.threads)
    forced = ["distributed.strategy=local", f"distributed.threads_per_worker={threads}"]
    return load_config(resolve_config_path(args.config), overrides + forced)


def build_step(args: argparse.Namespace):
    """The configured training step (``TrainStep``) over a fresh state, built from the same
    pieces as ``hvdtrack train``'s; its Workers set TensorFlow's threads before any op runs.
    No dataset: a constant learning rate at the configured (scaled) peak."""
    config = _config(args)
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


def _run(args: argparse.Namespace) -> int:
    if args.memory_budget is not None:
        return _largest_graph(args)
    if args.memory:
        return _memory_table(args)
    trainer = build_step(args)
    from hvdtrack.model.cost import num_parameters, train_step_flops

    config = trainer.config.model
    num_params = num_parameters(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES)
    print(f"model: {config}")
    print(f"parameters: {num_params:,}; threads: {trainer.workers.threads}; {_load()}")
    records = []
    for num_nodes, num_edges in zip(args.nodes, args.edges):
        graphs, labels = synthetic_graph(num_nodes, num_edges, args.seed)
        step = step_fn(trainer, graphs, labels)
        flops = train_step_flops(config, num_nodes, num_edges, NUM_NODE_FEATURES, NUM_EDGE_FEATURES)
        matmuls = time_calls(
            model_matmuls_fn(config, num_nodes, num_edges), args.warmup, args.repeats
        )
        timing = time_calls(step, args.warmup, args.repeats)
        rate = flops / matmuls.median
        print(f"\n--- {num_nodes} nodes, {num_edges} edges: {flops / 1e9:.2f} GFLOP of matmuls ---")
        print(f"matmul rate: {rate / 1e9:.1f} GFLOP/s (its matmuls alone: {matmuls.describe()})")
        print(
            f"step: {timing.describe()}: {flops / timing.median / 1e9:.1f} GFLOP/s = "
            f"{100 * matmuls.median / timing.median:.0f}% of the matmul rate (by CPU time: "
            f"{100 * matmuls.cpu_median / timing.cpu_median:.0f}%)"
        )
        record = dict(nodes=num_nodes, edges=num_edges, flops=flops)
        record.update(step=dataclasses.asdict(timing), matmuls=dataclasses.asdict(matmuls))
        if args.breakdown:
            seconds = breakdown(profile_ops(step), trainer.state.optimizer.name)
            total = sum(seconds.values())
            print(f"op time of one step: {total * 1e3:.1f} ms")
            for name in CATEGORIES:
                print(
                    f"  {name:<12} {seconds[name] * 1e3:8.1f} ms {100 * seconds[name] / total:5.1f}%"
                )
            record["breakdown"] = seconds
        records.append(record)
    print(f"\n{_load()}")
    _write_json(args, trainer.config, records)
    return 0


def _write_json(args, config, records) -> None:
    if args.json:
        from hvdtrack import configtools
        from hvdtrack.utils.io import write_json

        write_json(args.json, dict(config=configtools.to_mapping(config), records=records))
        print(f"figures written to {args.json}")


def step_fn(trainer, graphs, labels) -> Callable[[], object]:
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


def model_matmuls_fn(config, num_nodes: int, num_edges: int, seed: int = 0):
    """A compiled function doing exactly the step's counted matmuls, nothing else.

    For each matmul of the step (``cost.step_matmuls``), per call: y = x @ w, dx = dy @ w^T
    (skipped for the encoders' first layers) and dw = x^T @ dy, on random data of the step's
    shapes and compute dtype. Its time is the floor that the model's matmul shapes allow here.
    """
    import tensorflow as tf

    from hvdtrack.model.cost import step_matmuls

    rows = {"nodes": num_nodes, "edges": num_edges}
    rng = np.random.default_rng(seed)
    dtype = tf.as_dtype(config.precision)

    def constant(shape):
        return tf.cast(rng.standard_normal(shape, dtype=np.float32), dtype)

    operands = []
    for layer in step_matmuls(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES):
        m = rows[layer.rows]
        x, dy = constant((m, layer.fan_in)), constant((m, layer.fan_out))
        w = constant((layer.fan_in, layer.fan_out))
        operands.append((x, w, dy, layer.calls, layer.input_grad))

    @tf.function
    def matmuls():
        total = tf.constant(0.0, dtype)
        for x, w, dy, calls, input_grad in operands:
            # A graph loop runs the body ``calls`` times (a Python loop would repeat identical
            # products, which grappler merges); each product's first element keeps it alive.
            for _ in tf.range(calls):
                total += (x @ w)[0, 0] + tf.matmul(x, dy, transpose_a=True)[0, 0]
                if input_grad:
                    total += tf.matmul(dy, w, transpose_b=True)[0, 0]
        return total

    return lambda: matmuls().numpy()


def _probe(args: argparse.Namespace) -> int:
    """One size in this fresh process: prints one JSON line of memory figures."""
    import tensorflow as tf

    from hvdtrack.utils import memory

    trainer = build_step(args)
    graphs, labels = synthetic_graph(args.nodes[0], args.edges[0], args.seed)
    step = step_fn(trainer, graphs, labels)
    before = memory.rss_bytes()
    memory.reset_peak()
    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    first_peak = memory.peak_rss_bytes()
    timing = None
    if args.repeats:  # the allocator's peak of a later step (else: since the start)
        tf.config.experimental.reset_memory_stats("CPU:0")
        timing = time_calls(step, 0, args.repeats)
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    print(
        json.dumps(
            dict(
                nodes=args.nodes[0],
                edges=args.edges[0],
                rss_before=before,
                rss_growth=first_peak - before,
                peak_rss=max(first_peak, memory.peak_rss_bytes()),
                allocator_peak=memory.device_peak_bytes(device),
                first_step_s=first_s,
                step_s=timing.median if timing else first_s,
            )
        )
    )
    return 0


def measure_memory(
    args: argparse.Namespace, num_nodes: int, num_edges: int, kill_above: Optional[int] = None
) -> Optional[dict]:
    """Runs ``--probe`` for one size in a fresh process; None when it ran out of memory or its
    resident set passed ``kill_above`` bytes (it is then stopped at once, and only the first
    step runs: the allocator's peak is then that step's)."""
    from hvdtrack.utils.memory import rss_bytes

    repeats = "1" if kill_above is None else "0"
    command = [sys.executable, "-m", "hvdtrack.bench", "model", "--probe", "--repeats", repeats]
    sizes = dict(nodes=num_nodes, edges=num_edges, threads=args.threads, seed=args.seed)
    command += [x for key, value in sizes.items() for x in (f"--{key}", str(value))]
    command += [f"--set={s}" for s in args.overrides]
    if args.config:
        command += ["--config", args.config]
    # Output to files, not pipes: a probe blocked on a full pipe would never end.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        probe = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        while probe.poll() is None:
            if kill_above is not None and (rss_bytes(probe.pid) or 0) > kill_above:
                probe.kill()
                probe.wait()
                return None
            time.sleep(0.1)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if probe.returncode != 0:
        if probe.returncode < 0 or "OOM" in stderr or "MemoryError" in stderr:
            return None  # killed (the kernel's OOM killer) or out of memory
        raise HvdtrackError(f"memory probe failed: {stderr.strip().splitlines()[-1:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _memory_table(args: argparse.Namespace) -> int:
    config = _config(args).model
    print(f"model: {config}\npeak memory of one training step, a fresh process per size")
    print(f"{'nodes':>8} {'edges':>9} {'RSS growth MiB':>15} {'allocator peak MiB':>19} "
          f"{'peak RSS MiB':>13} {'step s':>7}")  # fmt: skip
    records = []
    for num_nodes, num_edges in zip(args.nodes, args.edges):
        r = measure_memory(args, num_nodes, num_edges)
        if r is None:
            print(f"{num_nodes:>8} {num_edges:>9}  out of memory")
            continue
        print(
            f"{num_nodes:>8} {num_edges:>9} {_mib(r['rss_growth']):>15} "
            f"{_mib(r['allocator_peak']):>19} {_mib(r['peak_rss']):>13} {r['step_s']:>7.2f}"
        )
        records.append(r)
    _write_json(args, _config(args), records)
    return 0


def _largest_graph(args: argparse.Namespace) -> int:
    """Bisects edges (nodes = edges / 8) for the largest step whose peak RSS fits the budget."""
    budget = args.memory_budget
    print(f"largest graph whose training step's peak RSS fits {budget / 2**30:.2f} GiB")

    def fits(num_edges: int) -> Optional[dict]:
        r = measure_memory(args, max(1, num_edges // EDGES_PER_NODE), num_edges, budget)
        ok = r is not None and r["peak_rss"] <= budget
        peak = "over budget, stopped" if r is None else f"peak RSS {_mib(r['peak_rss'])} MiB"
        print(f"  {num_edges:>9} edges: {peak} -> {'fits' if ok else 'too big'}", flush=True)
        return r if ok else None

    low, high, best = 0, 10_000, None
    while (r := fits(high)) is not None:  # double until a size does not fit
        low, best, high = high, r, 2 * high
    while high - low > max(1000, low // 25):  # then bisect to 4%
        middle = (low + high) // 2
        if (r := fits(middle)) is not None:
            low, best = middle, r
        else:
            high = middle
    if best is None:
        raise ConfigError(
            f"--memory-budget: not even 10000 edges fit in {args.memory_budget} bytes"
        )
    print(
        f"largest: {best['edges']} edges, {best['nodes']} nodes (peak RSS {_mib(best['peak_rss'])} "
        f"MiB, step {best['step_s']:.2f} s); {high} edges do not fit"
    )
    _write_json(args, _config(args), [best])
    return 0


def _load() -> str:
    import os

    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def time_calls(fn: Callable[[], object], warmup: int, repeats: int) -> Timing:
    for _ in range(warmup):
        fn()
    seconds, cpu_seconds = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - start_cpu)
    return Timing(seconds, cpu_seconds)


if __name__ == "__main__":
    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
