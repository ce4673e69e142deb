"""Benchmark of one segment-classifier training step: graphs/s, edges/s and FLOP/s vs. matmul.

    python -m hvdtrack.bench.model                  # 1k, 5k, 10k nodes with 8x edges, 1 thread
    python -m hvdtrack.bench.model --nodes 10000 --edges 40000 --modes sparse sparse-xla dense

For each synthetic graph size (random features, random senders / receivers, one graph per step)
it times a compiled training step (forward, weighted BCE, tape.gradient, snt.optimizers.Adam)
after warm-up, and prints the median, min and max over ``--repeats`` runs of the wall time, and
the median CPU time of this process (on shared cores the wall time also counts the time other
processes hold the core; with one thread the CPU time does not). Modes:

- ``sparse``: ``SegmentClassifier`` (graph_nets blocks) in a ``tf.function`` whose input
  signature has dynamic node and edge counts (``utils_tf.specs_from_graphs_tuple``), as in
  training;
- ``sparse-factorized``: the same with ``factorized_edge_update=True`` (same model and weights,
  fewer FLOPs: see ``hvdtrack.model.classifier.FactorizedEdgeUpdate``);
- ``sparse-xla``: ``sparse`` with ``jit_compile=True``; XLA needs static shapes (segment sums
  take the node count as a compile-time constant), so it is traced for the exact size;
- ``dense``: ``DenseSegmentClassifier`` (incidence matrices Ri, Ro of N x E floats each); run only
  when both fit in ``--dense-max-gb`` and the step, estimated from its FLOPs at the matmul rate,
  takes under ``--dense-max-seconds``; otherwise the reason is printed.

FLOPs are counted analytically for the matmuls each mode runs (``hvdtrack.model.cost``: 2*m*k*n
per forward product, x3 for forward + backward, x2 where no input gradient is needed; gathers,
segment sums, element-wise ops and the optimizer are not counted; the dense mode adds its
incidence products). The practical ceiling is a compiled ``tf.linalg.matmul`` of two
``--matmul-size`` square float32 matrices on the same threads, measured in the same run before
each graph size; FLOP/s are given as a share of it both by wall time and by CPU time.
``--breakdown`` times the step's matmuls alone (same shapes, forward and both backward products),
splitting the step into matmul time and everything else; ``--profile`` prints the time per op
type of one step from the TensorFlow profiler. ``--bfc-allocator`` switches TensorFlow's CPU
allocator to its caching one (no page faults on big tensors). ``--json PATH`` keeps every timing
as data.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from hvdtrack import configtools
from hvdtrack.errors import HvdtrackError

NUM_NODE_FEATURES = 3  # [r, phi, z] as in the studies
NUM_EDGE_FEATURES = 4  # [dr, dphi, dz, deta]
MODES = ("sparse", "sparse-factorized", "sparse-xla", "dense")


@dataclasses.dataclass
class Timing:
    """Wall and process-CPU seconds per call of one timed function (warm-up excluded)."""

    seconds: list[float]
    cpu_seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)

    def describe(self) -> str:
        return (
            f"{self.median * 1e3:.1f} ms (min {min(self.seconds) * 1e3:.1f}, max "
            f"{max(self.seconds) * 1e3:.1f}; CPU {self.cpu_median * 1e3:.1f} ms)"
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark; returns the process exit code."""
    args = _parse_args(argv)
    try:
        return _run(args)
    except HvdtrackError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench.model", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add(
        "--nodes",
        type=int,
        nargs="+",
        default=[1000, 5000, 10000],
        help="node counts of the synthetic graphs (default: 1000 5000 10000)",
    )
    add(
        "--edges",
        type=int,
        nargs="+",
        default=None,
        help="edge counts, one per --nodes value or one for all (default: 8 x nodes)",
    )
    add(
        "--threads",
        type=int,
        default=1,
        help="TensorFlow intra-op threads (0 = TensorFlow's default)",
    )
    add(
        "--inter-threads",
        type=int,
        default=None,
        help="TensorFlow inter-op threads (default: same as --threads)",
    )
    add(
        "--modes",
        nargs="+",
        choices=MODES,
        default=["sparse", "sparse-factorized", "dense"],
        help="what to time (default: sparse sparse-factorized dense)",
    )
    add("--repeats", type=int, default=5, help="timed runs per measurement (default: 5)")
    add("--warmup", type=int, default=2, help="untimed runs first, >= 1 (default: 2)")
    add(
        "--matmul-size",
        type=int,
        default=2048,
        help="side of the square matmul giving the FLOP/s ceiling (default: 2048)",
    )
    add(
        "--breakdown",
        action="store_true",
        help="also time the step's matmuls alone (sparse and sparse-factorized modes)",
    )
    add(
        "--profile",
        action="store_true",
        help="print the time per op type of one step (sparse and sparse-factorized modes)",
    )
    add(
        "--dense-max-gb",
        type=float,
        default=2.0,
        help="skip the dense baseline when Ri + Ro exceed this many GB (default: 2)",
    )
    add(
        "--dense-max-seconds",
        type=float,
        default=30.0,
        help="skip the dense baseline when one step is estimated to take longer (default: 30)",
    )
    add(
        "--bfc-allocator",
        action="store_true",
        help="use TensorFlow's caching BFC CPU allocator (sets TF_CPU_ALLOCATOR_USE_BFC=true)",
    )
    add(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model config override, e.g. --set num_message_passing_steps=4 (repeatable)",
    )
    add("--seed", type=int, default=0)
    add("--json", default=None, help="write all timings to this JSON file")
    args = parser.parse_args(argv)
    if args.edges is None:
        args.edges = [8 * n for n in args.nodes]
    elif len(args.edges) == 1:
        args.edges = args.edges * len(args.nodes)
    if len(args.edges) != len(args.nodes):
        parser.error(f"--edges takes 1 or {len(args.nodes)} values, got {len(args.edges)}")
    if min(args.nodes) < 1 or min(args.edges) < 1:
        parser.error("--nodes and --edges must be >= 1")
    if args.repeats < 1 or args.warmup < 1:
        parser.error("--repeats and --warmup must be >= 1 (the first run traces and compiles)")
    return args


def _run(args: argparse.Namespace) -> int:
    allocator = _configure_allocator(args.bfc_allocator)
    threads = _configure_threads(args.threads, args.inter_threads)
    # Imported after the thread settings: they must be fixed before TensorFlow starts its pools.
    from hvdtrack.model import ModelConfig
    from hvdtrack.model.cost import num_parameters

    mapping = configtools.apply_overrides({}, args.overrides)
    config = configtools.from_mapping(ModelConfig, mapping, where="model", source="--set")
    num_params = num_parameters(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES)
    print(f"model: {config}")
    print(f"parameters: {num_params:,} ({4 * num_params / 1e6:.2f} MB of float32 gradients)")
    print(f"CPU allocator: {allocator}")
    print(
        f"threads: intra-op {threads[0]}, inter-op {threads[1]}; load average before: "
        f"{_load_average()} (other processes may share the cores)"
    )
    records: list[dict] = []
    matmul = _matmul_fn(args.matmul_size, args.seed)
    for num_nodes, num_edges in zip(args.nodes, args.edges):
        print(f"\n--- {num_nodes} nodes, {num_edges} edges ---")
        # The ceiling is measured again for every size, so that the ratios compare figures
        # taken under the same load.
        timing = _time(matmul, args.warmup, args.repeats)
        ceiling = _Ceiling(2 * args.matmul_size**3, timing)
        print(
            f"ceiling, matmul {args.matmul_size}^2 float32: {timing.describe()}: "
            f"{ceiling.flops / timing.median / 1e9:.1f} GFLOP/s "
            f"(per CPU second {ceiling.flops / timing.cpu_median / 1e9:.1f})"
        )
        records.append(
            dict(
                kind="matmul",
                size=args.matmul_size,
                nodes=num_nodes,
                flops=ceiling.flops,
                threads=threads,
                **dataclasses.asdict(timing),
            )
        )
        graphs, labels = synthetic_graph(num_nodes, num_edges, args.seed)
        medians = {}
        for mode in args.modes:
            median = _bench_mode(args, config, mode, graphs, labels, ceiling, records)
            if median is not None:
                medians[mode] = median
        for mode, median in medians.items():
            if mode != "sparse" and "sparse" in medians:
                print(f"{mode} takes {median / medians['sparse']:.2f}x the time of sparse")
    print(f"\nload average after: {_load_average()}")
    if args.json:
        from hvdtrack.utils.io import write_json

        write_json(args.json, dict(config=configtools.to_mapping(config), records=records))
        print(f"timings written to {args.json}")
    return 0


@dataclasses.dataclass
class _Ceiling:
    flops: int
    timing: Timing

    def percent(self, flops: float, timing: Timing) -> str:
        """``flops`` done in ``timing`` as GFLOP/s and as a share of the ceiling."""
        wall = flops / timing.median / (self.flops / self.timing.median)
        cpu = flops / timing.cpu_median / (self.flops / self.timing.cpu_median)
        return (
            f"{flops / timing.median / 1e9:.1f} GFLOP/s = {100 * wall:.0f}% of matmul "
            f"(per CPU second: {100 * cpu:.0f}%)"
        )


def _bench_mode(args, config, mode, graphs, labels, ceiling, records) -> Optional[float]:
    """Times one mode on one graph; prints and records the figures; returns the median."""
    from hvdtrack.model.cost import dense_incidence_flops, train_step_flops

    num_nodes, num_edges = int(graphs.n_node[0]), int(graphs.n_edge[0])
    size = dict(mode=mode, nodes=num_nodes, edges=num_edges)
    mode_config = _mode_config(config, mode)
    flops = train_step_flops(
        mode_config, num_nodes, num_edges, NUM_NODE_FEATURES, NUM_EDGE_FEATURES
    )
    if mode == "dense":
        flops += dense_incidence_flops(config, num_nodes, num_edges)
        estimate = flops / ceiling.flops * ceiling.timing.cpu_median / max(1, args.threads)
        reason = _dense_skip_reason(
            num_nodes, num_edges, flops, estimate, args.dense_max_gb, args.dense_max_seconds
        )
        if reason:
            print(f"{mode}: skipped, {reason}")
            records.append(dict(kind="step", skipped=reason, **size))
            return None
    step = training_step_fn(mode_config, graphs, labels, mode)
    timing = _time(step, args.warmup, args.repeats)
    print(
        f"{mode}: {timing.describe()} per step; {1 / timing.median:.3f} graphs/s, "
        f"{num_edges / timing.median / 1e3:.1f}k edges/s; {flops / 1e9:.1f} GFLOP of "
        f"matmuls: {ceiling.percent(flops, timing)}"
    )
    records.append(dict(kind="step", flops=flops, **size, **dataclasses.asdict(timing)))
    if args.breakdown and mode in ("sparse", "sparse-factorized"):
        matmuls = model_matmuls_fn(mode_config, num_nodes, num_edges, args.seed)
        only = _time(matmuls, args.warmup, args.repeats)
        rest = 1 - only.cpu_median / timing.cpu_median
        print(
            f"  its matmuls alone: {only.describe()}: {ceiling.percent(flops, only)}; the rest "
            f"(gathers, segment sums, concat/slice, element-wise, Adam) {100 * rest:.0f}% of "
            f"the step's CPU time"
        )
        records.append(dict(kind="matmuls_only", flops=flops, **size, **dataclasses.asdict(only)))
    if args.profile and mode in ("sparse", "sparse-factorized"):
        by_op = profile_op_types(step)
        total = sum(by_op.values())
        if by_op:
            print(f"  profile of one step: {total * 1e3:.1f} ms in TensorFlow ops")
        for op, seconds in sorted(by_op.items(), key=lambda kv: -kv[1])[:10]:
            print(f"    {op:<22} {seconds * 1e3:9.1f} ms {100 * seconds / total:5.1f}%")
        records.append(dict(kind="profile", seconds_by_op=by_op, **size))
    return timing.median


def _mode_config(config, mode: str):
    if mode == "sparse-factorized":
        return dataclasses.replace(config, factorized_edge_update=True)
    return config


def _configure_allocator(use_bfc: bool) -> str:
    """Switches TensorFlow's CPU allocator to its caching BFC allocator if asked.

    The default CPU allocator returns large buffers to the system, so every step faults in (and
    the kernel zeroes) fresh pages for its [E, width] tensors: about a third of the step's CPU
    time at 80k edges goes to the kernel. ``TF_CPU_ALLOCATOR_USE_BFC`` is read when TensorFlow
    starts, so it only takes effect if TensorFlow is not imported yet.
    """
    import os

    if use_bfc:
        if "tensorflow" in sys.modules:
            print("note: TensorFlow is already imported; --bfc-allocator has no effect")
        else:
            os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true"):
        return "BFC (TF_CPU_ALLOCATOR_USE_BFC=true)"
    return "TensorFlow default"


def _configure_threads(threads: int, inter: Optional[int]) -> tuple[int, int]:
    import tensorflow as tf

    inter = threads if inter is None else inter
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        # TensorFlow already started (e.g. main() called from a test): keep what is set.
        print("note: TensorFlow was already initialised; thread settings left unchanged")
    return (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )


def synthetic_graph(num_nodes: int, num_edges: int, seed: int = 0):
    """A random one-graph ``GraphsTuple`` (features N(0, 1), endpoints uniform) and 0/1 labels.

    Returns:
      (graphs, labels): nodes float32 [N, 3], edges float32 [E, 4], senders / receivers int32
      [E], globals zeros [1, 1]; labels float32 [E] (1 where the first edge feature is > 0).
    """
    import tensorflow as tf
    from graph_nets import utils_tf

    rng = np.random.default_rng(seed)
    edges = rng.standard_normal((num_edges, NUM_EDGE_FEATURES), dtype=np.float32)
    graph = dict(
        nodes=rng.standard_normal((num_nodes, NUM_NODE_FEATURES), dtype=np.float32),
        edges=edges,
        senders=rng.integers(0, num_nodes, num_edges, dtype=np.int32),
        receivers=rng.integers(0, num_nodes, num_edges, dtype=np.int32),
        globals=np.zeros(1, np.float32),
    )
    graphs = utils_tf.data_dicts_to_graphs_tuple([graph])
    return graphs, tf.constant((edges[:, 0] > 0).astype(np.float32))


def training_step_fn(config, graphs, labels, mode: str) -> Callable[[], object]:
    """Returns a no-argument callable running one compiled training step on (graphs, labels).

    Model and optimizer variables are created eagerly first (one forward, one zero update), so
    the compiled step only reads and updates them.
    """
    import sonnet as snt
    import tensorflow as tf
    from graph_nets import utils_tf

    from hvdtrack.model import DenseSegmentClassifier, SegmentClassifier, weighted_bce

    model = DenseSegmentClassifier(config) if mode == "dense" else SegmentClassifier(config)
    optimizer = snt.optimizers.Adam(learning_rate=1e-3)
    model(graphs)
    optimizer.apply(
        [tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables
    )
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    dynamic = mode != "sparse-xla"
    signature = [
        utils_tf.specs_from_graphs_tuple(
            graphs, dynamic_num_nodes=dynamic, dynamic_num_edges=dynamic
        ),
        tf.TensorSpec([None] if dynamic else labels.shape, tf.float32),
    ]

    @tf.function(input_signature=signature, jit_compile=mode == "sparse-xla")
    def step(graphs, labels):
        with tf.GradientTape() as tape:
            loss = weighted_bce(model(graphs), labels)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: step(graphs, labels).numpy()


def model_matmuls_fn(config, num_nodes: int, num_edges: int, seed: int = 0):
    """A compiled function doing exactly the step's counted matmuls, nothing else.

    For each matmul of the step (``cost.step_matmuls``), per call: y = x @ w, dx = dy @ w^T (skipped
    for the encoders' first layers) and dw = x^T @ dy, on random float32 data of the step's
    shapes. Its time is the floor that the model's matmul shapes allow.
    """
    import tensorflow as tf

    from hvdtrack.model.cost import step_matmuls

    rows = {"nodes": num_nodes, "edges": num_edges}
    rng = np.random.default_rng(seed)
    operands = []
    for layer in step_matmuls(config, NUM_NODE_FEATURES, NUM_EDGE_FEATURES):
        m = rows[layer.rows]
        x = tf.constant(rng.standard_normal((m, layer.fan_in), dtype=np.float32))
        w = tf.constant(rng.standard_normal((layer.fan_in, layer.fan_out), dtype=np.float32))
        dy = tf.constant(rng.standard_normal((m, layer.fan_out), dtype=np.float32))
        operands.append((x, w, dy, layer.calls, layer.input_grad))

    @tf.function
    def matmuls():
        total = tf.constant(0.0)
        for x, w, dy, calls, input_grad in operands:
            # A graph loop (tf.range) runs the body ``calls`` times; a Python loop would repeat
            # identical products, which grappler merges (common subexpression elimination).
            # Each product is summed into ``total`` so that none can be pruned.
            for _ in tf.range(calls):
                total += tf.reduce_sum(x @ w) + tf.reduce_sum(tf.matmul(x, dy, transpose_a=True))
                if input_grad:
                    total += tf.reduce_sum(tf.matmul(dy, w, transpose_b=True))
        return total

    return lambda: matmuls().numpy()


def profile_op_types(fn: Callable[[], object], warmup: int = 1) -> dict[str, float]:
    """Seconds spent per TensorFlow op type in one call of ``fn`` (TensorFlow profiler).

    MatMuls are split into forward and gradient (``gradient_tape/`` name scope) ones. Returns an
    empty dict when the profiler's trace format cannot be read (it is not a public API).
    """
    import glob
    import tempfile

    import tensorflow as tf

    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        print("note: the profiler trace format is not available; --profile skipped")
        return {}
    for _ in range(warmup):
        fn()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            fn()
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
    by_op: dict[str, float] = {}
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:  # executor bookkeeping, not an op
                    continue
                op = name.rsplit(":", 1)[-1]
                if op == "MatMul":
                    op += " (gradient)" if name.startswith("gradient_tape/") else " (forward)"
                by_op[op] = by_op.get(op, 0.0) + event.duration_ps * 1e-12
    return by_op


def _load_average() -> str:
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _matmul_fn(n: int, seed: int) -> Callable[[], object]:
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    a = tf.constant(rng.standard_normal((n, n), dtype=np.float32))
    b = tf.constant(rng.standard_normal((n, n), dtype=np.float32))
    matmul = tf.function(lambda: tf.linalg.matmul(a, b))
    return lambda: matmul().numpy()


def _dense_skip_reason(num_nodes, num_edges, flops, estimate, max_gb, max_seconds) -> str:
    incidence_gb = 2 * num_nodes * num_edges * 4 / 1e9
    if incidence_gb > max_gb:
        return (
            f"Ri + Ro need {incidence_gb:.1f} GB (> --dense-max-gb {max_gb:g}), "
            "before activations"
        )
    if estimate > max_seconds:
        return (
            f"one step is {flops / 1e9:.0f} GFLOP, about {estimate:.0f} s at the matmul "
            f"rate (> --dense-max-seconds {max_seconds:g})"
        )
    return ""


def _time(fn: Callable[[], object], warmup: int, repeats: int) -> Timing:
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
    sys.exit(main())
