"""Inference from a run directory: load a checkpoint, score graphs, score or evaluate a split.

The evaluation command (edge and track metrics, plots) is ``python -m hvdtrack.evaluate``.

Public symbols: ``check_threshold``, ``check_output``, ``checkpoint_path``, ``load_classifier``,
``to_graphs_tuple``, ``score_graphs``, ``graph_scorer``, ``score_split``, ``evaluate_split``.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf
from graph_nets import graphs as gn_graphs

from hvdtrack.config import Config, load_config
from hvdtrack.errors import ConfigError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.inputs import pipeline
from hvdtrack.model import metrics as metrics_lib
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.records.manifest import Manifest, open_dataset
from hvdtrack.records.shards import read_split_graphs
from hvdtrack.train.checkpoints import resume_point


def check_threshold(value: Optional[float], option: str = "--threshold") -> None:
    """Refuses an edge score threshold outside (0, 1) or not finite (None: the default).

    Raises:
      ConfigError: naming ``option`` and the value.
    """
    if value is not None and not (math.isfinite(value) and 0.0 < value < 1.0):
        raise ConfigError(f"{option} must be a number between 0 and 1 (exclusive), got {value}")


def check_output(path: Path, option: str) -> None:
    """Refuses, before any work, an output directory that cannot be written: a file is made
    and removed in its nearest existing folder (this catches read-only mounts and immutable
    folders, which permission bits do not show to root).

    Raises:
      ConfigError: naming the path and ``option``, the way to write elsewhere.
    """
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".hvdtrack-probe-")
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(
            f"cannot write {path} ({existing}: {reason}) - give {option} DIR to write the "
            "results elsewhere"
        ) from None
    os.close(fd)
    os.remove(probe)


def checkpoint_path(run_dir: Path, checkpoint: str) -> Optional[str]:
    """The checkpoint prefix ``checkpoint`` names in ``run_dir``: for "best" and "latest" the
    newest intact one in ``best/`` or ``checkpoints/`` (the one a resume would take; None
    without one); any other value is the path itself."""
    folder = {"best": run_dir / "best", "latest": run_dir / "checkpoints"}.get(checkpoint)
    return resume_point(folder).path if folder is not None else checkpoint


def load_classifier(
    run_dir: str | Path, checkpoint: str = "best"
) -> tuple[SegmentClassifier, Config, str]:
    """The trained model of a run directory, the run's config and the checkpoint prefix the
    weights were restored from.

    "best" and "latest" are resolved once, here (``checkpoint_path``): what a caller reports
    (``checkpoints.number`` of the prefix) is what was loaded, even while a training writes newer
    checkpoints.

    Args:
      run_dir: a training run directory (holds ``config.yaml``, ``best/``, ``checkpoints/``).
      checkpoint: "best" (lowest validation loss), "latest", or a checkpoint path.

    Raises:
      ConfigError: no such run directory or checkpoint, or a checkpoint of another model.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a training run directory (no config.yaml)")
    config = load_config(run_dir / "config.yaml")
    path = checkpoint_path(run_dir, checkpoint)
    if not path:
        raise ConfigError(f"{run_dir}: no intact '{checkpoint}' checkpoint")
    model = SegmentClassifier(config.model)
    model(pipeline.placeholder_graph())  # create the variables before restoring into them
    try:
        tf.train.Checkpoint(model=model).restore(
            path
        ).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        raise ConfigError(
            f"checkpoint {path} does not fit the model of {run_dir / 'config.yaml'}: {err}"
        ) from None
    return model, config, path


def to_graphs_tuple(graphs: Sequence[HitGraph]) -> gn_graphs.GraphsTuple:
    """Merges hit graphs into one GraphsTuple (senders/receivers offset), as the pipeline does."""
    n_node = np.array([g.num_nodes for g in graphs], np.int32)
    offsets = np.concatenate([[0], np.cumsum(n_node)[:-1]]).astype(np.int32)
    return gn_graphs.GraphsTuple(
        nodes=tf.constant(np.concatenate([g.nodes for g in graphs]), tf.float32),
        edges=tf.constant(np.concatenate([g.edges for g in graphs]), tf.float32),
        senders=tf.constant(
            np.concatenate([g.senders + o for g, o in zip(graphs, offsets)]), tf.int32
        ),
        receivers=tf.constant(
            np.concatenate([g.receivers + o for g, o in zip(graphs, offsets)]), tf.int32
        ),
        globals=tf.zeros([len(graphs), 1], tf.float32),
        n_node=tf.constant(n_node),
        n_edge=tf.constant([g.num_edges for g in graphs], tf.int32),
    )


def score_graphs(model: SegmentClassifier, graphs: Sequence[HitGraph]) -> list[np.ndarray]:
    """Edge scores (sigmoid of the last step's logit), float32 [E_g] for each graph."""
    return graph_scorer(model)(graphs)


def graph_scorer(model: SegmentClassifier) -> Callable[[Sequence[HitGraph]], list[np.ndarray]]:
    """``score_graphs`` for many calls: one compiled step (any graph size), traced here."""
    step = _scoring_step(model)
    step.get_concrete_function()
    return lambda graphs: [scores for _, scores in _score_batch(step, list(graphs))]


def _scoring_step(model: SegmentClassifier):
    """The model's edge scores as one compiled function of any GraphsTuple size."""
    return tf.function(
        lambda g: tf.sigmoid(model(g)[-1]),
        input_signature=[pipeline.input_signature()[0]],
        autograph=False,  # the model's control flow is tf.cond / tf.while_loop (see Step)
    )


def score_split(
    model: SegmentClassifier,
    dataset_dir: str | Path,
    manifest: Manifest,
    split: str,
    batch_graphs: int = 1,
) -> Iterator[tuple[HitGraph, np.ndarray]]:
    """Yields ``(graph, scores float32 [E])`` for every graph of a split, in manifest order.

    Graphs are scored ``batch_graphs`` at a time by one compiled step (any graph size).

    Raises:
      DataError: an empty split, a damaged shard or a record of another schema version.
    """
    step = _scoring_step(model)
    batch: list[HitGraph] = []
    graphs = (g for _, g in read_split_graphs(dataset_dir, manifest, split))
    for graph in graphs:
        batch.append(graph)
        if len(batch) == batch_graphs:
            yield from _score_batch(step, batch)
            batch = []
    if batch:
        yield from _score_batch(step, batch)


def _score_batch(step, batch: list[HitGraph]) -> Iterator[tuple[HitGraph, np.ndarray]]:
    scores = step(to_graphs_tuple(batch)).numpy()
    yield from zip(batch, np.split(scores, np.cumsum([g.num_edges for g in batch])[:-1]))


def evaluate_split(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    dataset_dir: Optional[str] = None,
) -> dict[str, float]:
    """Edge metrics (``metrics.edge_metrics``) of a run's model on a whole split, one process.

    Raises:
      ConfigError: see ``load_classifier``; DataError: no such split, or damaged records.
    """
    model, config, _ = load_classifier(run_dir, checkpoint)
    dataset_dir = dataset_dir or config.data.dataset_dir
    manifest = open_dataset(dataset_dir, splits=[split], required=[split])
    scored = list(score_split(model, dataset_dir, manifest, split, config.train.batch_graphs))
    return metrics_lib.edge_metrics(
        np.concatenate([s for _, s in scored]),
        np.concatenate([g.labels for g, _ in scored]),
        config.train.thresholds,
    )
