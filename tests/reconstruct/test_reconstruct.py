"""``hvdtrack reconstruct``: the run's graphs, scores and tracks on event files; with truth its
score is evaluate's, without truth every hit is still in the submission; bad input is named."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from hvdtrack.entry import run
from hvdtrack.errors import DataError
from hvdtrack.reconstruct.__main__ import main
from hvdtrack.reconstruct.inputs import OUTSIDE_MM, event_prefixes, input_graphs, read_input


def split_events(dataset):
    """The prefixes of the dataset's test split events, which prepare kept as CSVs."""
    graphs = json.loads((dataset / "manifest.json").read_text())["graphs"]
    ids = sorted({g["event_id"] for g in graphs if g["split"] == "test"})
    return [str(dataset / "events" / f"event{i:09d}") for i in ids]


def test_with_truth_it_scores_what_evaluate_scores(tiny_run, tiny_dataset, tmp_path, capsys):
    from hvdtrack.evaluate.__main__ import main as evaluate

    assert evaluate(["--run", str(tiny_run)]) == 0
    evaluated = json.loads((tiny_run / "evaluate-test/metrics.json").read_text())
    chains = evaluated["tracks"]["chains"]
    assert chains["reconstructed"] > 0  # something to compare
    out = tmp_path / "out"
    events = split_events(tiny_dataset)
    assert main(["--run", str(tiny_run), "--out", str(out), "--score", *events]) == 0
    assert "score: TrackML score" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == summary["events_with_pt_cut"] == evaluated["events"]
    for key in ("checkpoint_path", "step"):  # the same weights
        assert summary[key] == evaluated[key], key
    assert summary["graphs"] == evaluated["graphs"]
    assert summary["edges"] == evaluated["edges"]["num_edges"]
    for key in ("trackml_score", "trackml_score_in_graphs", "efficiency", "fake_rate"):
        assert summary["score"][key] == pytest.approx(chains[key], abs=1e-6), key
    for key in ("reconstructable", "reconstructed", "tracks"):
        assert summary["score"][key] == chains[key], key
    for name in sorted(p.name for p in (tiny_run / "evaluate-test/submissions").iterdir()):
        expected = pd.read_csv(tiny_run / "evaluate-test/submissions" / name)
        pd.testing.assert_frame_equal(pd.read_csv(out / name), expected)


def test_without_truth_every_hit_of_the_region_is_in_the_graphs(tiny_run, tiny_dataset, tmp_path):
    (event,) = split_events(tiny_dataset)[:1]
    shutil.copy(f"{event}-hits.csv", tmp_path)  # hits only: no truth, particles nor cells
    out = tmp_path / "out"
    assert main(["--run", str(tiny_run), "--out", str(out), str(tmp_path)]) == 0
    hits = pd.read_csv(f"{event}-hits.csv")
    (written,) = out.glob("*-submission.csv")
    frame = pd.read_csv(written)
    assert list(frame.columns) == ["event_id", "hit_id", "track_id"]
    assert frame["hit_id"].tolist() == hits["hit_id"].tolist()  # every hit, in file order
    assert (frame["track_id"] > 0).any()
    summary = json.loads((out / "summary.json").read_text())
    barrel = hits["volume_id"].isin([8, 13, 17]).sum()  # tiny: data.graph.barrel_only
    assert (summary["events_with_pt_cut"], summary["graph_hits"]) == (0, barrel)
    assert sorted(p.name for p in out.iterdir()) == [written.name, "summary.json"]


def _hits(tmp_path, event_id=1, **columns):
    """A hits file of three barrel hits (pixel layers 2, 4, 6 at phi 0), changed by ``columns``."""
    hits = pd.DataFrame(
        dict(hit_id=[1, 2, 3], x=[32.0, 72.0, 116.0], y=0.0, z=[1.0, 2.0, 3.0],
             volume_id=8, layer_id=[2, 4, 6], module_id=1)
    )  # fmt: skip
    for name, value in columns.items():
        if value is None:
            hits = hits.drop(columns=name)
        else:
            hits[name] = value
    path = tmp_path / f"event{event_id:09d}-hits.csv"
    hits.to_csv(path, index=False)
    return path


def test_bad_input_is_named_with_its_file_and_line(tiny_run, tmp_path, capsys):
    from hvdtrack.graphs.construction import GraphConfig

    good = read_input(str(_hits(tmp_path, 1))[: -len("-hits.csv")])
    assert not good.has_truth and not good.cut
    assert [g.num_nodes for g in input_graphs(good, GraphConfig())] == [3]

    path = _hits(tmp_path, 2, z=None)
    with pytest.raises(DataError, match=rf"{path}: missing column\(s\) z"):
        read_input(str(path)[: -len("-hits.csv")])
    far = 116.0 + OUTSIDE_MM + 1  # hit 3 on the layer at r 116 mm
    path = _hits(tmp_path, 3, x=[32.0, 72.0, far])
    with pytest.raises(DataError, match=rf"{path}: line 4: hit_id 3 at r {far:.1f} mm.* outside"):
        read_input(str(path)[: -len("-hits.csv")])
    path = _hits(tmp_path, 4, x=[32.0, 72.0, 116.0 + OUTSIDE_MM - 1])
    read_input(str(path)[: -len("-hits.csv")])  # within the margin
    with pytest.raises(DataError, match="event 1 is also"):
        event_prefixes([str(tmp_path / "event000000001"), str(_hits(tmp_path, 1))])

    # An end-cap event: no hit in the barrel, the tiny run's graph region; the command exits 2
    # and writes nothing.
    endcap = tmp_path / "endcap"
    endcap.mkdir()
    x = [40.0, 60.0, 80.0]
    path = _hits(endcap, 5, x=x, z=[-1500.0, -1300.0, -1100.0], volume_id=7, layer_id=[2, 4, 6])
    out = tmp_path / "out"
    assert run(main, ["--run", str(tiny_run), "--out", str(out), str(endcap)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: event 5 has no hit on the barrel layers" in err
    assert not out.exists() or not any(out.iterdir())
    assert np.all(pd.read_csv(path)["x"] == x)  # the input is untouched
