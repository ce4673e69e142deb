"""Inference from a run directory: load a checkpoint, score new graphs, evaluate a split.

  python -m hvdtrack.train.inference --run-dir runs/default [--split test] [--checkpoint best]

Public symbols: ``load_classifier``, ``to_graphs_tuple``, ``score_graphs``, ``evaluate_split``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
from graph_nets import graphs as gn_graphs

from hvdtrack.config import Config, load_config
from hvdtrack.errors import ConfigError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.inputs import pipeline
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.records.manifest import open_dataset
from hvdtrack.train import metrics as metrics_lib
from hvdtrack.utils.io import write_json


def load_classifier(
    run_dir: str | Path, checkpoint: str = "best"
) -> tuple[SegmentClassifier, Config]:
    """The trained model of a run directory and the run's config.

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
    folder = {"best": run_dir / "best", "latest": run_dir / "checkpoints"}.get(checkpoint)
    path = tf.train.latest_checkpoint(str(folder)) if folder is not None else checkpoint
    if not path:
        raise ConfigError(f"{run_dir}: no '{checkpoint}' checkpoint (looked in {folder})")
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
    return model, config


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
    scores = tf.sigmoid(model(to_graphs_tuple(graphs))[-1]).numpy()
    return np.split(scores, np.cumsum([g.num_edges for g in graphs])[:-1])


def evaluate_split(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    dataset_dir: Optional[str] = None,
) -> dict[str, float]:
    """Edge metrics of a run's model on a whole split (one process), written to RUN/eval-SPLIT.json."""
    model, config = load_classifier(run_dir, checkpoint)
    dataset_dir = dataset_dir or config.data.dataset_dir
    manifest = open_dataset(dataset_dir)
    step = tf.function(
        lambda g: tf.sigmoid(model(g)[-1]), input_signature=[pipeline.input_signature()[0]]
    )
    scores, labels = [], []
    with pipeline.read_errors_as_data_error(dataset_dir, manifest):
        data = pipeline.eval_dataset(dataset_dir, manifest, split, 0, 1, config.train.batch_graphs)
        for graphs, batch_labels in data:
            scores.append(step(graphs).numpy())
            labels.append(batch_labels.numpy())
    result = metrics_lib.edge_metrics(
        np.concatenate(scores), np.concatenate(labels), config.train.thresholds
    )
    write_json(
        Path(run_dir) / f"eval-{split}.json", {"split": split, "checkpoint": checkpoint, **result}
    )
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hvdtrack evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint path")
    parser.add_argument("--dataset-dir", default=None, help="default: the run's data.dataset_dir")
    args = parser.parse_args(argv)
    result = evaluate_split(args.run_dir, args.split, args.checkpoint, args.dataset_dir)
    print(
        f"{args.split}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in result.items() if k != "num_edges")
        + f" ({int(result['num_edges'])} edges)"
    )
    return 0


if __name__ == "__main__":
    from hvdtrack.entry import run

    sys.exit(run(main))
