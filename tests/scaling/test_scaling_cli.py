"""The command line: exit codes and one-line errors (no traceback) for every bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from hvdtrack.entry import run
from hvdtrack.scaling import __main__ as scaling_main


def main(argv: list[str]) -> int:
    """``python -m hvdtrack.scaling ARGV`` in this process: the exit code it would give."""
    return run(scaling_main.main, argv, settings={})


def test_report_command_writes_the_files(strong_runs, tmp_path, capsys):
    assert main(["report", *map(str, strong_runs), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()
    assert "| 2 | 55.00 | 1.818 | 0.909 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "hvdtrack: error: run directory .* does not exist"),
        ("unfinished", r"hvdtrack: error: run .* is not finished \(status 'running'\)"),
        ("mixed", "hvdtrack: error: runs of different configs in one report: 'model.hidden'"),
        ("no-baseline", "hvdtrack: error: a strong-scaling report needs a single-worker baseline"),
    ],
)
def test_bad_report_inputs_exit_2_with_the_message(
    case, message, strong_runs, tmp_path, synthetic_run, base_config, capsys
):
    if case == "missing":
        dirs = [*strong_runs, tmp_path / "gone"]
    elif case == "unfinished":
        dirs = [
            *strong_runs,
            synthetic_run(
                tmp_path / "run8",
                8,
                epoch_s=[[1.0] * 8],
                step_s=[0.1] * 3,
                batch_graphs=1,
                status="running",
            ),
        ]
    elif case == "mixed":
        base_config["model"]["hidden"] = 32
        dirs = [
            *strong_runs,
            synthetic_run(
                tmp_path / "run8",
                8,
                epoch_s=[[1.0] * 8],
                step_s=[0.1] * 3,
                batch_graphs=1,
                config=base_config,
            ),
        ]
    else:
        dirs = strong_runs[1:]
    assert main(["report", *map(str, dirs)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_predict_command_prints_table_and_check(strong_runs, capsys):
    assert (
        main(["predict", *map(str, strong_runs), "--interconnect", "ethernet-25g", "--ns", "8,64"])
        == 0
    )
    out = capsys.readouterr().out
    assert "network ethernet-25g: 25 Gb/s, 25 us" in out
    assert (
        "N>1: the cycle's wait 0.50 ms for the last rank's own loop, 0.75 ms in all with the "
        "latest loop's lag at N=2, tending to 1.00 ms as N grows"
    ) in out
    # t_c = 1 s, all shrinking (constant edges), 4 MB: t(8) = 2*7/8 * 4e6 / 3.125e9 + 14 * 25 us
    # = 2.59 ms; Horovod's default 1 ms cycle waits 0.5 ms, and the latest of 8 loops 7/16 ms
    # more; step 125 + 0.9375 + 2.59 ms.
    columns = r"N +compute ms +fixed ms +straggler ms +cycle ms +allreduce ms +step ms +efficiency"
    assert re.search(columns, out), out
    assert re.search(r"\n +8 +125.000 +0.000 +0.000 +0.938 +2.590 +128.528 +0.973\n", out), out
    assert "N=2 (shared-memory): predicted efficiency" in out


def test_predict_custom_needs_numbers(strong_runs, capsys):
    assert main(["predict", *map(str, strong_runs), "--interconnect", "custom"]) == 2
    assert (
        "error: --interconnect custom needs --bandwidth-gbps and --latency-us"
        in capsys.readouterr().err
    )


def test_run_refusal_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  batch_graphs: 6\n")
    code = main(["run", "--mode", "strong", "--np", "1,2,4", "--config", str(config), "--dry-run"])
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "hvdtrack: error: strong scaling keeps the global batch fixed: 6 graphs"
    )


def test_run_dry_run_and_slurm(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  batch_graphs: 4\n")
    assert (
        main(
            [
                "run",
                "--mode",
                "weak",
                "--np",
                "1,2",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "o"),
                "--dry-run",
                "train.epochs=1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "train.batch_graphs=4" in out and "train.epochs=1" in out
    assert (
        main(
            [
                "run",
                "--mode",
                "weak",
                "--np",
                "1,2",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "o"),
                "--launcher",
                "slurm",
            ]
        )
        == 0
    )
    assert (tmp_path / "o" / "slurm" / "submit_all.sh").is_file()
    assert (tmp_path / "o" / "slurm" / "train.sbatch").is_file()
    assert "submit all (prepare -> runs -> report): bash" in capsys.readouterr().out


def test_module_entry_point_exits_nonzero_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrack.scaling", "report", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hvdtrack: error: run directory {tmp_path / 'missing'} does not exist; "
        "pass directories written by `python -m hvdtrack.train`"
    )


def test_report_price_override(strong_runs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert (
        main(["report", *map(str, strong_runs), "--out", str(out), "--price-per-device-hour", "36"])
        == 0
    )
    assert "| 1 | 100.00 | 1.000 | 1.000 | $1.00 | 1.00 kJ (estimate) |" in capsys.readouterr().out
    assert (
        main(["report", *map(str, strong_runs), "--out", str(out), "--price-per-device-hour", "-1"])
        == 2
    )
    assert "hvdtrack: error: 'price_per_device_hour' must be >= 0" in capsys.readouterr().err


def test_report_takes_the_ceiling_and_more_runs_for_the_fit(strong_runs, tmp_path, capsys):
    def validation(*flags: str) -> dict:
        out = tmp_path / "-".join(flags or ("plain",))
        assert main(["report", *map(str, strong_runs), "--out", str(out), *flags]) == 0
        capsys.readouterr()
        data = json.loads((out / "scaling.json").read_text())
        return {v["n"]: v for v in data["validation"]}

    plain = validation()
    # The runs record no ranks per host: one each, so the ceiling for 1 applies to them.
    slow = validation("--ceiling", "1=0.5")
    assert slow[2]["predicted_compute_s"] == pytest.approx(2 * plain[2]["predicted_compute_s"])
    assert slow[2]["measured_step_s"] == plain[2]["measured_step_s"]
    # A run of N > 1 cannot join the fit of the single-worker step.
    assert main(["report", *map(str, strong_runs), "--fit-also", str(strong_runs[1])]) == 2
    assert "only single-worker runs can join the fit" in capsys.readouterr().err
