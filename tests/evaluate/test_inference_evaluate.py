"""The evaluation command on a trained tiny run: edge and track metrics, files, clear errors."""

import json

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.model.metrics import roc_auc, roc_curve


def test_roc_curve_by_hand():
    fpr, tpr = roc_curve(np.array([0.9, 0.4, 0.5, 0.1]), np.array([1, 1, 0, 0]))
    assert fpr.tolist() == [0, 0, 0.5, 0.5, 1] and tpr.tolist() == [0, 0.5, 0.5, 1, 1]
    # Ties are one point; the area under the points is the AUC.
    scores, labels = np.array([0.7, 0.5, 0.5]), np.array([1, 1, 0])
    fpr, tpr = roc_curve(scores, labels)
    assert fpr.tolist() == [0, 0, 1] and tpr.tolist() == [0, 0.5, 1]
    assert np.trapezoid(tpr, fpr) == roc_auc(scores, labels)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_dataset):
    from hvdtrack.config import load_config
    from hvdtrack.train.loop import fit
    from hvdtrack.train.trainer import Trainer

    from ..conftest import REPO

    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    config = load_config(
        REPO / "configs/tiny.yaml",
        [
            f"data.dataset_dir={tiny_dataset}",
            f"train.run_dir={run_dir}",
            "train.progress_bar=false",
            "train.epochs=6",
        ],
    )
    fit(Trainer(config))
    return run_dir


def test_evaluate_writes_metrics_plots_submissions_and_tensorboard(tiny_run, capsys):
    from hvdtrack.evaluate.__main__ import main

    assert main(["--run", str(tiny_run)]) == 0
    printed = capsys.readouterr().out
    assert "TrackML score" in printed and "edges : AUC" in printed
    out = tiny_run / "evaluate-test"
    result = json.loads((out / "metrics.json").read_text())
    assert result["events"] == 1 and result["graphs"] == 2  # one test event in 2 phi sections
    assert 0.5 < result["edges"]["auc"] <= 1
    for method in ("walk", "components"):
        t = result["tracks"][method]
        assert 0 <= t["trackml_score"] <= t["trackml_score_in_graphs"] <= 1
        assert 0 <= t["efficiency"] <= 1 and 0 <= t["fake_rate"] <= 1
        assert t["reconstructed"] <= t["reconstructable"] > 0
        assert sum(t["efficiency_vs_pt"]["total"]) == t["reconstructable"]
    for name in ("roc", "scores", "efficiency_pt", "efficiency_eta"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    (submission,) = (out / "submissions").glob("*.csv")
    frame = __import__("pandas").read_csv(submission)
    assert frame.columns.tolist() == ["event_id", "hit_id", "track_id"]
    assert frame["hit_id"].is_unique and (frame["track_id"] > 0).any()
    assert len(list((tiny_run / "tensorboard").glob("events.out.tfevents.*"))) >= 2


def test_evaluate_split_keeps_the_edge_metrics(tiny_run):
    from hvdtrack.evaluate.inference import evaluate_split

    result = json.loads((tiny_run / "evaluate-test" / "metrics.json").read_text())
    assert evaluate_split(tiny_run, "test")["auc"] == pytest.approx(result["edges"]["auc"])


def test_evaluate_names_what_is_missing(tiny_run, tmp_path):
    from hvdtrack.evaluate.run import evaluate_run

    with pytest.raises(ConfigError, match=r"nowhere: no such run directory"):
        evaluate_run(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"is not a training run directory \(no config.yaml\)"):
        evaluate_run(tmp_path)
    with pytest.raises(DataError, match=r"has no graphs in split 'holdout'"):
        evaluate_run(tiny_run, "holdout")
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "config.yaml").write_text((tiny_run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=r"no 'best' checkpoint"):
        evaluate_run(empty)
