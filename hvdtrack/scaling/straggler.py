"""The straggler term of the scaling model (``scaling.maths.straggler_wait``): the wait for the
slowest of N ranks, E[max] - mean of their work.

Where a run's training graphs are known, the ranks are what training plans for them: their
edges step by step in the epoch plans of ``hvdtrack.inputs.balance.plan_epoch`` (with
``train.sort_window`` a step's graphs are of similar size, which no draw of independent ranks
models). Otherwise the ranks are independent draws from one distribution (``expected_max``).

Public symbols: ``training_graphs``, ``planned_shares``, ``planned_straggler``,
``independent_straggler``, ``expected_max``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.inputs.balance import plan_epoch
from hvdtrack.records.manifest import Manifest, manifest_digest
from hvdtrack.runs.timing import Run

# Plans are drawn until this many steps are pooled.
MIN_STEPS = 64


def training_graphs(run: Run, notes: list[str]) -> tuple[tuple[float, ...], int]:
    """The edges of ``run``'s training graphs, from the manifest of the dataset its run.json
    names, and the sort window its plans applied (1 for streamed shards or a run before
    ``train.sort_window``). ((), 1), with a note appended to ``notes``, when that dataset is
    not there or is not the one run.json names by digest."""
    config = run.info.get("config") or {}
    dataset = (config.get("data") or {}).get("dataset_dir")
    window = int((config.get("train") or {}).get("sort_window") or 1)
    try:
        if not isinstance(dataset, str):
            raise DataError("run.json records no data.dataset_dir")
        manifest = Manifest.load(dataset)
        recorded = run.info.get("dataset_digest")
        if recorded and manifest_digest(dataset) != recorded:
            raise DataError(f"{dataset} is not the dataset the run trained on (another digest)")
        edges = manifest.split_table("train", dataset).num_edges
    except (DataError, OSError) as err:
        notes.append(
            f"straggler: the training graphs' sizes were not found ({err}); the ranks are "
            "taken as independent draws of the N=1 steps' edges"
        )
        return (), 1
    if manifest.compression != "none":
        window = 1  # streamed shards keep their order (hvdtrack.inputs.pipeline)
    notes.append(
        f"straggler: the ranks' edges from epoch plans over the {len(edges)} training graphs "
        f"of {dataset} (sort window {window})"
    )
    return tuple(float(x) for x in edges), window


def planned_shares(
    graph_edges: tuple[float, ...], graphs_per_step: int, sort_window: int, n: int, mode: str
) -> Optional[np.ndarray]:
    """float64 [steps, n] each rank's edges at each step of epoch plans for ``n`` ranks over
    ``graph_edges`` (with the sort window training gives them, repeated to fill four windows),
    pooled over epochs until ``MIN_STEPS`` steps. Strong scaling: the N=1 run's
    ``graphs_per_step`` shared by the ranks; weak: that many per rank. None where no plan can
    be drawn: graph sizes unknown (), or strong scaling with ``graphs_per_step`` not divisible
    by ``n``."""
    if not graph_edges or (mode == "strong" and graphs_per_step % n):
        return None
    per_rank = graphs_per_step // n if mode == "strong" else graphs_per_step
    per_step = n * per_rank
    graphs = np.asarray(graph_edges, dtype=np.int64)
    # the window training applies to these graphs (plan_epoch: at most a quarter of an epoch)
    window = min(sort_window, max(1, graphs.size // per_step // 4))
    population = np.resize(graphs, max(graphs.size, per_step * 4 * window))
    shares: list[np.ndarray] = []
    while sum(len(x) for x in shares) < MIN_STEPS:
        plan = plan_epoch(population, n, per_rank, 0, len(shares), sort_window=window)
        shares.append(plan.edges.astype(np.float64))
    return np.concatenate(shares)


def planned_straggler(work: np.ndarray, noise: np.ndarray, draws: int = 4_000_000) -> float:
    """Mean over steps of E[max over ranks of work + r] - mean of work, ``work`` [steps, n]
    seconds, r drawn independently for each rank from ``noise``: a fixed-seed draw of about
    ``draws`` values (exact without noise), so the figure is deterministic."""
    steps, n = work.shape
    if np.allclose(noise, 0.0, rtol=0.0, atol=1e-12):
        return float(np.mean(work.max(axis=1) - work.mean(axis=1)))
    rng = np.random.default_rng(0)
    per_step = max(16, draws // (steps * n))
    waits = [
        (row + rng.choice(noise, size=(per_step, n))).max(axis=1).mean() - row.mean()
        for row in work
    ]
    return float(np.mean(waits))


def independent_straggler(work: np.ndarray, noise: np.ndarray, n: int) -> float:
    """E[max] - mean of ``n`` independent ranks' work w + r, w drawn from ``work`` and r from
    ``noise`` independently (seconds), exact over the empirical distributions."""
    total = np.add.outer(_quantiles(np.asarray(work)), _quantiles(np.asarray(noise)))
    return expected_max(total, n) - float(total.mean())


def expected_max(values: Sequence[float] | np.ndarray, n: int) -> float:
    """E[max of ``n`` independent draws] from the empirical distribution of ``values`` [M],
    exactly: sum_i x_(i) ((i/M)^n - ((i-1)/M)^n) over the sorted values x_(1) <= ... <= x_(M)."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0 or n < 1:
        raise ValueError(f"expected_max needs values and n >= 1, got {x.size} values, n={n}")
    cdf = np.arange(x.size + 1, dtype=np.float64) / x.size
    return float(np.dot(x, cdf[1:] ** n - cdf[:-1] ** n))


def _quantiles(x: np.ndarray, most: int = 1000) -> np.ndarray:
    """``x``, or ``most`` evenly spaced quantiles of it when it has more values."""
    return x if x.size <= most else np.quantile(x, np.linspace(0.0, 1.0, most))
