"""Read-throughput benchmark of the training input pipeline on a synthetic dataset.

    python -m hvdtrack.bench.read                      # about 40 s on 2 cores, 190 MB
    python -m hvdtrack.bench.read --graphs 64 --repeats 2

Writes random HitGraphs of realistic size (about 5k nodes / 40k edges, sizes varying +-30%) into a
temporary directory, once uncompressed and once gzip-compressed, then times whole epochs of
``train_dataset`` as the only worker and as worker 0 of 2: uncompressed shards read by record
offset (the default) and streamed, gzip shards streamed (a streaming worker reads every shard
holding any of its graphs but parses only its own graphs). The first epoch of each setting is
warm-up and not reported; figures are the median over the measured epochs (read back to back by one
dataset), with min-max spread. MB/s counts the graph bytes delivered to the worker; "scanned MB/s"
counts shard-file bytes read; "setup s" is what a fresh one-epoch dataset costs before its first
batch and at teardown; "resume s" what it costs to its first batch when it starts at the epoch's
last step (a resume), the earlier steps left out before reading against read, parsed and dropped.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hvdtrack.graphs.construction import HitGraph
from hvdtrack.inputs.pipeline import plan_train_epoch, train_dataset
from hvdtrack.records import RecordsConfig, encode_graph, open_dataset, write_dataset
from hvdtrack.records.schema import FIELDS


def random_graphs(num_graphs: int, num_nodes: int, num_edges: int, seed: int) -> list[HitGraph]:
    """Random graphs whose node and edge counts vary uniformly by +-30% around the given sizes."""
    rng = np.random.default_rng(seed)
    graphs = []
    for index in range(num_graphs):
        n = int(num_nodes * rng.uniform(0.7, 1.3))
        e = int(num_edges * rng.uniform(0.7, 1.3))
        graphs.append(
            HitGraph(
                nodes=rng.random((n, 3), dtype=np.float32),
                edges=rng.standard_normal((e, 4), dtype=np.float32),
                senders=rng.integers(0, n, e, dtype=np.int32),
                receivers=rng.integers(0, n, e, dtype=np.int32),
                labels=(rng.random(e) < 0.1).astype(np.float32),
                hit_id=np.arange(n, dtype=np.int64),
                event_id=index // 16,
                section=index % 16,
                num_true_segments=e // 10,
            )
        )
    return graphs


def array_bytes(num_nodes: np.ndarray, num_edges: np.ndarray) -> np.ndarray:
    """Bytes of the arrays of graphs with these node and edge counts [G], as the schema stores them."""
    size = {"N": 0, "E": 0}
    for field in FIELDS:
        if field.is_array:
            size[field.shape[0]] += np.dtype(field.dtype).itemsize * (field.feature_size or 1)
    return num_nodes * size["N"] + num_edges * size["E"]


def time_epochs(
    dataset_dir: Path,
    manifest,
    num_workers: int,
    worker: int,
    batch_graphs: int,
    repeats: int,
    random_access: bool,
) -> dict:
    """Times one worker reading ``repeats`` epochs (after a warm-up epoch) through one dataset,
    separately the setup of a fresh one-epoch dataset (build, first batch, teardown), and a
    resume's first batch at the epoch's last step, its earlier steps left out / read and
    dropped."""
    table = manifest.split_table("train")
    graph_bytes = array_bytes(table.num_nodes, table.num_edges)
    shard_bytes = np.array([s.num_bytes for s in manifest.shards_in("train")], dtype=np.int64)
    plans = [
        plan_train_epoch(
            manifest, num_workers, batch_graphs, seed=0, epoch=e, random_access=random_access
        )
        for e in range(repeats + 1)
    ]
    epoch_ends = set(np.cumsum([p.num_steps for p in plans]).tolist())
    marks = [time.perf_counter()]
    edges_per_epoch = [0]
    for step, (graphs, _) in enumerate(train_dataset(dataset_dir, manifest, plans, worker)):
        edges_per_epoch[-1] += int(graphs.n_edge.numpy().sum())
        if step + 1 in epoch_ends:
            marks.append(time.perf_counter())
            edges_per_epoch.append(0)
    seconds = np.diff(marks)[1:]  # epoch 0 is warm-up: tracing, thread pools, page cache
    median = float(np.median(seconds))
    ids = [p.worker_graph_ids(worker) for p in plans[1:]]
    graphs = float(np.mean([len(i) for i in ids]))
    delivered = float(np.mean([graph_bytes[i].sum() for i in ids]))
    # Reading by offset reads only this worker's records; streaming reads every shard holding
    # any of them, whole (with a few workers, every shard).
    if random_access:
        scanned = delivered * shard_bytes.sum() / graph_bytes.sum()
    else:
        scanned = float(np.mean([shard_bytes[np.unique(table.shard[i])].sum() for i in ids]))
    setups = []
    for plan in plans[:2]:
        start = time.perf_counter()
        iterator = iter(train_dataset(dataset_dir, manifest, plan, worker))
        next(iterator)
        del iterator  # tears the pipeline down (joins its threads)
        setups.append(time.perf_counter() - start)
    last = plans[1].num_steps - 1  # a resume at an epoch's last step: left out, or read and dropped
    resumes = []
    for skip, drop in ((last, 0), (0, last)):
        start = time.perf_counter()
        iterator = iter(
            train_dataset(dataset_dir, manifest, plans[1], worker, skip=skip).skip(drop)
        )
        next(iterator)
        del iterator
        resumes.append(time.perf_counter() - start)
    return {
        "graphs_per_s": graphs / median,
        "edges_per_s": float(np.mean(edges_per_epoch[1:-1])) / median,
        "mb_per_s": delivered / median / 1e6,
        "scanned_mb_per_s": scanned / median / 1e6,
        "seconds": median,
        "spread": (float(seconds.min()), float(seconds.max())),
        "setup": setups[-1],
        "resume": resumes,
        "imbalance": (plans[-1].mean_imbalance, float(plans[-1].unbalanced_step_imbalance.mean())),
    }


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line: dataset size, graphs per step and per shard, measured epochs, seed."""
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench.read", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--graphs", type=int, default=160, help="graphs in the dataset")
    parser.add_argument("--nodes", type=int, default=5000, help="mean nodes per graph")
    parser.add_argument("--edges", type=int, default=40000, help="mean edges per graph")
    parser.add_argument("--batch-graphs", type=int, default=4, help="graphs per worker per step")
    parser.add_argument("--graphs-per-shard", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="measured epochs per setting")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def encoded_dataset(args: argparse.Namespace, start: float) -> list:
    """The random graphs encoded as records; prints their size and the time since ``start``."""
    graphs = random_graphs(args.graphs, args.nodes, args.edges, args.seed)
    encoded = [encode_graph(g) for g in graphs]
    del graphs
    record_mb = sum(len(e.example) for e in encoded) / 1e6
    print(
        f"dataset: {args.graphs} graphs, ~{args.nodes} nodes / ~{args.edges} edges each, "
        f"{record_mb:.0f} MB of records; batch_graphs={args.batch_graphs}, "
        f"graphs_per_shard={args.graphs_per_shard} (made in {time.perf_counter() - start:.1f} s)"
    )
    return encoded


def write_and_open(encoded: list, dataset_dir: Path, compression: str, args: argparse.Namespace):
    """Writes the records with ``compression`` and opens the dataset, checksums verified;
    prints the write rate and the verification time; returns the manifest."""
    config = RecordsConfig(
        graphs_per_shard=args.graphs_per_shard, compression=compression, seed=args.seed
    )
    t0 = time.perf_counter()
    write_dataset({"train": encoded}, dataset_dir, config)
    t1 = time.perf_counter()
    manifest = open_dataset(dataset_dir, verify=True)
    t2 = time.perf_counter()
    file_mb = sum(s.num_bytes for s in manifest.shards) / 1e6
    print(
        f"{compression}: wrote {file_mb:.0f} MB in {t1 - t0:.1f} s "
        f"({file_mb / (t1 - t0):.0f} MB/s); checksums verified in {t2 - t1:.2f} s"
    )
    return manifest


def result_row(compression: str, random_access: bool, num_workers: int, result: dict) -> str:
    """One row of the table: the setting, then the figures ``time_epochs`` measured for it."""
    who = "1 (only)" if num_workers == 1 else "0 of 2"
    how = "offset" if random_access else "stream"
    low, high = result["spread"]
    balanced, unbalanced = result["imbalance"]
    return (
        f"{compression:<11} {how:<8} {who:<9} {result['graphs_per_s']:>9.1f} "
        f"{result['edges_per_s'] / 1e6:>9.2f} {result['mb_per_s']:>7.0f} "
        f"{result['scanned_mb_per_s']:>12.0f} "
        f"{result['seconds']:>8.2f} ({low:.2f}-{high:.2f}) {result['setup']:>8.2f} "
        f"{result['resume'][0]:>6.2f} / {result['resume'][1]:.2f} "
        f"{balanced:>7.3f} / {unbalanced:.3f}"
    )


def measure_compression(
    encoded: list, dataset_dir: Path, compression: str, args: argparse.Namespace
) -> list[str]:
    """Writes the dataset with one compression and times worker 0 of 1 and of 2 in each reading
    mode (by offset and streamed uncompressed, streamed only for gzip); returns the table rows."""
    manifest = write_and_open(encoded, dataset_dir, compression, args)
    modes = (True, False) if compression == "none" else (False,)
    rows = []
    for random_access, num_workers in itertools.product(modes, (1, 2)):
        result = time_epochs(
            dataset_dir, manifest, num_workers, 0, args.batch_graphs, args.repeats, random_access
        )
        rows.append(result_row(compression, random_access, num_workers, result))
    return rows


def print_table(rows: list[str], start: float) -> None:
    """Prints the table of results with its header and legend, then the time since ``start``."""
    print(
        f"{'compression':<11} {'reading':<8} {'workers':<9} {'graphs/s':>9} {'Medges/s':>9} {'MB/s':>7} "
        f"{'scanned MB/s':>12} {'epoch s (min-max)':>20} {'setup s':>7} {'resume s':>13} "
        f"{'edge imbalance':>16}"
    )
    print("\n".join(rows))
    print(
        "resume s: a fresh dataset's first batch at an epoch's last step, its earlier steps "
        "left out (train_dataset(skip=)) / read and dropped (Dataset.skip), one run each; "
        "streamed, left out opens only the shards still to read"
    )
    print(
        "edge imbalance: mean over steps of max/mean edges per worker, balanced plan / "
        "consecutive assignment (1.000 with one worker)"
    )
    print(f"total {time.perf_counter() - start:.1f} s")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark described in the module docstring; returns the exit status."""
    args = parse_args(argv)
    start = time.perf_counter()
    encoded = encoded_dataset(args, start)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdtrack-bench-read-") as tmp:
        for compression in ("none", "gzip"):
            rows += measure_compression(encoded, Path(tmp) / compression, compression, args)
    print_table(rows, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
