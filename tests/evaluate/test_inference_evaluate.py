"""The evaluation command on a hand-made event whose tracks and edge scores are known, so every
figure it reports is checked against a value worked out by hand; strict JSON; files, clear
errors, and the truth of a prepared dataset (kept or generated again) fitting its graphs; a run
trained on synthetic events evaluated on a TrackML dataset, with the dataset's own truth."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.model.metrics import roc_auc, roc_curve

from ..conftest import REPO


def test_roc_curve_by_hand():
    fpr, tpr = roc_curve(np.array([0.9, 0.4, 0.5, 0.1]), np.array([1, 1, 0, 0]))
    assert fpr.tolist() == [0, 0, 0.5, 0.5, 1] and tpr.tolist() == [0, 0.5, 0.5, 1, 1]
    # Ties are one point; the area under the points is the AUC.
    scores, labels = np.array([0.7, 0.5, 0.5]), np.array([1, 1, 0])
    fpr, tpr = roc_curve(scores, labels)
    assert fpr.tolist() == [0, 0, 1] and tpr.tolist() == [0, 0.5, 1]
    assert np.trapezoid(tpr, fpr) == roc_auc(scores, labels)


# ---------------------------------------------------------------------------- the hand-made event
# Event 7. Particles (id: pT GeV, hits = particle id * 100 + 1.. on barrel layers 0, 1, 2 ...):
#   1: pT 2.0, hits 101-105 in the graphs, 106 (layer 5) not in them;
#   2: pT 3.0, hits 201-205;   4: pT 1.2, 401-405;   5: pT 4.0, 501-505;
#   6: pT 0.5 (below the pT cut of 1: found, but not reconstructable), 601-605;
#   noise hits 901-903 (particle 0, weight 0).
# Weights: 0.038 for each of the 25 particle hits in the graphs, 0.05 for hit 106 (sum 1).
# Edges (inner -> outer) and the logit the model gives them (score = sigmoid(logit)):
#   true, +4 (score 0.982): every consecutive pair of each particle, except
#   true, -4 (0.018):  203 -> 204 (particle 2 is cut in two: 201-203 and 204-205)
#   fake, -4:          101 -> 202
#   fake, +4:          901 -> 902 -> 903 (a noise track)
#   fake, +2 (0.881):  403 -> 504 (joins particles 4 and 5; 403 -> 404 scores higher)
# Section 0 holds particles 1, 2 and the noise, section 1 particles 4, 5, 6 and hit 105 (a hit
# of two sections, as at a phi boundary).
LOGIT = {"high": 4.0, "low": -4.0, "bridge": 2.0}
WEIGHT, WEIGHT_106 = 0.038, 0.05
LAYERS = [(8, 2), (8, 4), (8, 6), (8, 8), (13, 2), (13, 4)]  # (volume_id, layer_id), inner first
PT = {1: 2.0, 2: 3.0, 4: 1.2, 5: 4.0, 6: 0.5}
RADII = np.array([32.0, 72.0, 116.0, 172.0, 260.0, 360.0])  # mm, of the layers


def _radius_phi(hit_id):
    """Where a hit is: particle p's hits on straight lines at phi 0.3 p, layer (hit % 100) - 1;
    the noise along phi 2.7 (z = 0 for all)."""
    hit_id = np.asarray(hit_id)
    particle = hit_id // 100
    return RADII[hit_id % 100 - 1], 0.3 * particle


def _chain(particle, logits=None):
    """The consecutive edges of a particle's hits 1-5: (sender, receiver, label, logit)."""
    logits = logits or [LOGIT["high"]] * 4
    return [
        (particle * 100 + k, particle * 100 + k + 1, 1.0, x) for k, x in zip(range(1, 5), logits)
    ]


SECTIONS = [
    _chain(1)
    + _chain(2, [LOGIT["high"], LOGIT["high"], LOGIT["low"], LOGIT["high"]])
    + [
        (101, 202, 0.0, LOGIT["low"]),
        (901, 902, 0.0, LOGIT["high"]),
        (902, 903, 0.0, LOGIT["high"]),
    ],
    _chain(4) + _chain(5) + _chain(6) + [(403, 504, 0.0, LOGIT["bridge"])],
]
SECTION_HITS = [
    [*range(101, 106), *range(201, 206), 901, 902, 903],
    [105, *range(401, 406), *range(501, 506), *range(601, 606)],
]


def _write_event(events_dir):
    """The event's TrackML CSVs where ``load_truth`` finds them (DATASET/events)."""
    from hvdtrack.events import trackml

    rows = [(p * 100 + k, p, k - 1, WEIGHT) for p in PT for k in range(1, 6)]
    rows += [(106, 1, 5, WEIGHT_106)] + [(900 + k, 0, k - 1, 0.0) for k in (1, 2, 3)]
    hit_id, particle, layer, weight = (np.array(c) for c in zip(*rows))
    radius, phi = _radius_phi(hit_id)
    x, y, zero = radius * np.cos(phi), radius * np.sin(phi), np.zeros(len(rows))
    hits = pd.DataFrame(
        dict(hit_id=hit_id, x=x, y=y, z=zero, module_id=1,
             volume_id=[LAYERS[i][0] for i in layer], layer_id=[LAYERS[i][1] for i in layer])
    )  # fmt: skip
    truth = pd.DataFrame(
        dict(hit_id=hit_id, particle_id=particle, tx=x, ty=y, tz=zero,
             tpx=zero, tpy=zero, tpz=zero, weight=weight)
    )  # fmt: skip
    ids = np.array(list(PT))
    particles = pd.DataFrame(
        dict(particle_id=ids, vx=0.0, vy=0.0, vz=0.0, px=[PT[i] for i in ids], py=0.0, pz=0.0,
             q=1, nhits=[6 if i == 1 else 5 for i in ids], particle_type=13)
    )  # fmt: skip
    trackml.write_event(trackml.Event(7, hits, truth, particles), events_dir)


def _graphs():
    """The two section graphs; the first edge feature carries the logit the model will give."""
    from hvdtrack.graphs.construction import HitGraph

    graphs = []
    for section, (edges, hits) in enumerate(zip(SECTIONS, SECTION_HITS)):
        hit_id = np.array(hits, np.int64)
        index = {h: i for i, h in enumerate(hits)}
        send, recv, label, logit = zip(*edges)
        features = np.zeros((len(edges), 4), np.float32)
        features[:, 0] = logit
        radius, phi = _radius_phi(hit_id)
        nodes = np.stack([radius / 1000, phi / np.pi, np.zeros(len(hits))], axis=1)
        graphs.append(
            HitGraph(
                nodes=nodes.astype(np.float32),
                edges=features,
                senders=np.array([index[s] for s in send], np.int32),
                receivers=np.array([index[r] for r in recv], np.int32),
                labels=np.array(label, np.float32),
                hit_id=hit_id,
                event_id=7,
                section=section,
                num_true_segments=int(sum(label)),
            )
        )
    return graphs


def _logit_is_first_edge_feature(model):
    """Weights making the model's logit exactly the edge's first input feature f: the edge
    encoder gives (relu(f), relu(-f)), the edge update passes them on, the output head takes
    their difference; every other weight is zero (float32 arithmetic is exact here)."""
    for v in model.variables:
        v.assign(np.zeros(v.shape, np.float32))
    named = {v.name.split("/", 1)[1].rsplit(":", 1)[0]: v for v in model.variables}
    named["edge_encoder/mlp/linear_0/w"][0].assign([1.0, -1.0])
    update = named["edge_update/mlp/linear_0/w"]  # rows: [encoded edge (2), latent edge (2), ...]
    update[0, 0].assign(1.0)
    update[1, 1].assign(1.0)
    named["edge_output/mlp/linear_0/w"].assign([[1.0], [-1.0]])


@pytest.fixture
def known_run(tmp_path):
    """A run directory (config.yaml, best checkpoint at step 42) whose model scores the
    hand-made event's edges with the logits above, on a dataset holding that event as 'test'."""
    import tensorflow as tf

    from hvdtrack.config import dump_config, load_config
    from hvdtrack.inputs import pipeline
    from hvdtrack.model.classifier import SegmentClassifier
    from hvdtrack.records.shards import RecordsConfig, write_dataset

    dataset, run_dir = tmp_path / "data", tmp_path / "run"
    write_dataset({"test": _graphs()}, dataset, RecordsConfig())
    _write_event(dataset / "events")
    config = load_config(
        REPO / "configs/tiny.yaml",
        [
            f"data.dataset_dir={dataset}",
            f"train.run_dir={run_dir}",
            "data.graph.pt_min=0",  # graphs keep every hit, noise included
            "model.node_encoder=[1]",
            "model.node_update=[1]",
            "model.edge_encoder=[2]",
            "model.edge_update=[2]",
            "model.output_head=[]",
            "model.num_message_passing_steps=1",
        ],
    )
    model = SegmentClassifier(config.model)
    model(pipeline.placeholder_graph())
    _logit_is_first_edge_feature(model)
    run_dir.mkdir()
    dump_config(config, run_dir / "config.yaml")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(run_dir / "best"), 1)
    manager.save(checkpoint_number=42)
    return run_dir


# Edges at threshold 0.5: 20 true (19 at +4, 203->204 at -4), 4 fake (901->902, 902->903 at +4,
# 403->504 at +2, 101->202 at -4): tp 19, fp 3, fn 1, tn 1.
# AUC over the 20 x 4 (true, fake) pairs, ties counting 1/2: the 19 high true edges beat the
# bridge and the low fake (38) and tie the 2 noise edges (19 x 2 x 1/2 = 19); the low true edge
# ties the low fake (1/2): (38 + 19 + 0.5) / 80 = 0.71875.
EDGES = {
    "auc": 0.71875,
    "num_edges": 24.0,
    "efficiency": 19 / 20,
    "purity": 19 / 22,
    "accuracy": 20 / 24,
}
# Tracks (at least 3 hits; reconstructable: pT > 1 and 5 hits in the graphs: particles 1, 2, 4, 5).
# chains: the bridge 403 -> 504 is neither 403's best edge nor 504's: dropped. Particle 2's two
#   chains 201-203 and 204-205 (no edge across: 203 -> 204 scores low) lie on one straight line
#   and are joined. Tracks 101-105, 201-205, 401-405, 501-505, 601-605 (matched, not
#   reconstructable), 901-903 (fake): efficiency 4/4, fake rate 1/6. TrackML score: the 25
#   particle hits of the graphs, 25 x 0.038 = 0.95; in the graphs 0.95 / 0.95 = 1.
# components: the bridge merges 401-405 and 501-505 into one 10-hit track that is half of each
#   particle's (no majority: fake); 204-205 is too short; 5 tracks, 3 matched: efficiency 2/4,
#   fake rate 2/5; TrackML score 13 x 0.038 = 0.494, in the graphs 0.52.
TRACKS = {
    "chains": dict(tracks=6, matched_tracks=5, reconstructable=4, reconstructed=4,
                   efficiency=1.0, fake_rate=1 / 6, duplicate_rate=0.0, majority_tracks=5,
                   trackml_score=0.95, trackml_score_in_graphs=1.0),
    "components": dict(tracks=5, matched_tracks=3, reconstructable=4, reconstructed=2,
                       efficiency=0.5, fake_rate=0.4, duplicate_rate=0.0, majority_tracks=3,
                       trackml_score=0.494, trackml_score_in_graphs=0.52),
}  # fmt: skip
# Reconstructable pT 1.2, 2.0, 3.0, 4.0 in the bins (0, .5, 1, 1.5, 2, 3, 5, 10, 100).
PT_TOTAL = [0, 0, 1, 0, 1, 2, 0, 0]
PT_FOUND = {"chains": [0, 0, 1, 0, 1, 2, 0, 0], "components": [0, 0, 0, 0, 1, 1, 0, 0]}
CHAIN_TRACKS = {frozenset(range(p * 100 + 1, p * 100 + 6)) for p in PT} | {
    frozenset({901, 902, 903})
}


def test_evaluate_reports_the_figures_worked_out_by_hand(known_run, capsys):
    from hvdtrack.evaluate.__main__ import main

    assert main(["--run", str(known_run), "--pt-min", "1"]) == 0
    printed = capsys.readouterr().out
    assert "edges : AUC 0.7188, efficiency 0.9500, purity 0.8636" in printed
    assert (
        "tracks (chains): TrackML score 0.9500 (in the graphs 1.0000), efficiency 1.0000 (4/4)"
        in printed
    )
    out = known_run / "evaluate-test"
    result = strict_json(out / "metrics.json")
    assert (result["events"], result["graphs"], result["step"]) == (1, 2, 42)
    assert result["threshold"] == 0.5 and result["reconstructable"]["pt_min"] == 1.0
    assert {k: result["edges"][k] for k in EDGES} == pytest.approx(EDGES, rel=1e-9)
    for method, expected in TRACKS.items():
        t = result["tracks"][method]
        assert {k: t[k] for k in expected} == pytest.approx(expected, rel=1e-6), method
        assert t["efficiency_vs_pt"]["total"] == PT_TOTAL
        assert t["efficiency_vs_pt"]["matched"] == PT_FOUND[method], method
        assert t["efficiency_vs_pt"]["efficiency"][0] is None  # an empty bin: null, not NaN
    for name in ("roc", "scores", "efficiency_pt", "efficiency_eta"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    # The chain builder's submission lists every hit of the event (106 too) with its track.
    frame = pd.read_csv(out / "submissions" / "event000000007-submission.csv")
    assert frame.columns.tolist() == ["event_id", "hit_id", "track_id"]
    assert sorted(frame["hit_id"]) == sorted(
        [p * 100 + k for p in PT for k in range(1, 6)] + [106, 901, 902, 903]
    )
    tracks = frame[frame["track_id"] > 0].groupby("track_id")["hit_id"]
    assert {frozenset(hits) for _, hits in tracks} == CHAIN_TRACKS
    assert set(frame.loc[frame["track_id"] == 0, "hit_id"]) == {106}
    assert len(list((known_run / "tensorboard").glob("events.out.tfevents.*"))) >= 1


def strict_json(path):
    """The parsed JSON file; a strict parser, as jq's or JavaScript's: NaN or Infinity raise."""
    with open(path) as f:
        return json.load(f, parse_constant=lambda c: 1 / 0)


def test_evaluate_split_gives_the_edge_metrics_by_hand(known_run):
    from hvdtrack.evaluate.inference import evaluate_split

    result = evaluate_split(known_run, "test")
    assert {k: result[k] for k in EDGES} == pytest.approx(EDGES, rel=1e-9)


def test_evaluate_names_what_is_missing(known_run, tmp_path):
    from hvdtrack.evaluate.run import evaluate_run

    with pytest.raises(ConfigError, match=r"nowhere: no such run directory"):
        evaluate_run(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"is not a training run directory \(no config.yaml\)"):
        evaluate_run(tmp_path)
    with pytest.raises(DataError, match=r"has no graphs in split 'holdout'"):
        evaluate_run(known_run, "holdout")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((known_run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=r"no intact 'best' checkpoint"):
        evaluate_run(empty)


def test_best_and_latest_name_the_newest_intact_checkpoint(known_run):
    """As a resume does: a checkpoint the ``checkpoint`` file does not list yet (a kill between
    the two writes) counts; a damaged one does not."""
    from hvdtrack.evaluate.inference import checkpoint_path
    from hvdtrack.train.checkpoints import number

    best = known_run / "best"
    _copy_checkpoint(best, 42, 50)
    assert "ckpt-42" in (best / "checkpoint").read_text()
    assert checkpoint_path(known_run, "best") == str(best / "ckpt-50")
    assert number(checkpoint_path(known_run, "best")) == 50
    data = next(best.glob("ckpt-50.data-*"))
    data.write_bytes(b"\0" * data.stat().st_size)
    assert checkpoint_path(known_run, "best") == str(best / "ckpt-42")
    assert checkpoint_path(known_run, "latest") is None  # no checkpoints/ folder
    assert checkpoint_path(known_run, "/elsewhere/ckpt-7") == "/elsewhere/ckpt-7"


def test_the_step_reported_is_that_of_the_weights_scored(known_run, monkeypatch):
    """A training still writing checkpoints: one that appears after the model was loaded is not
    the one the evaluation reports (step, path, the unfinished-run warning)."""
    from hvdtrack.evaluate import run as evaluate_module

    (known_run / "run.json").write_text(json.dumps({"status": "running"}))
    score_events = evaluate_module.score_events

    warned = []

    def newer_checkpoint_while_scoring(*args):
        assert len(warned) == 1  # told before the scoring, which may take long
        _copy_checkpoint(known_run / "best", 42, 60)  # as the training writes its next best
        return score_events(*args)

    monkeypatch.setattr(evaluate_module, "score_events", newer_checkpoint_while_scoring)
    result = evaluate_module.evaluate_run(known_run, pt_min=1, on_warning=warned.append)
    assert warned == [result["warning"]]
    assert (known_run / "best" / "ckpt-60.index").exists()
    assert (result["step"], result["checkpoint_path"]) == (42, str(known_run / "best/ckpt-42"))
    assert result["warning"].endswith("evaluating its 'best' checkpoint of step 42")
    assert strict_json(known_run / "evaluate-test" / "metrics.json")["step"] == 42


def _copy_checkpoint(folder, step, new_step):
    """A copy of ``folder/ckpt-step`` as ``ckpt-new_step``, not listed in its checkpoint file."""
    import shutil

    for path in folder.glob(f"ckpt-{step}.*"):
        shutil.copy(path, folder / path.name.replace(f"ckpt-{step}", f"ckpt-{new_step}"))


def _prepare_trackml(trackml_dir, dataset, *overrides):
    """A TrackML-source dataset of the events of ``trackml_dir``, all in the test split."""
    from hvdtrack.config import load_config
    from hvdtrack.prepare.local import prepare_dataset

    settings = ["data.source=trackml", f"data.trackml_dir={trackml_dir}", "data.num_events=null"]
    settings += [f"data.dataset_dir={dataset}", "data.records.split_counts=[0, 0, 1]"]
    config = load_config(REPO / "configs/tiny.yaml", [*settings, *overrides])
    prepare_dataset(config, progress=False)
    return dataset


def test_a_run_trained_on_synthetic_events_evaluates_a_trackml_dataset(known_run, tmp_path):
    # The run's data config is synthetic (seed 11, pT cut 0); the TrackML files hold an event of
    # another generator seed: scored against the run's truth, it would not fit the graphs.
    import shutil

    from hvdtrack.evaluate.__main__ import main
    from hvdtrack.evaluate.run import evaluate_run
    from hvdtrack.events import trackml
    from hvdtrack.events.synthetic import SyntheticConfig, generate_event

    event = generate_event(SyntheticConfig(num_particles=200, num_vertices=5), 1000, seed=3)
    trackml.write_event(event, tmp_path / "trackml")
    dataset = _prepare_trackml(tmp_path / "trackml", tmp_path / "trackml-graphs")

    assert main(["--run", str(known_run), "--pt-min", "1"]) == 0  # the run's own evaluation
    own = (known_run / "evaluate-test" / "metrics.json").read_bytes()
    assert main(["--run", str(known_run), "--dataset-dir", str(dataset)]) == 0
    out = known_run / "evaluate-trackml-graphs-test"  # beside the run's own, which stays
    assert (known_run / "evaluate-test" / "metrics.json").read_bytes() == own
    result = strict_json(out / "metrics.json")
    assert (result["dataset_dir"], result["events"]) == (str(dataset), 1)
    assert result["reconstructable"]["pt_min"] == 1.0  # the dataset's pT cut, not the run's 0
    frame = pd.read_csv(out / "submissions" / "event000001000-submission.csv")
    assert sorted(frame["hit_id"]) == sorted(event.hits["hit_id"])  # every hit of the files

    # Graphs of other features are refused, naming the run, the dataset and what differs.
    other = _prepare_trackml(tmp_path / "trackml", tmp_path / "other", "data.graph.r_scale=500")
    refused = (
        f"the model of run {known_run} cannot take the graphs of dataset {other}: their features "
        f"are scaled otherwise, data.graph r_scale 500 (run: 1000) in {other / 'prepare.json'}"
    )
    with pytest.raises(DataError, match=re.escape(refused)):
        evaluate_run(known_run, dataset_dir=str(other))
    # So is another dataset that prepare did not write: nothing says where its truth is.
    copy = shutil.copytree(known_run.parent / "data", tmp_path / "copy")
    with pytest.raises(DataError, match=re.escape(f"{copy} has no prepare.json")):
        evaluate_run(known_run, dataset_dir=str(copy))


def test_synthetic_truth_kept_or_generated_again_must_fit_the_graphs(tiny_dataset, tmp_path):
    # Truth comes from the CSVs prepare kept, else the synthetic generator runs again.
    import collections
    import dataclasses

    from hvdtrack.config import load_config
    from hvdtrack.evaluate.tracking import join_event
    from hvdtrack.records.manifest import open_dataset
    from hvdtrack.records.shards import read_split_graphs
    from hvdtrack.tracks.truth import check_graph_truth, load_truth

    data = load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={tiny_dataset}"]).data
    manifest = open_dataset(tiny_dataset, splits=["test"], required=["test"])
    by_event = collections.defaultdict(list)
    for _, graph in read_split_graphs(tiny_dataset, manifest, "test"):
        by_event[graph.event_id].append((graph, graph.labels))
    ((event_id, sections),) = by_event.items()  # one test event
    graph = join_event(event_id, sections, data.graph)
    kept = load_truth(data, event_id)
    assert kept.source == str(tiny_dataset / "events" / f"event{event_id:09d}")
    check_graph_truth(graph, kept)
    again = load_truth(dataclasses.replace(data, dataset_dir=str(tmp_path)), event_id)
    assert again.source == f"synthetic event {event_id} (seed 11), generated again"
    for name in ("hit_id", "particle_id", "weight", "particles", "pt"):
        np.testing.assert_allclose(getattr(again, name), getattr(kept, name), rtol=1e-6)
    check_graph_truth(graph, again)
    # Another seed is another event: refused, not scored.
    other = load_truth(dataclasses.replace(data, dataset_dir=str(tmp_path), seed=12), event_id)
    with pytest.raises(DataError, match=r"graphs do not fit the truth of synthetic event"):
        check_graph_truth(graph, other)
