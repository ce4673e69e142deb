"""TrainData's training batches: one pipeline reads several epochs, each epoch exactly its plan;
an epoch that does not continue the open pipeline (a resume, a stop, a re-fit) builds anew."""

from __future__ import annotations

import pytest

from hvdtrack.distributed.workers import make_workers
from hvdtrack.errors import ConfigError
from hvdtrack.inputs import pipeline
from hvdtrack.inputs.epochs import EPOCHS_PER_PIPELINE
from hvdtrack.train.data import TrainData


def fingerprint(batch) -> tuple:
    """What tells two batches of the tiny dataset apart: graphs, sizes and hit positions."""
    graphs, labels = batch
    return (
        tuple(graphs.n_node.numpy()),
        tuple(graphs.n_edge.numpy()),
        graphs.nodes.numpy().tobytes(),
        labels.numpy().tobytes(),
    )


def epoch_alone(data: TrainData, epoch: int, steps: int) -> list:
    """The epoch's batches out of a pipeline built for it alone, as its plan says."""
    dataset = pipeline.train_dataset(data.dataset_dir, data.manifest, data.plan(epoch), 0)
    return [fingerprint(b) for b in dataset.take(steps)]


def read(data: TrainData, epoch: int, first: int, steps: int) -> list:
    return [fingerprint(b) for [b] in data.batches(epoch, first, steps)]


@pytest.fixture
def data(tiny_config):
    config = tiny_config("train.max_steps_per_epoch=3", f"train.epochs={EPOCHS_PER_PIPELINE + 1}")
    return TrainData(config, make_workers(config.distributed))


def test_one_pipeline_reads_the_epochs_back_to_back_each_as_planned(data):
    steps = data.fit().steps_per_epoch
    assert steps == 3  # of 4 in the plan: train.max_steps_per_epoch cuts every epoch
    expected = [epoch_alone(data, e, steps) for e in range(3)]
    assert expected[0] != expected[1]  # the epochs differ: reading the wrong one would show
    got = [read(data, e, 0, steps) for e in range(3)]
    assert got == expected
    assert data.pipelines_built == 1


def test_a_resume_mid_epoch_builds_anew_then_the_next_epochs_continue(data):
    steps = data.fit().steps_per_epoch
    assert read(data, 1, 2, steps) == epoch_alone(data, 1, steps)[2:]
    assert read(data, 2, 0, steps) == epoch_alone(data, 2, steps)
    assert data.pipelines_built == 1


def test_a_resume_past_an_epoch_made_shorter_reads_nothing_of_it(data):
    steps = data.fit().steps_per_epoch  # a checkpoint at step 5 of an epoch now 3 steps long
    assert read(data, 1, 5, steps) == []
    assert read(data, 2, 0, steps) == epoch_alone(data, 2, steps)  # where the pipeline stands
    assert data.pipelines_built == 1


def test_an_epoch_stopped_early_leaves_no_pipeline_to_continue(data):
    steps = data.fit().steps_per_epoch
    batches = data.batches(0, 0, steps)
    next(batches)
    batches.close()  # a stop after the first step
    assert read(data, 1, 0, steps) == epoch_alone(data, 1, steps)
    assert data.pipelines_built == 2
    data.fit()  # a re-fit (elastic: another worker count) ends the open pipeline
    read(data, 2, 0, steps)
    assert data.pipelines_built == 3


def test_a_pipeline_reads_at_most_its_epochs(data):
    steps = data.fit().steps_per_epoch
    for epoch in range(EPOCHS_PER_PIPELINE + 1):  # train.epochs
        assert len(read(data, epoch, 0, steps)) == steps
    assert data.pipelines_built == 2
    assert read(data, 1, 0, steps) == epoch_alone(data, 1, steps)
    # past train.epochs (a run given more epochs after it finished): one epoch at a time
    read(data, EPOCHS_PER_PIPELINE + 1, 0, steps)
    read(data, EPOCHS_PER_PIPELINE + 2, 0, steps)
    assert data.pipelines_built == 5


def test_more_steps_than_a_plan_has_are_refused(data):
    plan = data.plan(0)
    with pytest.raises(ConfigError, match=f"has {plan.num_steps} steps; 5 were asked for"):
        pipeline.train_dataset(data.dataset_dir, data.manifest, [plan], 0, steps=5)
