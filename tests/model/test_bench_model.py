"""The model benchmark runs end to end on tiny sizes and keeps its timings as data."""

from __future__ import annotations

import json

from hvdtrack.bench import model as bench


def test_benchmark_smoke_run_writes_records(tmp_path, capsys):
    out = tmp_path / "timings.json"
    code = bench.main(
        [
            "--nodes", "20", "--edges", "60", "--repeats", "1", "--warmup", "1",
            "--matmul-size", "64", "--modes", "sparse", "sparse-factorized", "dense",
            "--set", "num_message_passing_steps=1", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "--- 20 nodes, 60 edges ---" in printed
    assert "dense takes" in printed and "sparse-factorized takes" in printed
    records = json.loads(out.read_text())["records"]
    steps = {r["mode"]: r for r in records if r["kind"] == "step"}
    assert set(steps) == {"sparse", "sparse-factorized", "dense"}
    assert steps["dense"]["flops"] > steps["sparse"]["flops"] > steps["sparse-factorized"]["flops"]
    assert len(steps["sparse"]["seconds"]) == 1


def test_dense_is_skipped_with_a_reason_when_too_big(capsys):
    code = bench.main(
        ["--nodes", "50", "--edges", "100", "--repeats", "1", "--warmup", "1",
         "--matmul-size", "32", "--modes", "dense", "--dense-max-gb", "1e-6",
         "--set", "num_message_passing_steps=1"]
    )  # fmt: skip
    assert code == 0
    assert "dense: skipped, Ri + Ro need 0.0 GB (> --dense-max-gb 1e-06)" in capsys.readouterr().out


def test_bad_model_override_is_reported_with_its_key(capsys):
    code = bench.main(["--nodes", "10", "--set", "num_message_passing_steps=0"])
    assert code == 2
    assert "'model.num_message_passing_steps' must be an integer >= 1" in capsys.readouterr().err
