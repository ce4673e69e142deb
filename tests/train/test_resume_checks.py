"""A resume is right or refused: another model, optimiser or dataset is named and nothing in the
run directory changes; settings that only say how long or how loudly to run may change."""

import pytest

from hvdtrack.errors import ConfigError
from hvdtrack.runs.rundir import check_resume
from hvdtrack.train.loop import fit
from hvdtrack.train.trainer import Trainer


def snapshot(run_dir):
    return {
        str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def trained(tiny_config):
    config = tiny_config("train.epochs=1")
    fit(Trainer(config))
    return config


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ("model.num_message_passing_steps=3", "model.num_message_passing_steps"),
        ("train.learning_rate=0.5", "train.learning_rate"),
        ("train.seed=9", "train.seed"),
    ],
)
def test_another_setting_is_refused_and_changes_nothing(trained, tiny_config, change, key):
    from pathlib import Path

    run_dir = Path(trained.train.run_dir)
    before = snapshot(run_dir)
    with pytest.raises(ConfigError, match=rf"{run_dir} was trained with {key}=.*allow_changed"):
        fit(Trainer(tiny_config("train.epochs=2", change)))
    assert snapshot(run_dir) == before


def test_more_epochs_resume(trained, tiny_config):
    info = fit(Trainer(tiny_config("train.epochs=2", "train.log_every_steps=2")))
    assert info["status"] == "finished" and info["graphs_processed"] == 2 * 8


def test_the_override_lets_a_changed_setting_resume(trained, tiny_config):
    info = fit(
        Trainer(
            tiny_config(
                "train.epochs=2", "train.learning_rate=0.5", "train.allow_changed_config=true"
            )
        )
    )
    assert info["status"] == "finished"


def test_another_dataset_or_worker_count_inside_an_epoch_is_refused(trained, tmp_path):
    previous = {
        "config": {},
        "dataset_digest": "aaaa",
        "num_workers": 2,
        "steps_per_epoch": 4,
    }
    with pytest.raises(ConfigError, match="another dataset .*aaaa.*bbbb"):
        check_resume(tmp_path, previous, trained, 2, None, "bbbb")
    with pytest.raises(
        ConfigError, match=r"stopped inside an epoch .*ckpt-6, step 2.* with 2 workers"
    ):
        check_resume(tmp_path, previous, trained, 1, "run/checkpoints/ckpt-6", "aaaa", 2)
    check_resume(tmp_path, previous, trained, 1, "run/checkpoints/ckpt-8", "aaaa", 0)  # epoch end
    check_resume(tmp_path, previous, trained, 2, "run/checkpoints/ckpt-6", "aaaa", 2)  # same N
