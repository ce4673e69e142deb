"""``distributed.stages`` in the run configuration and the Trainer: the keys, their refusals,
the resume rule, one step equal to the plain step's, and ``python -m hvdtrack.train`` with it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hvdtrack.config import config_to_dict, load_config
from hvdtrack.distributed.config import StagesConfig
from hvdtrack.errors import ConfigError
from hvdtrack.runs import rundir
from tests.launch import REPO

TINY = REPO / "configs/tiny.yaml"  # model.num_message_passing_steps: 2


def test_the_section_defaults_to_no_pipeline_and_reads_its_keys():
    assert load_config(TINY).distributed.stages == StagesConfig(1, 1)
    config = load_config(
        TINY, ["distributed.stages.num_stages=2", "distributed.stages.micro_batches=5"]
    )
    assert config.distributed.stages == StagesConfig(num_stages=2, micro_batches=5)
    assert config_to_dict(config)["distributed"]["stages"] == {"num_stages": 2, "micro_batches": 5}
    assert StagesConfig(1, 4).run_info() is None
    assert StagesConfig(2, 5).run_info() == {"num_stages": 2, "micro_batches": 5}


def test_the_old_pipeline_key_is_read_as_stages_with_a_warning():
    # Configs written before the rename: distributed.pipeline {stages, micro_batches}.
    with pytest.warns(FutureWarning, match=r"'distributed.pipeline' .* is deprecated"):
        config = load_config(
            TINY, ["distributed.pipeline.stages=2", "distributed.pipeline.micro_batches=3"]
        )
    assert config.distributed.stages == StagesConfig(num_stages=2, micro_batches=3)
    assert "pipeline" not in config_to_dict(config)["distributed"]
    with pytest.raises(ConfigError, match=r"give only 'distributed.stages'"):
        load_config(TINY, ["distributed.pipeline.stages=2", "distributed.stages.num_stages=2"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["distributed.stages.num_stages=3"],
            r"'distributed.stages.num_stages' \(3\) must be at most "
            r"model.num_message_passing_steps \(2\)",
        ),
        (
            ["distributed.stages.num_stages=0"],
            r"'distributed.stages.num_stages' must be an integer >= 1",
        ),
        (
            ["distributed.stages.micro_batches=0"],
            r"'distributed.stages.micro_batches' must be an integer >= 1",
        ),
        (
            ["distributed.stages.num_stages=two"],
            r"'distributed.stages.num_stages' must be an integer",
        ),
        (
            ["distributed.stages.num_stage=2"],
            r"unknown key 'distributed.stages.num_stage' \(did you mean 'distributed.stages.num_stages'",
        ),
        (
            ["distributed.stages.num_stages=2", "distributed.strategy=mirrored"],
            r"'distributed.stages.num_stages' 2 needs distributed.strategy local or horovod .*"
            r"not mirrored",
        ),
        (
            ["distributed.stages.num_stages=2", "distributed.strategy=multiworker"],
            r"'distributed.stages.num_stages' 2 needs distributed.strategy local or horovod .*"
            r"not multiworker",
        ),
        (
            ["distributed.stages.num_stages=2", "model.recompute=true"],
            r"'distributed.stages.num_stages' 2 needs model.recompute=false",
        ),
        (
            ["distributed.stages.num_stages=2", "model.precision=bfloat16"],
            r"'distributed.stages.num_stages' 2 needs model.precision=float32",
        ),
    ],
)
def test_settings_a_pipeline_cannot_run_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(TINY, overrides)
    assert str(err.value).startswith(str(TINY))


@pytest.mark.parametrize("strategy", ["local", "horovod"])
def test_what_a_pipeline_runs_with_is_accepted(strategy):
    config = load_config(
        TINY,
        [
            "distributed.stages.num_stages=2",
            "distributed.stages.micro_batches=7",  # more than train.batch_graphs: some empty
            f"distributed.strategy={strategy}",
            "train.subgraphs.enabled=true",
            "distributed.backward_passes_per_step=2",
        ],
    )
    assert config.distributed.stages.num_stages == 2
    # one stage is no pipeline: whatever the strategy or the model's precision
    load_config(TINY, ["distributed.strategy=mirrored", "model.recompute=true"])


def test_a_resume_may_change_the_stages_but_not_the_model(tmp_path):
    plain = load_config(TINY)
    previous = {"config": config_to_dict(plain), "num_workers": 1, "dataset_digest": "d"}
    piped = load_config(
        TINY, ["distributed.stages.num_stages=2", "distributed.stages.micro_batches=3"]
    )
    rundir.check_resume(tmp_path, previous, piped, 1, None, "d")  # same gradients: resumable
    changed = load_config(TINY, ["distributed.stages.num_stages=2", "model.output_head=[8]"])
    with pytest.raises(ConfigError, match="model.output_head"):
        rundir.check_resume(tmp_path, previous, changed, 1, None, "d")
    # A run directory written before the rename recorded distributed.pipeline: still resumable.
    recorded = config_to_dict(plain)
    recorded["distributed"].pop("stages")
    recorded["distributed"]["pipeline"] = {"stages": 2, "micro_batches": 2}
    old_run = {"config": recorded, "num_workers": 1, "dataset_digest": "d"}
    rundir.check_resume(tmp_path, old_run, piped, 1, None, "d")
    with pytest.raises(ConfigError, match="model.output_head"):
        rundir.check_resume(tmp_path, old_run, changed, 1, None, "d")


@pytest.mark.slow  # two Trainers on the tiny dataset, one trace of the pipelined step
@pytest.mark.parametrize(
    "overrides",
    [
        (),
        # subgraph mini-batches (loss mask in the labels), gradients accumulated over 2 passes
        (
            "train.subgraphs.enabled=true",
            "train.subgraphs.seed_edges=64",
            "distributed.backward_passes_per_step=2",
        ),
    ],
    ids=["graphs", "subgraphs-2-passes"],
)
def test_a_staged_trainer_step_equals_the_plain_one(tiny_config, overrides):
    from hvdtrack.train.trainer import Trainer

    plain = Trainer(tiny_config(*overrides))
    piped = Trainer(
        tiny_config(
            *overrides, "distributed.stages.num_stages=2", "distributed.stages.micro_batches=2"
        )
    )
    assert plain.step.stages is None and len(piped.step.stages.devices) == 2
    assert [len(s) for s in piped.step.stages.steps] == [1, 1]
    for mine, theirs in zip(piped.state.variables, plain.state.variables):
        mine.assign(theirs)  # the same starting point
    before = [v.numpy() for v in plain.state.variables]
    losses = [t.step.run(t.data.batches(0, 0, t.size.steps_per_epoch)).loss for t in (plain, piped)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for a, b, start in zip(piped.state.variables, plain.state.variables, before):
        assert not np.array_equal(b.numpy(), start)  # the step moved every weight
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    # evaluation stays the plain model on whole graphs: the same metrics from (almost) equal weights
    piped_val, plain_val = piped.evaluate("val"), plain.evaluate("val")
    assert piped_val.keys() == plain_val.keys()
    for key, value in plain_val.items():
        assert piped_val[key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.slow  # the real command: 2 epochs of the tiny config with a 2 x 2 pipeline
def test_train_command_with_stages_records_them(tiny_dataset, tmp_path):
    import subprocess
    import sys

    from hvdtrack.records.manifest import open_dataset
    from tests.launch import check, tiny_training, worker_env

    run_dir = tmp_path / "run"
    args = tiny_training(
        tiny_dataset,
        run_dir,
        "distributed.stages.num_stages=2",
        "distributed.stages.micro_batches=2",
        strategy="local",
    )
    job = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    check(job)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["strategy"] == "local"
    assert info["stages"] == {"num_stages": 2, "micro_batches": 2}
    assert info["input_mode"] == "graphs"
    assert info["config"]["distributed"]["stages"] == {"num_stages": 2, "micro_batches": 2}
    val_edges = int(open_dataset(tiny_dataset).split_table("val").num_edges.sum())
    assert info["metrics"]["num_edges"] == val_edges  # validated on whole graphs
    assert np.isfinite(info["metrics"]["loss"])
