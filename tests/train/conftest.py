"""A prepared tiny dataset shared by the training tests, and a config factory pointing at it."""

from pathlib import Path

import pytest

from hvdtrack.config import load_config
from hvdtrack.prepare import prepare

REPO = Path(__file__).resolve().parents[2]


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
