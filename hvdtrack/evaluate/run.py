"""The evaluation of a trained run on a split (``python -m hvdtrack.evaluate`` describes it).

Scores every graph of the split with the run's checkpoint (``score_events``), builds and scores
tracks per event (``tracking``), and writes ``RUN/evaluate-SPLIT/``: the submissions, plots and
TensorBoard records (``outputs``), then ``metrics.json``.

The dataset may be another than the run's (``--dataset-dir``): synthetic or TrackML events, any
pT cut, as long as its graphs' features are the run's (``dataset_data``); its truth and pT cut
come from its own ``prepare.json``.

Public symbols: ``ScoredSplit``, ``open_run``, ``dataset_data``, ``score_events``,
``unfinished_warning``, ``evaluate_run``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hvdtrack.config import Config, DataConfig
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.evaluate import outputs, tracking
from hvdtrack.evaluate.inference import (
    check_output,
    check_threshold,
    load_classifier,
    score_split,
)
from hvdtrack.model import metrics as edge_lib
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.prepare.jobs import PREPARE_INFO, prepared_data
from hvdtrack.records.manifest import Manifest, open_dataset
from hvdtrack.runs.timing import RUN_INFO_FILE
from hvdtrack.tracks import building
from hvdtrack.train.checkpoints import number
from hvdtrack.utils.io import write_json


@dataclasses.dataclass(frozen=True)
class ScoredSplit:
    """The edge scores of a split. ``by_event``: event id -> [(graph, its edge scores)];
    ``scores``, ``labels``: every edge, by event; ``edges``: the edge metrics."""

    by_event: dict[int, list]
    scores: np.ndarray
    labels: np.ndarray
    edges: dict

    @property
    def graphs(self) -> int:
        return sum(len(sections) for sections in self.by_event.values())


def open_run(
    run_dir: Path, checkpoint: str, dataset_dir: Optional[str], split: str
) -> tuple[SegmentClassifier, Config, str, DataConfig, Manifest]:
    """The run's model, config and the checkpoint prefix loaded (``load_classifier``), the
    evaluated dataset's data config (``dataset_data``) and its manifest, which must hold
    ``split``."""
    if not run_dir.is_dir():
        raise ConfigError(
            f"{run_dir}: no such run directory - give --run the run_dir of a trained run"
        )
    model, config, path = load_classifier(run_dir, checkpoint)
    data = dataset_data(run_dir, config.data, dataset_dir)
    manifest = open_dataset(data.dataset_dir, splits=[split], required=[split])
    return model, config, path, data, manifest


def dataset_data(run_dir: Path, trained: DataConfig, dataset_dir: Optional[str]) -> DataConfig:
    """The data config of the dataset to evaluate (``dataset_dir``, default the run's own): the
    one its ``prepare.json`` records, so its truth (synthetic seed or TrackML directory) and pT
    cut are its own, not the run's. A dataset without one (``records.write_dataset``) is taken
    only as the run's own dataset, which the run's config describes.

    Raises:
      DataError: a dataset of another's without ``prepare.json``, or graphs whose features the
        run's model was not trained on (``GraphConfig.feature_scales`` differ), naming both.
    """
    directory = dataset_dir or trained.dataset_dir
    data = prepared_data(directory)
    if data is None:
        if Path(directory).resolve() != Path(trained.dataset_dir).resolve():
            raise DataError(
                f"{directory} has no {PREPARE_INFO}: evaluating run {run_dir} on another dataset "
                f"needs the record of how that dataset was prepared (where its events' truth is) "
                "- give --dataset-dir a dataset made by hvdtrack prepare"
            )
        return dataclasses.replace(trained, dataset_dir=str(directory))
    theirs, ours = data.graph.feature_scales, trained.graph.feature_scales
    differ = [f"{k} {theirs[k]:g} (run: {ours[k]:g})" for k in ours if theirs[k] != ours[k]]
    if differ:
        raise DataError(
            f"the model of run {run_dir} cannot take the graphs of dataset {directory}: their "
            f"features are scaled otherwise, data.graph {', '.join(differ)} in "
            f"{Path(directory) / PREPARE_INFO} against {run_dir / 'config.yaml'} - prepare the "
            "dataset again with the run's data.graph feature scales"
        )
    return data


def score_events(
    model: SegmentClassifier,
    config: Config,
    data: DataConfig,
    manifest: Manifest,
    split: str,
    threshold: float,
) -> ScoredSplit:
    """Scores every graph of ``split`` with ``model``; the edge metrics at ``threshold`` (the
    unsuffixed efficiency, purity, accuracy) and at the config's other ``train.thresholds``."""
    by_event: dict[int, list] = collections.defaultdict(list)
    for graph, scores in score_split(
        model, data.dataset_dir, manifest, split, config.train.batch_graphs
    ):
        by_event[graph.event_id].append((graph, scores))
    parts = [p for event in by_event.values() for p in event]
    scores = np.concatenate([s for _, s in parts])
    labels = np.concatenate([g.labels for g, _ in parts])
    others = [t for t in config.train.thresholds if t != threshold]
    edges = edge_lib.edge_metrics(scores, labels, [threshold, *others])
    return ScoredSplit(by_event, scores, labels, edges)


def unfinished_warning(run_dir: Path, checkpoint: str, step: Optional[int]) -> Optional[str]:
    """A warning when ``run.json`` says the run has not finished (running, stopped, failed):
    its ``checkpoint`` (of optimizer step ``step``, None when unnumbered) is not the trained
    model's last. None for a finished run or no run.json."""
    try:
        status = json.loads((Path(run_dir) / RUN_INFO_FILE).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    if status in (None, "finished"):
        return None
    return (
        f"warning: run {run_dir} has not finished ({RUN_INFO_FILE} status: {status}); "
        f"evaluating its '{checkpoint}' checkpoint" + ("" if step is None else f" of step {step}")
    )


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    dataset_dir: Optional[str] = None,
    threshold: Optional[float] = None,
    pt_min: Optional[float] = None,
    min_hits: int = 5,
    min_track_hits: int = 3,
    output: Optional[str | Path] = None,
    on_warning: Optional[Callable[[str], None]] = None,
) -> dict:
    """Evaluates a run on a split and writes ``RUN/evaluate-SPLIT/`` (see ``hvdtrack.evaluate``).

    Args:
      run_dir: a training run directory.
      split: the dataset split to evaluate.
      checkpoint: "best", "latest" or a checkpoint path.
      dataset_dir: the dataset (default: the run's ``data.dataset_dir``); its truth and pT cut
        are its own (``dataset_data``).
      threshold: edge score threshold (default: the run's first ``train.thresholds``).
      pt_min: reconstructable particles have pT > pt_min (default: the graphs' pT cut) ...
      min_hits: ... and at least this many hits in the graphs.
      min_track_hits: tracks of fewer hits are dropped.
      output: where to write (default ``RUN/evaluate-SPLIT``, and the TensorBoard records into
        ``RUN/tensorboard``; given: both into it, so a read-only run can be evaluated).
      on_warning: called with the unfinished-run warning (``unfinished_warning``) as soon as
        the checkpoint is loaded, before the scoring; the result keeps it as ``warning``.

    Returns:
      The metrics written to ``metrics.json``.

    Raises:
      ConfigError: no run directory, config or checkpoint; a threshold outside (0, 1); an
      output that cannot be written (checked before scoring); DataError: no such split, damaged
      records, a dataset the model cannot take, or truth that does not fit the graphs.
    """
    started = time.perf_counter()
    check_threshold(threshold)
    run_dir = Path(run_dir)
    model, config, path, data, manifest = open_run(run_dir, checkpoint, dataset_dir, split)
    warning = unfinished_warning(run_dir, checkpoint, number(path))  # the run's status as loaded
    if warning and on_warning is not None:
        on_warning(warning)
    threshold = config.train.thresholds[0] if threshold is None else threshold
    pt_min = data.graph.pt_min if pt_min is None else pt_min
    # Another dataset's evaluation goes beside the run's own, never over it.
    own = Path(data.dataset_dir).resolve() == Path(config.data.dataset_dir).resolve()
    name = split if own else f"{Path(data.dataset_dir).resolve().name}-{split}"
    out = run_dir / f"evaluate-{name}" if output is None else Path(output)
    board = run_dir / "tensorboard" if output is None else out / "tensorboard"
    for target in (out, board):
        check_output(target, "--output")
    scored = score_events(model, config, data, manifest, split, threshold)
    (out / "submissions").mkdir(parents=True, exist_ok=True)
    limits = (threshold, pt_min, min_hits, min_track_hits)
    tracks = tracking.evaluate_tracks(scored.by_event, data, *limits, out / "submissions")
    result = {
        "run_dir": str(run_dir),
        "split": split,
        "out": str(out),
        "checkpoint": checkpoint,
        "checkpoint_path": path,
        "step": number(path),
        "dataset_dir": str(data.dataset_dir),
        "events": len(scored.by_event),
        "graphs": scored.graphs,
        "threshold": threshold,
        "reconstructable": {"pt_min": pt_min, "min_hits": min_hits},
        "min_track_hits": min_track_hits,
        "submissions_from": building.METHODS[0],
        "edges": scored.edges,
        "tracks": tracks,
    }
    title = f"{run_dir.name}, {split} split" + ("" if own else f" of {Path(data.dataset_dir).name}")
    figures = outputs.make_figures(
        scored.scores, scored.labels, scored.edges, tracks, threshold, title
    )
    outputs.write_figures(out, figures)
    outputs.write_tensorboard(board, name, result["step"] or 0, scored.edges, tracks, figures)
    if warning:
        result["warning"] = warning
    result["seconds"] = round(time.perf_counter() - started, 2)
    write_json(out / "metrics.json", result)
    return result
