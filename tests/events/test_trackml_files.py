"""Files of a synthetic dataset as the TrackML library loads them, and real-format files read back.

The TrackML library finds one file per part with the glob ``<prefix>-<part>.csv*`` and reads it
with ``pandas.read_csv(header=0, index_col=False, dtype=...)`` using its own dtypes; the
loader below does the same, with the library's column names and dtypes written out.
"""

from __future__ import annotations

import glob
import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hvdtrack.errors import DataError
from hvdtrack.events import detector
from hvdtrack.events.modules import module_table as modules_table
from hvdtrack.events.particle_ids import decode_particle_id
from hvdtrack.events.synthetic import SyntheticConfig, generate_dataset
from hvdtrack.events.trackml import read_detectors, read_event

TRACKML_DTYPES = {
    "hits": {
        "hit_id": "i4",
        "x": "f4",
        "y": "f4",
        "z": "f4",
        "volume_id": "i4",
        "layer_id": "i4",
        "module_id": "i4",
    },
    "cells": {"hit_id": "i4", "ch0": "i4", "ch1": "i4", "value": "f4"},
    "particles": {
        "particle_id": "i8",
        "vx": "f4",
        "vy": "f4",
        "vz": "f4",
        "px": "f4",
        "py": "f4",
        "pz": "f4",
        "q": "i4",
        "nhits": "i4",
        "particle_type": "i4",
    },
    "truth": {
        "hit_id": "i4",
        "particle_id": "i8",
        "tx": "f4",
        "ty": "f4",
        "tz": "f4",
        "tpx": "f4",
        "tpy": "f4",
        "tpz": "f4",
        "weight": "f4",
    },
}
DETECTORS_HEADER = (
    "volume_id,layer_id,module_id,cx,cy,cz,rot_xu,rot_xv,rot_xw,rot_yu,rot_yv,rot_yw,"
    "rot_zu,rot_zv,rot_zw,module_t,module_minhu,module_maxhu,module_hv,pitch_u,pitch_v"
)


def _load_like_trackml(prefix: str) -> dict[str, pd.DataFrame]:
    frames = {}
    for part, dtype in TRACKML_DTYPES.items():
        (path,) = glob.glob(f"{prefix}-{part}.csv*")  # exactly one file per part
        frames[part] = pd.read_csv(path, header=0, index_col=False, dtype=dtype)
    return frames


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("synthetic")
    cfg = SyntheticConfig(num_particles=30, num_vertices=3)
    generate_dataset(cfg, directory, num_events=2, seed=7, compress=True)
    return directory


def test_a_synthetic_dataset_has_trackml_file_names(dataset):
    parts = ("cells", "hits", "particles", "truth")
    assert sorted(p.name for p in dataset.iterdir()) == ["detectors.csv"] + [
        f"event00000{event}-{part}.csv.gz" for event in (1000, 1001) for part in parts
    ]


@pytest.mark.parametrize("event", ["event000001000", "event000001001"])
def test_every_part_loads_with_the_trackml_columns_and_dtypes(dataset, event):
    frames = _load_like_trackml(str(dataset / event))
    for part, dtype in TRACKML_DTYPES.items():
        assert sorted(frames[part].columns) == sorted(dtype), part
    hits, cells, particles, truth = (frames[p] for p in ("hits", "cells", "particles", "truth"))
    assert (truth.hit_id.to_numpy() == hits.hit_id.to_numpy()).all()
    assert set(cells.hit_id) == set(hits.hit_id)
    # ids decode by the bit layout into primaries of vertices 1..3 and their secondaries
    fields = decode_particle_id(particles.particle_id.to_numpy())
    assert set(fields["vertex_id"]) <= {1, 2, 3} and (fields["primary_id"] >= 1).all()
    primary = fields["generation"] == 0
    assert (fields["process"][primary] == 0).all() and (fields["generation"] <= 1).all()
    assert np.isin(fields["process"][~primary], [121, 201]).all()
    assert set(truth.particle_id) - {0} <= set(particles.particle_id)
    # weights sum to 1 over the event, noise weighs 0
    assert truth.weight.astype(np.float64).sum() == pytest.approx(1.0, abs=1e-5)
    assert (truth.weight[truth.particle_id == 0] == 0).all()
    assert (truth.particle_id == 0).any()


def test_detectors_file_lists_every_module_that_holds_a_hit(dataset):
    assert (dataset / "detectors.csv").read_text().splitlines()[0] == DETECTORS_HEADER
    modules = read_detectors(dataset / "detectors.csv")
    assert len(modules) == len(modules_table()["module_id"]) > 10_000
    key = ["volume_id", "layer_id", "module_id"]
    assert not modules.duplicated(key).any()
    hits = _load_like_trackml(str(dataset / "event000001000"))["hits"]
    merged = hits.merge(modules, on=key, how="left", validate="many_to_one")
    assert merged.cx.notna().all()
    # each hit lies on its module: on the module's plane and within its half length along v
    rel = merged[["x", "y", "z"]].to_numpy(np.float64) - merged[["cx", "cy", "cz"]].to_numpy()
    v_axis = merged[["rot_xv", "rot_yv", "rot_zv"]].to_numpy()
    w_axis = merged[["rot_xw", "rot_yw", "rot_zw"]].to_numpy()
    assert (np.abs(np.einsum("ij,ij->i", rel, v_axis)) <= merged.module_hv + 1e-3).all()
    np.testing.assert_allclose(np.einsum("ij,ij->i", rel, w_axis), 0.0, atol=2e-3)
    barrel = detector.is_barrel(merged.volume_id.to_numpy())
    assert np.allclose(np.abs(v_axis[barrel, 2]), 1.0) and np.allclose(v_axis[~barrel, 2], 0.0)


def test_detectors_file_with_a_leading_index_column_reads_the_same(dataset, tmp_path):
    plain = read_detectors(dataset / "detectors.csv")
    indexed = tmp_path / "detectors.csv"
    plain.to_csv(indexed)  # pandas writes the unnamed index column first
    pd.testing.assert_frame_equal(read_detectors(indexed), plain)
    with pytest.raises(DataError, match="detector file not found"):
        read_detectors(tmp_path / "nowhere.csv")


# Files in the layout of the real 2018 challenge release (values illustrative; real event 1000 does
# start with hits on volume 7 layer 2 at z = -1502.5); particles without particle_type, as there.
REAL_FILES = {
    "hits": "hit_id,x,y,z,volume_id,layer_id,module_id\n"
    "1,-64.4099,-7.1637,-1502.5,7,2,1\n"
    "2,-55.3361,0.635342,-1502.5,7,2,1\n"
    "3,31.9975,1.40106,-33.0,8,2,101\n",
    "truth": "hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight\n"
    "1,0,-64.4116,-7.16412,-1502.5,250710.0,-149908.0,-956385.0,0.0\n"
    "2,22525763437723648,-55.3385,0.630805,-1502.5,-0.570605,0.0283904,-15.4922,1e-05\n"
    "3,4503668346847232,31.9975,1.40106,-33.0,-0.05527,0.32327,-0.20349,8e-06\n",
    "particles": "particle_id,vx,vy,vz,px,py,pz,q,nhits\n"
    "4503668346847232,-0.00928816,0.00986098,-0.0778789,-0.0552689,0.323272,-0.203492,-1,8\n"
    "22525763437723648,-0.0113182,-0.00234683,-5.27765,-0.570615,0.0284107,-15.4922,1,14\n",
    "cells": "hit_id,ch0,ch1,value\n1,209,617,0.0138317\n1,210,617,0.0165628\n"
    "2,68,446,0.211723\n3,27,1145,0.2\n",
}


@pytest.mark.parametrize("compress", [False, True])
def test_real_trackml_files_are_read_plain_and_gzipped(tmp_path, compress):
    for part, text in REAL_FILES.items():
        path = tmp_path / f"event000001000-{part}.csv"
        if compress:
            with gzip.open(f"{path}.gz", "wt") as f:
                f.write(text)
        else:
            path.write_text(text)
    event = read_event(tmp_path / "event000001000")
    assert event.event_id == 1000
    assert event.hits.hit_id.tolist() == [1, 2, 3]
    assert event.hits.z.tolist() == [-1502.5, -1502.5, -33.0]
    assert event.truth.particle_id.tolist() == [0, 22525763437723648, 4503668346847232]
    assert event.particles.particle_type.tolist() == [0, 0]  # absent: filled with 0
    assert event.particles.nhits.tolist() == [8, 14]
    assert event.cells.hit_id.tolist() == [1, 1, 2, 3]
    # volume 7 layer 2 is the pixel disk at z = -1500, as the real hits say
    layer = detector.layer_index(event.hits.volume_id, event.hits.layer_id)
    assert detector.LAYER_Z_MIN[layer[:2]].tolist() == [-1500.0, -1500.0]
    assert decode_particle_id(event.truth.particle_id.to_numpy())["vertex_id"].tolist() == [0, 5, 1]
