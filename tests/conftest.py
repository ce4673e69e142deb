"""Test-wide settings and fixtures: quiet TensorFlow; a prepared tiny dataset and configs on it."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from pathlib import Path

import pytest

from hvdtrack.config import load_config
from hvdtrack.prepare import prepare

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny") / "data"
    prepare(
        load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={directory}"]), progress=False
    )
    return directory


@pytest.fixture
def tiny_config(tiny_dataset, tmp_path):
    def make(*overrides: str, run: str = "run"):
        return load_config(
            REPO / "configs/tiny.yaml",
            [
                f"data.dataset_dir={tiny_dataset}",
                f"train.run_dir={tmp_path / run}",
                "train.progress_bar=false",
                *overrides,
            ],
        )

    return make
