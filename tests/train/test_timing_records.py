"""Run directories: write_run / read_run round trip, and every malformed input named precisely."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hvdtrack.errors import DataError
from hvdtrack.runs.runinfo import hash_config, make_run_info
from hvdtrack.runs.timing import EpochTiming, StepTiming, read_run, write_run

STEP = StepTiming(
    epoch=0,
    step=0,
    rank=0,
    data_s=0.01,
    compute_s=0.2,
    exchange_s=0.03,
    total_s=0.25,
    graphs=2,
    edges=300,
    warmup=True,
)
EPOCH = EpochTiming(
    epoch=0,
    rank=0,
    time_s=3.5,
    wall_s=4.0,
    steps=10,
    graphs=20,
    edges=3000,
    train_loss=0.61,
    val={"loss": 0.5, "auc": 0.9},
    data_s=0.1,
    compute_s=2.9,
    exchange_s=0.4,
    pipeline_s=0.05,
    validation_s=0.3,
    checkpoint_s=0.1,
    summaries_s=0.05,
    records_s=0.05,
)


def _info(**changes):
    fields = dict(
        config_name="tiny",
        config_hash="abc",
        strategy="horovod",
        num_workers=2,
        batch_graphs=2,
        learning_rate=0.001,
        epochs=1,
        device_kind="cpu-core",
        config={"train": {"epochs": 1}},
    )
    fields.update(changes)
    return make_run_info(**fields)


def test_round_trip_keeps_every_field(tmp_path):
    step1 = StepTiming(0, 1, 1, 0.02, 0.3, 0.05, 0.4, 2, 280, False)
    info = _info(status="finished", metrics={"loss": 0.4, "auc": 0.93}, extra_key="kept")
    write_run(tmp_path / "run", info, [STEP, step1], [EPOCH])
    run = read_run(tmp_path / "run")
    assert run.steps == [STEP, step1]
    assert run.epochs == [EPOCH]
    assert run.info["extra_key"] == "kept"
    assert run.info["global_batch_graphs"] == 4  # 2 per worker x 2 workers
    assert run.finished and run.num_workers == 2 and run.name == "run"


def test_a_metric_without_value_is_null_in_strict_json_and_read_back_as_nan(tmp_path):
    # Purity with no edge kept is 0/0: NaN, which strict JSON (jq, JSON.parse) cannot hold.
    nan = float("nan")
    epoch = dataclasses.replace(EPOCH, val={"loss": 0.5, "purity": nan})
    write_run(tmp_path, _info(metrics={"loss": 0.4, "purity": nan}), [STEP], [epoch])
    strict = dict(parse_constant=lambda c: 1 / 0)  # NaN or Infinity raise
    assert json.loads((tmp_path / "run.json").read_text(), **strict)["metrics"]["purity"] is None
    lines = (tmp_path / "timing.jsonl").read_text().splitlines()
    assert [json.loads(line, **strict).get("val") for line in lines] == [
        None,
        None,
        {"loss": 0.5, "purity": None},
    ]
    run = read_run(tmp_path)
    assert math.isnan(run.epochs[0].val["purity"]) and run.epochs[0].val["loss"] == 0.5


def test_write_run_replaces_both_files(tmp_path):
    write_run(tmp_path, _info(), [STEP], [])
    write_run(tmp_path, _info(status="finished"), [STEP, STEP], [EPOCH])
    run = read_run(tmp_path)
    assert len(run.steps) == 2 and len(run.epochs) == 1 and run.finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "timing.jsonl"]


def test_running_run_is_read_but_not_finished(tmp_path):
    write_run(tmp_path, _info(), [], [])
    assert not read_run(tmp_path).finished


def test_make_run_info_defaults():
    info = _info()
    assert info["status"] == "running" and info["started"] and info["host"]
    assert info["finished"] is None and info["energy"] is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_workers": 0}, "'num_workers' must be >= 1"),
        ({"status": "done"}, "'status' must be one of running, stopped, finished, failed"),
        ({"strategy": "ddp"}, "'strategy' must be one of"),
        ({"batch_graphs": 2.5}, "'batch_graphs' must be an integer"),
        ({"energy": {"joules": 1.0, "watts": 1.0, "source": "guess"}}, "'energy.source'"),
        ({"metrics": {"auc": "high"}}, "'metrics.auc' must be a number"),
    ],
)
def test_make_run_info_rejects_bad_fields(changes, message):
    with pytest.raises(DataError, match=message):
        _info(**changes)


def test_hash_config_ignores_excluded_keys():
    a = {"train": {"run_dir": "a", "epochs": 2}, "scaling": {"price_per_device_hour": 1.0}}
    b = {"train": {"run_dir": "b", "epochs": 2}, "scaling": {"price_per_device_hour": 2.0}}
    assert hash_config(a) != hash_config(b)
    assert hash_config(a, exclude=("train.run_dir", "scaling")) == hash_config(
        b, exclude=("train.run_dir", "scaling")
    )
    assert hash_config(a) != hash_config({**a, "train": {"run_dir": "a", "epochs": 3}})


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"run directory .*nowhere does not exist"):
        read_run(tmp_path / "nowhere")


def test_missing_timing_file(tmp_path):
    write_run(tmp_path, _info(), [], [])
    (tmp_path / "timing.jsonl").unlink()
    with pytest.raises(DataError, match=r"timing.jsonl is missing: .* not a \(complete\) run"):
        read_run(tmp_path)


def test_run_json_that_is_not_json(tmp_path):
    write_run(tmp_path, _info(), [], [])
    (tmp_path / "run.json").write_text("{status: finished")
    with pytest.raises(DataError, match=r"run.json: not valid JSON"):
        read_run(tmp_path)


def test_run_json_missing_a_key(tmp_path):
    write_run(tmp_path, _info(), [], [])
    info = json.loads((tmp_path / "run.json").read_text())
    del info["num_workers"]
    (tmp_path / "run.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"run.json: missing 'num_workers'"):
        read_run(tmp_path)


def _corrupt_line(tmp_path, line_number, text):
    write_run(tmp_path, _info(), [STEP, STEP], [EPOCH])
    lines = (tmp_path / "timing.jsonl").read_text().splitlines()
    lines[line_number - 1] = text
    (tmp_path / "timing.jsonl").write_text("\n".join(lines) + "\n")


def test_truncated_line_is_named(tmp_path):
    _corrupt_line(tmp_path, 3, '{"kind": "step", "epoch": 0, "st')
    with pytest.raises(DataError, match=r"timing.jsonl, line 3: not valid JSON"):
        read_run(tmp_path)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"kind": "step", "epoch": 0}, "missing 'step'"),
        (
            {**STEP.__dict__, "kind": "step", "total_s": -1.0},
            "'total_s' must be a finite number >= 0",
        ),
        ({**STEP.__dict__, "kind": "step", "warmup": "yes"}, "'warmup' must be true or false"),
        ({**STEP.__dict__, "kind": "step", "rank": 2}, "rank 2 but run.json says num_workers is 2"),
        ({**EPOCH.__dict__, "kind": "epoch", "val": [1]}, "'val' must be an object"),
        ({"kind": "batch"}, "'kind' must be 'header', 'step' or 'epoch'"),
        ({"kind": "header", "schema": 7}, "timing schema 7 is not the supported version 2"),
    ],
)
def test_bad_record_is_named_with_its_line(tmp_path, record, message):
    _corrupt_line(tmp_path, 2, json.dumps(record))
    with pytest.raises(DataError, match=rf"timing.jsonl, line 2: {message}"):
        read_run(tmp_path)


def test_integer_seconds_are_read_as_floats(tmp_path):
    # Hand-written files may say 1 rather than 1.0: accepted, stored as float.
    _corrupt_line(tmp_path, 2, json.dumps({**STEP.__dict__, "kind": "step", "total_s": 1}))
    record = read_run(tmp_path).steps[0]
    assert record.total_s == 1.0 and isinstance(record.total_s, float)
    assert read_run(tmp_path).steps[1] == STEP
