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


def test_another_thread_count_resumes_and_says_the_rounding_changes(trained, tiny_config, capsys):
    from pathlib import Path

    from hvdtrack.runs import timing

    old = timing.read_run(Path(trained.train.run_dir)).info["threads_per_worker"]
    capsys.readouterr()
    info = fit(Trainer(tiny_config("train.epochs=2", f"distributed.threads_per_worker={old + 1}")))
    said = capsys.readouterr().err
    assert info["status"] == "finished" and info["graphs_processed"] == 2 * 8
    assert f"was trained with {old} intra-op thread(s) per worker, this run has {old + 1}" in said
    assert "the resume is exact, but" in said
    fit(Trainer(tiny_config("train.epochs=3", f"distributed.threads_per_worker={old + 1}")))
    assert "intra-op thread(s)" not in capsys.readouterr().err  # the same count says nothing


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


# ---------------------------------------------------- checkpoints against run.json (issue 27)


@pytest.fixture
def stepped(tiny_config):
    """One epoch (4 steps) with a checkpoint every 2 optimizer steps: ckpt-2 and ckpt-4."""
    fit(Trainer(tiny_config(*STEPPED, "train.epochs=1")))
    return tiny_config


STEPPED = ("train.checkpoint_every_steps=2", "train.keep_checkpoints=10")


def stamps(folder, *names):
    return {n: (folder / f"{n}.index").stat().st_mtime_ns for n in names}


def damage_state(folder):
    state = folder / "checkpoint"
    state.write_text(state.read_text().replace('path: "ckpt-4"', 'path: "ckpt-99"'))


@pytest.mark.parametrize(
    ("damage", "resumed_from", "skipped"),
    [
        (damage_state, "ckpt-4", "ckpt-99 (missing, named by"),
        (lambda folder: (folder / "checkpoint").unlink(), "ckpt-4", None),
        (
            lambda f: f.joinpath("ckpt-4.data-00000-of-00001").write_bytes(b"x"),
            "ckpt-2",
            "ckpt-4 (damaged",
        ),
    ],
    ids=["names-a-missing-one", "list-deleted", "newest-truncated"],
)
def test_a_damaged_checkpoint_list_resumes_from_the_newest_intact_one(
    stepped, capsys, damage, resumed_from, skipped
):
    """Before, each of these restarted at epoch 1 and overwrote or deleted ckpt-2 and ckpt-4
    (or gave a traceback): now the run goes on from the newest checkpoint that reads in full,
    names what it skipped, and keeps every checkpoint up to there as it was."""
    from pathlib import Path

    config = stepped(*STEPPED, "train.epochs=2")
    folder = Path(config.train.run_dir) / "checkpoints"
    damage(folder)
    kept = stamps(folder, *[n for n in ("ckpt-2", "ckpt-4") if n <= resumed_from])
    capsys.readouterr()
    info = fit(Trainer(config))
    said = capsys.readouterr().err
    assert info["status"] == "finished" and info["checkpoint"] == "ckpt-8"
    assert stamps(folder, *kept) == kept  # neither overwritten by a restart nor deleted
    assert "epoch 1/2" in said if resumed_from == "ckpt-2" else "epoch 1/2" not in said
    if skipped:
        assert f"resuming from {folder / resumed_from}; skipped {folder}/{skipped}" in said


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (
            lambda folder: [p.unlink() for p in folder.iterdir()],
            "ckpt-4 (missing, named by run.json)",
        ),
        (
            lambda folder: [p.write_bytes(b"x") for p in folder.glob("ckpt-*.index")],
            "ckpt-4 (damaged: ",
        ),
    ],
    ids=["folder-emptied", "all-damaged"],
)
def test_no_intact_checkpoint_for_what_run_json_says_is_refused(stepped, damage, named):
    """A damaged checkpoint is named as damaged, never as "does not fit the configured model";
    nothing in the run directory changes."""
    from pathlib import Path

    config = stepped(*STEPPED, "train.epochs=2")
    run_dir = Path(config.train.run_dir)
    damage(run_dir / "checkpoints")
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as refused:
        fit(Trainer(config))
    message = str(refused.value)
    assert message.startswith(f"{run_dir / 'run.json'} names checkpoint ckpt-4 (optimizer step 4)")
    assert f"{run_dir / 'checkpoints'}/{named}" in message and "does not fit" not in message
    assert snapshot(run_dir) == before
