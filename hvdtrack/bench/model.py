"""Benchmark of the training step that ``hvdtrack train`` runs: time, share of the matmul rate, memory.

    python -m hvdtrack.bench model --nodes 5000 10000 --edges 40000 80000 --threads 1
    python -m hvdtrack.bench model --nodes 5000 --edges 40000 --breakdown
    python -m hvdtrack.bench model --memory --nodes 1250 5000 20000 80000 --edges 10000 40000 160000 640000
    python -m hvdtrack.bench model --memory --nodes 5000 20000 80000 125000 --edges 40000 160000 640000 1000000 --plot docs/memory_per_edge.png
    python -m hvdtrack.bench model --memory-budget 4GiB --set model.recompute=true

The step is the one ``hvdtrack train`` runs (``hvdtrack.train.step.TrainStep``): the configuration ``--config``
(default: the packaged default) with local workers and ``--set`` overrides (``model.KEY=VALUE``,
``train.KEY=VALUE``; a bare ``KEY=VALUE`` is a model key), the same model, optimizer, gradient
exchange and compiled parts (local, exchange, apply), run by ``TrainStep.run`` on one synthetic graph
per step (random features and endpoints; ``hvdtrack.bench.workload``). TensorFlow's intra-op
threads are ``--threads`` (``distributed.threads_per_worker``; 0: every core this process may use).

For each size it prints the median wall time of ``--repeats`` steps after ``--warmup`` (with min,
max and the process's CPU time: on shared cores wall time also counts other processes), the
step's matmul FLOPs (``hvdtrack.model.cost``: 2*m*k*n per product, forward and both backward
products), and the step's share of the matmul rate: the rate at which this machine runs the
step's own matmul shapes alone (each [m, k] @ [k, n] and its two gradient products, compiled),
timed in turn with the step: each round calls the matmuls once and the step once, and the share
is the median over rounds of the matmuls' time over the step's in the same round (each round's
is printed too), so a drift of a shared machine's speed between rounds touches both alike. The
same rounds time passes over memory of the step's edge tensors' size (``memory_passes_fn``):
their rate, and the matmul rate over it (FLOP per byte, the machine's balance: the median over
rounds), say whether a share that moved between sittings moved with the machine. With
``model.recompute`` the FLOPs, the rate and the share stay the plain step's (the same model's
useful work), and a line adds the FLOPs the recomputed step runs
(``cost.recomputed_step_flops``: with what its backward pass computes again). ``--in-cache``
adds the rate of the same products with their inputs in cache (in blocks of rows whose operands
are reused), and the step's share of that. ``--against-plain`` (with
``model.recompute``) also builds the same model's plain step in the same process and times it in
the same rounds: the recomputed step's time over the plain one's, round by round (what
recomputation costs). Both run under the process's allocator, which must be the caching one the
plain step trains with: speed first's; memory first (the system allocator) is compared with
``TF_CPU_ALLOCATOR_USE_BFC=true``. ``--breakdown`` groups the step's op time from the TensorFlow
profiler into matmul, gather, segment sum, layer norm, optimizer and other, and lists the
``TOP_TYPES`` op types that took the most (all of them in ``--json``'s ``op_types``).

``--memory`` (a fresh process per size; ``--plot PATH``: plain and recompute, KiB per edge drawn)
and ``--memory-budget`` (the largest graph that fits) are ``hvdtrack.bench.memory``'s; this module
parses their options and dispatches. ``--json PATH`` keeps every figure.

Public symbols: ``main``, ``parse_args``, ``model_matmuls_fn``, ``MemoryPasses``,
``memory_passes_fn``, ``plain_args``, ``row_blocks``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from hvdtrack.bench import memory
from hvdtrack.bench.profile import CATEGORIES, breakdown, by_type, profile_ops
from hvdtrack.bench.workload import (
    EDGES_PER_NODE,
    NUM_EDGE_FEATURES,
    NUM_NODE_FEATURES,
    build_step,
    round_ratios,
    run_config,
    step_fn,
    synthetic_graph,
    time_in_turn,
    write_figures,
)
from hvdtrack.entry import TRAINING, allocator_in_use, choose_allocator, start
from hvdtrack.errors import HvdtrackError

TOP_TYPES = 15  # op types ``--breakdown`` prints


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark; returns the process exit code."""
    args = parse_args(argv)
    # Training's process settings (its allocator), before TensorFlow starts; explicit values win.
    start(TRAINING)
    try:
        choose_allocator(run_config(args).model.memory_first)
        if args.probe:
            return memory.probe(args)
        return _run(args)
    except HvdtrackError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The bench's command line (``--help``); sizes checked, ``--memory-budget`` in bytes."""
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
    add(
        "--breakdown",
        action="store_true",
        help="op time by class (with --memory: tensors held at the peak), from the TF profiler",
    )
    add(
        "--in-cache",
        action="store_true",
        help="also the matmul rate with inputs in cache: each product in blocks of rows "
        "(a one-thread recompute chunk) whose inputs are reused",
    )
    add(
        "--against-plain",
        action="store_true",
        help="with model.recompute: also the same model's plain step, timed in turn with the "
        "recomputed one, and their ratio round by round",
    )
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
    add("--plot", default=None, metavar="PATH", help="with --memory: plain and recompute, a PNG")
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
            args.memory_budget = memory.parse_bytes(args.memory_budget)
        except ValueError as err:
            parser.error(f"--memory-budget: {err}")
    if args.against_plain and (args.memory or args.memory_budget is not None):
        parser.error("--against-plain times steps: give it without --memory / --memory-budget")
    if args.plot is not None:
        if not args.memory or args.memory_budget is not None:
            parser.error("--plot draws --memory's tables: give --memory (without --memory-budget)")
        if not Path(args.plot).resolve().parent.is_dir():
            parser.error(f"--plot {args.plot}: no directory {Path(args.plot).parent}")
    return args


def _run(args: argparse.Namespace) -> int:
    if args.memory_budget is not None:
        return memory.largest_graph(args)
    if args.memory:
        return memory.memory_table(args)
    trainer = build_step(args)
    from hvdtrack.model.cost import num_parameters, recomputed_step_flops, train_step_flops

    config = trainer.config.model
    num_params = num_parameters(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES)
    print(f"model: {config}")
    print(
        f"parameters: {num_params:,}; threads: {trainer.workers.threads}; "
        f"allocator: {allocator_in_use()}; {_load()}"
    )
    plain = None
    if args.against_plain:
        if not config.recompute:
            raise HvdtrackError(
                "--against-plain compares a recomputed step with the plain one: give --set "
                "model.recompute=true (or a config with it)"
            )
        if allocator_in_use() != "caching":
            raise HvdtrackError(
                "--against-plain times both steps in this process, under its allocator, and "
                "this process runs the system one (memory first chooses it: model.recompute "
                "without model.keep_edge_term); the plain step trains with the caching one. Set "
                "TF_CPU_ALLOCATOR_USE_BFC=true to time both under the caching allocator"
            )
        plain = build_step(plain_args(args))
    records = []
    for num_nodes, num_edges in zip(args.nodes, args.edges):
        graphs, labels = synthetic_graph(num_nodes, num_edges, args.seed)
        step = step_fn(trainer, graphs, labels)
        sizes = (num_nodes, num_edges, NUM_NODE_FEATURES, NUM_EDGE_FEATURES)
        flops = train_step_flops(config, *sizes)
        passes = memory_passes_fn(num_edges, config.edge_latent_size)
        timed = [model_matmuls_fn(config, num_nodes, num_edges), step, passes.fn]
        if args.in_cache:
            from hvdtrack.model.chunks import auto_chunk_edges

            block = auto_chunk_edges(threads=1)
            timed.append(model_matmuls_fn(config, num_nodes, num_edges, block=block))
        if plain is not None:
            timed.append(step_fn(plain, graphs, labels))
        matmuls, timing, streamed, *others = time_in_turn(timed, args.warmup, args.repeats)
        cached = others[:1] if args.in_cache else []
        shares = round_ratios(matmuls, timing)
        cpu_share = statistics.median(round_ratios(matmuls, timing, cpu=True))
        rate = flops / matmuls.median
        print(f"\n--- {num_nodes} nodes, {num_edges} edges: {flops / 1e9:.2f} GFLOP of matmuls ---")
        record = dict(nodes=num_nodes, edges=num_edges, flops=flops)
        if config.recompute:
            again = recomputed_step_flops(config, *sizes)
            record["recomputed_flops"] = again
            print(
                f"recomputed, the step runs {again / 1e9:.2f} GFLOP of matmuls: "
                f"{again / flops:.2f}x the plain step's (rates and shares below are by the plain "
                "step's)"
            )
        print(f"matmul rate: {rate / 1e9:.1f} GFLOP/s (its matmuls alone: {matmuls.describe()})")
        print(
            f"step: {timing.describe()}: {flops / timing.median / 1e9:.1f} GFLOP/s = "
            f"{100 * statistics.median(shares):.0f}% of the matmul rate (rounds: "
            f"{_percents(shares)}; by CPU time: {100 * cpu_share:.0f}%)"
        )
        # the matmul rate over the memory rate, round by round: flops / t_m over bytes / t_s
        balance = [flops * r / passes.bytes for r in round_ratios(streamed, matmuls)]
        print(
            f"memory passes: {passes.bytes / streamed.median / 1e9:.1f} GB/s ({passes.what}: "
            f"{streamed.describe()}); the matmul rate over it: {statistics.median(balance):.1f} "
            "FLOP per byte (rounds: " + " ".join(f"{b:.1f}" for b in balance) + ")"
        )
        record.update(share_rounds=shares, memory_passes=dataclasses.asdict(streamed))
        record.update(memory_pass_bytes=passes.bytes)
        if cached:
            in_cache = round_ratios(cached[0], timing)
            print(
                f"matmul rate with inputs in cache: {flops / cached[0].median / 1e9:.1f} GFLOP/s "
                f"(blocks of {block} rows: {cached[0].describe()}); the step at "
                f"{100 * statistics.median(in_cache):.0f}% of it (rounds: {_percents(in_cache)})"
            )
            record["matmuls_in_cache"] = dataclasses.asdict(cached[0])
        if plain is not None:
            plain_timing = others[-1]
            ratios = round_ratios(timing, plain_timing)
            print(
                "plain step (caching allocator, as the recomputed one's): "
                f"{plain_timing.describe()}; the recomputed step at "
                f"{statistics.median(ratios):.2f}x it (rounds: "
                + " ".join(f"{r:.2f}" for r in ratios)
                + ")"
            )
            record.update(plain_step=dataclasses.asdict(plain_timing), against_plain=ratios)
        record.update(step=dataclasses.asdict(timing), matmuls=dataclasses.asdict(matmuls))
        if args.breakdown:
            ops = profile_ops(step)
            seconds = breakdown(ops, trainer.state.optimizer.name)
            total = sum(seconds.values())
            print(f"op time of one step: {total * 1e3:.1f} ms")
            for name in CATEGORIES:
                print(
                    f"  {name:<12} {seconds[name] * 1e3:8.1f} ms {100 * seconds[name] / total:5.1f}%"
                )
            types = by_type(ops)
            print(f"the {TOP_TYPES} op types with the most time (ms, calls):")
            for op_type, spent, calls in types[:TOP_TYPES]:
                print(f"  {op_type:<28} {spent * 1e3:8.1f} {calls:5d}")
            record["breakdown"] = seconds
            record["op_types"] = [dict(type=t, seconds=s, calls=n) for t, s, n in types]
        records.append(record)
    print(f"\n{_load()}")
    from hvdtrack import configtools

    write_figures(args.json, dict(config=configtools.to_mapping(trainer.config), records=records))
    return 0


def model_matmuls_fn(config, num_nodes: int, num_edges: int, seed: int = 0, block: int = 0):
    """A compiled function doing exactly the step's counted matmuls, nothing else.

    For each matmul of the step (``cost.step_matmuls``), per call: y = x @ w, dx = dy @ w^T
    (skipped for the encoders' first layers) and dw = x^T @ dy, on random data of the step's
    shapes and compute dtype, each product as the plain step takes it (dw by
    ``mlp.weight_gradient``: the kernel library's where it runs, faster here than TensorFlow's
    own product; the output head's two forward products by ``HvdtrackHead``, in one kernel, with
    its bias, ReLU and bits, where ``head.lean_head`` takes them so). Its time is the floor that
    the model's matmul shapes allow here with their operands in memory, as the step's ops find
    them. Two differences stay: ``lean_head`` takes its logit layer's two gradients ([E, H] by
    [E, 1]) without products, which run here as TensorFlow's (they are counted FLOPs); and the
    edge and node updates' last products run here as TensorFlow's, where ``mlp.linear_norm``
    may take them in one kernel with their layer norms (``HvdtrackLinearNorm``): its product
    runs at TensorFlow's rate here, and its norm is no matmul (docs/performance.md, "The edge
    update's last layer and its norm in one kernel").

    ``block`` rows (> 0): each product as ceil(rows / block) products of ``block`` rows (the
    last of the rest) that all read the same operands, which stay in cache: the same FLOPs, at
    the rate this machine's matmuls reach when their inputs were just made, as in a fused or
    chunked computation.
    """
    import tensorflow as tf

    from hvdtrack.model.cost import step_matmuls
    from hvdtrack.model.head import in_one_kernel, is_lean
    from hvdtrack.model.kernels import fused_kernels
    from hvdtrack.model.mlp import weight_gradient

    rows = {"nodes": num_nodes, "edges": num_edges}
    rng = np.random.default_rng(seed)
    dtype = tf.as_dtype(config.precision)

    def constant(shape):
        return tf.cast(rng.standard_normal(shape, dtype=np.float32), dtype)

    # The head's hidden layer and logit in one kernel (as head.lean_head takes them): its
    # forward product runs there with the logit's, which then runs no product of its own.
    one_kernel = is_lean(config, dtype) and in_one_kernel(dtype)
    operands = []
    for layer in step_matmuls(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES):
        head = one_kernel and layer.module == "edge_output"
        for size, repeats in row_blocks(rows[layer.rows], block):
            x, dy = constant((size, layer.fan_in)), constant((size, layer.fan_out))
            w = constant((layer.fan_in, layer.fan_out))
            forward = "head" if head and layer.index == 0 else "none" if head else "matmul"
            operands.append((x, w, dy, layer.calls * repeats, layer.input_grad, forward))

    def product(x, w, forward):
        if forward == "head":
            w2, b2 = tf.ones([w.shape[1], 1], dtype), tf.zeros([1], dtype)
            return fused_kernels().hvdtrack_head(x, w, w[0], w2, b2)[0][0, 0]
        return (x @ w)[0, 0] if forward == "matmul" else tf.constant(0.0, dtype)

    @tf.function
    def matmuls():
        total = tf.constant(0.0, dtype)
        for x, w, dy, calls, input_grad, forward in operands:
            # A graph loop runs the body ``calls`` times (a Python loop would repeat identical
            # products, which grappler merges); each product's first element keeps it alive.
            for _ in tf.range(calls):
                total += product(x, w, forward) + weight_gradient(x, dy)[0, 0]
                if input_grad:
                    total += tf.matmul(dy, w, transpose_b=True)[0, 0]
        return total

    return lambda: matmuls().numpy()


@dataclasses.dataclass(frozen=True)
class MemoryPasses:
    """A compiled function streaming tensors through memory (``memory_passes_fn``)."""

    fn: Callable[[], object]
    bytes: int  # read and written per call
    what: str  # what it does, for a printed line


def memory_passes_fn(rows: int, width: int, passes: int = 8) -> MemoryPasses:
    """``passes`` AddNs of three float32 [rows, width] tensors, each writing one: y = a + b + y,
    the kind of pass over [E, width] that the step makes outside its products (its ``AddN``s,
    bias gradients, gathers), on the step's intra-op threads, four tensors' bytes a pass (in
    float32 whatever the step's precision: a figure of the machine, not of the model). Its
    rate beside the matmul rate, timed in turn, is the machine's balance of the day: a step
    whose non-matmul part streams memory gets a larger share of the matmul rate where that
    balance is lower."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    a, b = (tf.constant(rng.standard_normal((rows, width), dtype=np.float32)) for _ in "ab")

    @tf.function
    def stream():
        # each pass reads the one before: no pass can be merged with another or skipped
        y = tf.zeros_like(a)
        for _ in tf.range(passes):
            y = tf.math.add_n([a, b, y])
        return y[0, 0]

    what = f"{passes} AddNs of three [{rows}, {width}] float32 tensors"
    return MemoryPasses(lambda: stream().numpy(), 4 * passes * rows * width * 4, what)


def plain_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` for the same model's plain step: recompute and what only it allows turned off."""
    off = ["model.recompute=false", "model.keep_edge_term=false", "model.offload=false"]
    return argparse.Namespace(**{**vars(args), "overrides": [*args.overrides, *off]})


def row_blocks(rows: int, block: int) -> list[tuple[int, int]]:
    """``rows`` as (block rows, how many) pairs: ``block`` rows as often as they fit, then the
    rest; all rows at once for ``block`` 0."""
    if not block:
        return [(rows, 1)]
    whole, rest = divmod(rows, block)
    return [(block, whole)] * bool(whole) + [(rest, 1)] * bool(rest)


def _percents(ratios: Sequence[float]) -> str:
    return " ".join(f"{100 * r:.0f}" for r in ratios) + " %"


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
