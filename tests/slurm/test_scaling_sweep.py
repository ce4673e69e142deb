"""The scaling sweep on the one-node SLURM cluster: ``python -m hvdtrack.scaling run --launcher
slurm`` with its default options writes submit_all.sh and copies of the batch scripts, which run
unchanged: prepare, train.sbatch for N = 1 and 2, then the report job writes the strong-scaling
report."""

import json
import re
import subprocess
import sys

import pytest

from tests.launch import REPO
from tests.slurm.conftest import FINAL_STATES

pytestmark = [pytest.mark.slurm, pytest.mark.distributed, pytest.mark.slow]


def ended(fields):
    """A final state, or pending for ever because a job it depends on failed."""
    return fields["JobState"] in FINAL_STATES or fields["Reason"] == "DependencyNeverSatisfied"


def test_submit_all_runs_the_sweep_and_writes_its_report(slurm, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    overrides = [f"data.dataset_dir={data}", "train.epochs=2", "train.progress_bar=false"]
    args = ["run", "--mode", "strong", "--np", "1,2", "--config", "configs/tiny.yaml"]
    args += ["--global-batch", "2", "--launcher", "slurm", "--out", str(out), *overrides]
    written = subprocess.run(
        [sys.executable, "-m", "hvdtrack.scaling", *args],
        cwd=REPO,
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert written.returncode == 0, written.stderr
    slurm_dir = out / "slurm"
    for name in ("prepare.sbatch", "train.sbatch"):  # the repository's scripts, unchanged
        assert (slurm_dir / name).read_text() == (REPO / "run_scripts/slurm" / name).read_text()

    submitted = slurm.run("bash", str(slurm_dir / "submit_all.sh"))
    jobs = re.findall(r"\d+", submitted.splitlines()[0])  # prepare, N=1, N=2, report
    try:
        fields = slurm.wait(jobs[-1], timeout=420, until=ended)
    finally:
        slurm.cancel(*jobs)  # left pending when a run failed (afterok never satisfied)
    logs = {p.name: p.read_text() for p in slurm_dir.glob("*.out")}
    assert fields["JobState"] == "COMPLETED", (submitted, logs)
    print(f"{submitted.strip()}; jobs' output: {sorted(logs)}")

    np2 = next(text for name, text in logs.items() if name.startswith("hvdtrack-strong-np2-"))
    assert "srun --kill-on-bad-exit=1 --mpi=pmix --cpus-per-task=1 --cpu-bind=cores" in np2
    for n in (1, 2):
        info = json.loads((out / f"strong-np{n}" / "run.json").read_text())
        assert (info["status"], info["num_workers"], info["global_batch_graphs"]) == (
            "finished",
            n,
            2,
        )
    md = (out / "report-strong" / "report.md").read_text()
    assert md.startswith("# Strong scaling: tiny")
    assert "\n| 1 | " in md and "\n| 2 | " in md
    assert (out / "report-strong" / "speedup_efficiency.png").is_file()
