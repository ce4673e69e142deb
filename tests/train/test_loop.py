"""The training loop on one process: learning, one trace, exact resume, clear failures."""

import json
from pathlib import Path

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError, TrainingError
from hvdtrack.runs import timing
from hvdtrack.train.loop import fit
from hvdtrack.train.trainer import Trainer


def weights(trainer):
    return [v.numpy() for v in trainer.state.variables]


def test_loss_falls_and_the_step_compiles_once(tiny_config):
    trainer = Trainer(tiny_config("train.epochs=4", "train.learning_rate=0.02"))
    before = trainer.evaluate("val")["loss"]
    info = fit(trainer)
    after = trainer.evaluate("val")["loss"]
    assert info["status"] == "finished"
    assert after < 0.8 * before
    # The tiny graphs differ in size at every step; one trace serves them all.
    sizes = {
        r["edges"]
        for r in map(json.loads, open(f"{info['config']['train']['run_dir']}/timing.jsonl"))
        if r["kind"] == "step"
    }
    assert len(sizes) > 3
    assert trainer.step.trace_count() == 1


def test_run_directory_contents(tiny_config):
    config = tiny_config("train.epochs=2")
    fit(Trainer(config))
    run = __import__("pathlib").Path(config.train.run_dir)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["num_workers"] == 1
    assert info["metrics"]["auc"] == info["metrics"]["auc"]  # not NaN
    versions = json.loads((run / "versions.json").read_text())
    assert set(versions["packages"]) >= {"horovod", "graph-nets"}
    assert versions["resumed_from"] is None and "previous" not in versions
    assert (run / "config.yaml").exists() and list(
        (run / "tensorboard").glob("events.out.tfevents.*")
    )
    assert (run / "checkpoints" / "checkpoint").exists() and (run / "best" / "checkpoint").exists()
    # Every epoch record keeps its worker count and peak memory through the file; a process
    # holding TensorFlow and a model peaks above 100 MiB. No GPU here.
    epochs = timing.read_run(run).epochs
    assert [e.workers for e in epochs] == [1, 1]
    assert all(e.peak_rss_bytes > 100 * 2**20 for e in epochs)
    assert all(e.peak_gpu_bytes is None for e in epochs)


def test_resume_continues_exactly(tiny_config):
    straight = Trainer(tiny_config("train.epochs=3", run="straight"))
    fit(straight)
    # 4 steps per epoch: stop in the middle of epoch 2, then run the same command again.
    first = Trainer(tiny_config("train.epochs=3", "train.stop_after_steps=6", run="resumed"))
    assert fit(first)["status"] == "stopped"
    assert (int(first.state.epoch.numpy()), int(first.state.step_in_epoch.numpy())) == (1, 2)
    # The first start ran "other code": the resume keeps its versions beside its own.
    run_dir = __import__("pathlib").Path(tiny_config(run="resumed").train.run_dir)
    first_versions = json.loads((run_dir / "versions.json").read_text())
    assert first_versions["resumed_from"] is None
    first_versions["hvdtrack_git_revision"] = "0123456789ab"
    (run_dir / "versions.json").write_text(json.dumps(first_versions))
    second = Trainer(tiny_config("train.epochs=3", run="resumed"))
    info = fit(second)
    assert info["status"] == "finished"
    versions = json.loads((run_dir / "versions.json").read_text())
    assert versions["previous"] == [first_versions]
    assert versions["resumed_from"] == "ckpt-6"
    for a, b in zip(weights(straight), weights(second)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert (
        int(second.state.optimizer.step.numpy()) == int(straight.state.optimizer.step.numpy()) == 12
    )
    # Timing records of both invocations are kept, each step once.
    steps = [
        (r["epoch"], r["step"])
        for r in map(json.loads, open(tiny_config(run="resumed").train.run_dir + "/timing.jsonl"))
        if r["kind"] == "step"
    ]
    assert sorted(steps) == [(e, s) for e in range(3) for s in range(4)]


def test_non_finite_loss_names_the_step_and_keeps_the_last_checkpoint(tiny_config):
    trainer = Trainer(
        tiny_config("train.epochs=3", "train.learning_rate=1e35", "train.warmup_epochs=0")
    )
    with pytest.raises(
        TrainingError,
        match=r"loss is \S+ and the gradient norm \S+ at epoch \d+ step \d+ \(global step \d+\)"
        r".*Last good checkpoint",
    ):
        fit(trainer)
    info = json.loads(open(tiny_config().train.run_dir + "/run.json").read())
    assert info["status"] == "failed"


def test_time_based_checkpoints_land_on_step_boundaries(tiny_config):
    # A save is due after every step (60 ps: shorter than any step on any machine): steps 1-3
    # of each 4-step epoch by the clock, the epoch's last step by the epoch end; checkpoint
    # number = epoch * 4 + step.
    config = tiny_config(
        "train.epochs=2", "train.checkpoint_every_minutes=1e-12", "train.keep_checkpoints=50"
    )
    fit(Trainer(config))
    saved = sorted(
        int(p.name.split("-")[1].split(".")[0])
        for p in (__import__("pathlib").Path(config.train.run_dir) / "checkpoints").glob(
            "ckpt-*.index"
        )
    )
    assert saved == list(range(1, 9))


def test_too_few_graphs_for_one_step(tiny_config):
    with pytest.raises(DataError, match=r"8 graphs.*(need|needs|needed)|no full step"):
        Trainer(tiny_config("train.batch_graphs=9"))


def test_missing_dataset_is_named(tiny_config, tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        Trainer(tiny_config(f"data.dataset_dir={tmp_path / 'nowhere'}"))


def test_checkpoint_of_another_model_is_refused(tiny_config):
    fit(Trainer(tiny_config("train.epochs=1", run="shape")))
    other = Trainer(tiny_config("train.epochs=2", "model.node_encoder=[8, 16]", run="shape"))
    with pytest.raises(ConfigError, match=r"model.node_encoder=\[16, 16\].*\[8, 16\]"):
        fit(other)
    # Told to resume anyway, the checkpoint itself does not fit the model.
    forced = Trainer(
        tiny_config(
            "train.epochs=2",
            "model.node_encoder=[8, 16]",
            "train.allow_changed_config=true",
            run="shape",
        )
    )
    with pytest.raises(ConfigError, match=r"does not fit the configured model.*train.resume=false"):
        fit(forced)


def test_checkpoint_scores_new_graphs(tiny_config, tiny_dataset):
    from hvdtrack.evaluate.inference import evaluate_split, load_classifier, score_graphs
    from hvdtrack.records.manifest import open_dataset
    from hvdtrack.records.shards import read_split_graphs

    config = tiny_config("train.epochs=2", run="infer")
    trainer = Trainer(config)
    fit(trainer)
    model, loaded, path = load_classifier(config.train.run_dir, "latest")
    assert loaded.model == config.model
    assert path == str(
        Path(config.train.run_dir)
        / "checkpoints"
        / f"ckpt-{int(trainer.state.optimizer.step.numpy())}"
    )
    for a, b in zip(model.trainable_variables, trainer.state.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    graphs = [g for _, g in read_split_graphs(tiny_dataset, open_dataset(tiny_dataset), "test")]
    scores = score_graphs(model, graphs)
    assert [s.shape[0] for s in scores] == [g.num_edges for g in graphs]
    assert all(((s >= 0) & (s <= 1)).all() for s in scores)
    result = evaluate_split(config.train.run_dir, "test", "latest")
    # The same scores through the tf.data path: identical metrics.
    from hvdtrack.model.metrics import edge_metrics

    direct = edge_metrics(
        np.concatenate(scores), np.concatenate([g.labels for g in graphs]), config.train.thresholds
    )
    assert result["auc"] == pytest.approx(direct["auc"], abs=1e-6)
    assert result["num_edges"] == direct["num_edges"]


def test_inference_refuses_a_non_run_directory(tmp_path):
    from hvdtrack.evaluate.inference import load_classifier

    with pytest.raises(ConfigError, match="not a training run directory"):
        load_classifier(tmp_path)
