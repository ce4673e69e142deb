"""The log of a ``horovodrun -np 2`` run reads like an HPC log: plain lines, progress from rank 0."""

import pytest

from tests.launch import REPO, check, horovodrun

pytestmark = [pytest.mark.distributed]


def test_horovodrun_log_has_no_carriage_returns_and_one_rank_of_progress(tiny_dataset, tmp_path):
    job = horovodrun(
        2,
        [
            "-m",
            "hvdtrack.train",
            "--config",
            str(REPO / "configs/tiny.yaml"),
            f"data.dataset_dir={tiny_dataset}",
            f"train.run_dir={tmp_path / 'run'}",
            "distributed.strategy=horovod",
            "train.batch_graphs=1",
            "train.progress_bar=true",
            "train.progress_interval_s=0.001",  # a line at every step but an epoch's last
        ],
    )
    check(job)
    log = job.stdout + job.stderr
    assert "\r" not in log
    progress = [line for line in log.splitlines() if " step " in line and " eta " in line]
    assert progress, log
    assert all(line.startswith("[0]<stderr>:[hvdtrack] epoch ") for line in progress), progress
    epochs = [line for line in log.splitlines() if "train loss" in line]
    assert len(epochs) == 2 and all(line.startswith("[0]<") for line in epochs), epochs
    assert not [line for line in log.splitlines() if line.startswith("[1]<") and "hvdtrack" in line]
