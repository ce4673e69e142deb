"""TrackML event files: read, validate and write the hits/truth/particles/cells CSVs (plain or gzip).

An event is a set of files sharing a prefix, e.g. ``/data/event000001000-hits.csv`` (or
``-hits.csv.gz``); ``find_events`` lists the prefixes of a directory, ``read_event`` loads one
into an ``Event`` of typed DataFrames and refuses bad input with a ``DataError`` naming the file
and the 1-based CSV line of the first bad row, ``write_event`` writes the same format atomically.
A dataset's geometry is one ``detectors.csv`` per directory (``write_detectors``,
``read_detectors``).

Public symbols: ``Event``, ``COLUMNS``, ``OPTIONAL_COLUMNS``, ``DETECTORS_COLUMNS``, ``PARTS``,
``DETECTORS_FILE``, ``VALUE_RANGES``, ``empty_frame``, ``find_events``, ``read_event``, ``write_event``,
``event_id_from_prefix``, ``write_detectors``, ``read_detectors``.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import zlib
from pathlib import Path
from typing import Literal, Sequence, Union

import numpy as np
import pandas as pd

from hvdtrack.errors import DataError
from hvdtrack.events import detector
from hvdtrack.utils.io import atomic_write

# Column names and dtypes of each part, in file order. Ids are int64 (the TrackML library reads
# hit_id as int32: every hit_id written here fits), coordinates float32 (as TrackML stores
# them), small integers int32.
COLUMNS: dict[str, dict[str, str]] = {
    "hits": {
        "hit_id": "int64",
        "x": "float32",
        "y": "float32",
        "z": "float32",
        "volume_id": "int32",
        "layer_id": "int32",
        "module_id": "int32",
    },
    "truth": {
        "hit_id": "int64",
        "particle_id": "int64",
        "tx": "float32",
        "ty": "float32",
        "tz": "float32",
        "tpx": "float32",
        "tpy": "float32",
        "tpz": "float32",
        "weight": "float32",
    },
    "particles": {
        "particle_id": "int64",
        "vx": "float32",
        "vy": "float32",
        "vz": "float32",
        "px": "float32",
        "py": "float32",
        "pz": "float32",
        "q": "int32",
        "nhits": "int32",
        "particle_type": "int32",
    },
    "cells": {"hit_id": "int64", "ch0": "int32", "ch1": "int32", "value": "float32"},
}
PARTS = ("hits", "truth", "particles", "cells")
# Columns that older TrackML releases lack, with the value a reader fills in (0: PDG code
# unknown; the 2018 challenge's particles files have no particle_type).
OPTIONAL_COLUMNS: dict[str, dict[str, int]] = {"particles": {"particle_type": 0}}
DETECTORS_FILE = "detectors.csv"
DETECTORS_COLUMNS: dict[str, str] = {
    "volume_id": "int32",
    "layer_id": "int32",
    "module_id": "int32",
    **{
        name: "float64"
        for name in (
            "cx",
            "cy",
            "cz",
            "rot_xu",
            "rot_xv",
            "rot_xw",
            "rot_yu",
            "rot_yv",
            "rot_yw",
            "rot_zu",
            "rot_zv",
            "rot_zw",
            "module_t",
            "module_minhu",
            "module_maxhu",
            "module_hv",
            "pitch_u",
            "pitch_v",
        )
    },
}

# The values a real event can hold, per part and column (missing: any finite value of its dtype).
# Generous: hit positions within 10 m of the beam line and interaction point (the TrackML
# tracker fits in r < 1.1 m, |z| < 3 m), momenta below 100 TeV, TrackML weights in [0, 1]. A
# value beyond them is damage or garbage, and a position would become a node feature of 1e35.
# (Particle vertices are not bounded: a decay may lie anywhere.)
_MM, _GEV = 1e4, 1e5
VALUE_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "hits": {"hit_id": (0, np.inf), "x": (-_MM, _MM), "y": (-_MM, _MM), "z": (-_MM, _MM)},
    "truth": {
        "hit_id": (0, np.inf),
        "particle_id": (0, np.inf),
        **{c: (-_MM, _MM) for c in ("tx", "ty", "tz")},  # tpx..: noise rows hold anything
        "weight": (0.0, 1.0),
    },
    "particles": {
        "particle_id": (0, np.inf),
        **{c: (-_GEV, _GEV) for c in ("px", "py", "pz")},
        "nhits": (0, np.inf),
    },
    "cells": {"hit_id": (0, np.inf), "ch0": (0, np.inf), "ch1": (0, np.inf)},
}
_PREFIX_RE = re.compile(r"event(\d+)$")
_HITS_FILE_RE = re.compile(r"^(event\d+)-hits\.csv(\.gz)?$")
PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass
class Event:
    """One TrackML event: typed DataFrames with the columns of ``COLUMNS``.

    Attributes:
      event_id: the number in the file prefix (``event000001000`` -> 1000).
      hits: [N_hits rows] hit_id, x, y, z (mm, float32), volume_id, layer_id, module_id.
      truth: [N_hits rows] hit_id, particle_id (0 = noise), tx, ty, tz, tpx, tpy, tpz, weight.
      particles: [N_particles rows] particle_id, vx, vy, vz, px, py, pz (GeV), q, nhits,
        particle_type (PDG code, 0 when the file has none).
      cells: [N_cells rows] hit_id, ch0, ch1, value, or None when not read.
    """

    event_id: int
    hits: pd.DataFrame
    truth: pd.DataFrame
    particles: pd.DataFrame
    cells: pd.DataFrame | None = None


def empty_frame(part: str) -> pd.DataFrame:
    """An empty DataFrame with the columns and dtypes of ``part`` (e.g. for parts not read)."""
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLUMNS[part].items()})


def event_id_from_prefix(prefix: PathLike) -> int:
    """Returns 1000 for ``.../event000001000``; DataError if the name is not ``event<digits>``."""
    match = _PREFIX_RE.search(Path(prefix).name)
    if match is None:
        raise DataError(
            f"{prefix}: not a TrackML event prefix (expected a name like 'event000001000')"
        )
    return int(match.group(1))


def find_events(directory: PathLike) -> list[str]:
    """Lists the event prefixes of a directory of TrackML CSVs (plain or ``.csv.gz``).

    Args:
      directory: a folder holding ``event<digits>-hits.csv[.gz]`` and the other parts.

    Returns:
      Sorted prefixes, e.g. ``['/d/event000001000', '/d/event000001001']``.

    Raises:
      DataError: if the directory does not exist or holds no hits file.
    """
    path = Path(directory)
    if not path.is_dir():
        raise DataError(f"{directory}: event directory does not exist")
    names = {m.group(1) for m in map(_HITS_FILE_RE.match, os.listdir(path)) if m is not None}
    if not names:
        raise DataError(
            f"{directory}: no TrackML events found (expected files like "
            "event000001000-hits.csv or event000001000-hits.csv.gz)"
        )
    return sorted(str(path / name) for name in names)


def read_event(
    prefix: PathLike,
    parts: Sequence[str] = ("hits", "truth", "particles"),
    with_cells: bool | Literal["auto"] = "auto",
) -> Event:
    """Reads and validates one event.

    Args:
      prefix: the common file prefix, e.g. ``/data/event000001000``.
      parts: which of hits, truth, particles to read; parts not read are empty frames.
        Hits are always read.
      with_cells: True to require the cells file, False to skip it, ``"auto"`` to read it
        when it exists.

    Returns:
      The ``Event``, each frame with the columns and dtypes of ``COLUMNS`` (extra columns in
      the files are dropped, absent ``OPTIONAL_COLUMNS`` filled with their default).

    Raises:
      DataError: naming the file (and the CSV line of the first bad row) for a missing or
        unreadable/truncated file, a missing column, a missing, non-numeric or non-finite value,
        a value outside ``VALUE_RANGES``, an empty hits file, duplicate ids, an unknown
        (volume_id, layer_id) pair, or truth hit_ids that do not match the hits.
    """
    unknown = set(parts) - set(PARTS[:3])
    if unknown:
        raise DataError(
            f"read_event: unknown part(s) {sorted(unknown)}; choose from hits, truth, particles"
        )
    event_id = event_id_from_prefix(prefix)
    wanted = [p for p in ("hits", "truth", "particles") if p == "hits" or p in parts]
    if with_cells is True or (with_cells == "auto" and _find_part(prefix, "cells")):
        wanted.append("cells")
    paths = {part: _part_path(prefix, part) for part in wanted}
    frames = {part: _read_part(path, part) for part, path in paths.items()}
    for part in ("truth", "particles"):
        frames.setdefault(part, empty_frame(part))
    _check_event(paths, frames)
    return Event(
        event_id, frames["hits"], frames["truth"], frames["particles"], frames.get("cells")
    )


def write_event(event: Event, directory_or_prefix: PathLike, compress: bool = False) -> str:
    """Writes an event as TrackML CSVs, each file atomically.

    Args:
      event: the event; frames are cast to the dtypes of ``COLUMNS`` (floats stored as float32,
        written in their shortest exact form so that ``read_event`` gives back equal frames).
      directory_or_prefix: a prefix ending in ``event<digits>``, or a directory, in which case
        the prefix is ``<directory>/event<event_id:09d>``.
      compress: write ``.csv.gz`` instead of ``.csv`` (gzip level 1: about 5x faster than
        level 6 for files ~12% larger). A stale file of the other kind for the same part is
        removed, so the reader never sees two versions.

    Returns:
      The prefix written.

    Raises:
      DataError: if a frame lacks a column of ``COLUMNS``.
    """
    target = Path(directory_or_prefix)
    prefix = target if _PREFIX_RE.search(target.name) else target / f"event{event.event_id:09d}"
    frames = {"hits": event.hits, "truth": event.truth, "particles": event.particles}
    if event.cells is not None:
        frames["cells"] = event.cells
    for part, frame in frames.items():  # check every part before writing any
        missing = [c for c in COLUMNS[part] if c not in frame.columns]
        if missing:
            raise DataError(
                f"write_event: event {event.event_id} {part} frame lacks column(s) "
                f"{', '.join(missing)}"
            )
    for part, frame in frames.items():
        typed = frame[list(COLUMNS[part])].astype(COLUMNS[part], copy=False)
        # pandas writes float32 values in their shortest round-trip form, so reading them back
        # as float32 gives the same bits.
        text = typed.to_csv(index=False, lineterminator="\n")
        path = Path(f"{prefix}-{part}.csv" + (".gz" if compress else ""))
        stale = Path(f"{prefix}-{part}.csv" + ("" if compress else ".gz"))
        if compress:
            with (
                atomic_write(path, "wb") as f,
                gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1, mtime=0) as gz,
            ):
                gz.write(text.encode("utf-8"))
        else:
            with atomic_write(path, "w") as f:
                f.write(text)
        stale.unlink(missing_ok=True)
    return str(prefix)


def write_detectors(table: dict[str, np.ndarray] | pd.DataFrame, directory: PathLike) -> str:
    """Writes a module table as ``<directory>/detectors.csv`` (atomically).

    Args:
      table: columns of ``DETECTORS_COLUMNS`` (e.g. ``modules.module_table()``), one row per
        module.
      directory: the dataset directory (created if missing).

    Returns:
      The path written.

    Raises:
      DataError: if the table lacks a column of ``DETECTORS_COLUMNS``.
    """
    frame = pd.DataFrame(table) if not isinstance(table, pd.DataFrame) else table
    missing = [c for c in DETECTORS_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"write_detectors: the module table lacks column(s) {', '.join(missing)}")
    path = Path(directory) / DETECTORS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    typed = frame[list(DETECTORS_COLUMNS)].astype(DETECTORS_COLUMNS)
    with atomic_write(path, "w") as f:
        f.write(typed.to_csv(index=False, lineterminator="\n"))
    return str(path)


def read_detectors(path: PathLike) -> pd.DataFrame:
    """Reads a ``detectors.csv`` (plain or ``.gz``), with or without a leading unnamed index
    column (as some published copies have).

    Returns:
      [M rows] the columns of ``DETECTORS_COLUMNS`` in their dtypes.

    Raises:
      DataError: naming the file for a missing file or column, or a bad value (with its line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: detector file not found")
    try:
        frame = pd.read_csv(path, skip_blank_lines=False, low_memory=False)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise DataError(f"{path}: cannot read the file ({type(err).__name__}: {err})") from None
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no header line)") from None
    missing = [c for c in DETECTORS_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)} (a detectors file needs "
            f"{', '.join(DETECTORS_COLUMNS)})"
        )
    return pd.DataFrame(
        {n: _checked_column(path, n, frame[n], t) for n, t in DETECTORS_COLUMNS.items()}
    )


# ------------------------------------------------------------------------------------ internals
def _find_part(prefix: PathLike, part: str) -> list[Path]:
    candidates = [Path(f"{prefix}-{part}.csv"), Path(f"{prefix}-{part}.csv.gz")]
    return [p for p in candidates if p.is_file()]


def _part_path(prefix: PathLike, part: str) -> Path:
    found = _find_part(prefix, part)
    if not found:
        raise DataError(f"{prefix}-{part}.csv: file not found (nor {prefix}-{part}.csv.gz)")
    if len(found) > 1:
        raise DataError(
            f"{found[0]}: both {found[0].name} and {found[1].name} exist; remove one of them"
        )
    return found[0]


def _read_part(path: Path, part: str) -> pd.DataFrame:
    """Reads one CSV, checks columns and values, and casts to the dtypes of ``COLUMNS``."""
    try:
        # skip_blank_lines=False keeps row i on CSV line i + 2, so messages can cite lines.
        frame = pd.read_csv(path, skip_blank_lines=False, low_memory=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no header line)") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise DataError(
            f"{path}: cannot read the file ({type(err).__name__}: {err}); it may be truncated "
            "or corrupt, regenerate or re-download it"
        ) from None
    columns = COLUMNS[part]
    defaults = OPTIONAL_COLUMNS.get(part, {})
    missing = [c for c in columns if c not in frame.columns and c not in defaults]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)} "
            f"(a {part} file needs {', '.join(columns)}; found {', '.join(map(str, frame.columns))})"
        )
    data = {}
    for name, dtype in columns.items():
        if name in frame.columns:
            data[name] = _checked_column(path, name, frame[name], dtype)
            _check_range(path, name, data[name], VALUE_RANGES[part].get(name))
        else:
            data[name] = np.full(len(frame), defaults[name], dtype=dtype)
    return pd.DataFrame(data)


def _checked_column(path: Path, name: str, column: pd.Series, dtype: str) -> np.ndarray:
    values = column.to_numpy()
    if values.dtype == object:
        numeric = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isnan(numeric) & column.notna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(
                f"{path}: line {row + 2}: column '{name}' has the non-numeric value "
                f"{column.iloc[row]!r}"
            )
        values = numeric
    elif values.dtype == bool or not np.issubdtype(values.dtype, np.number):
        raise DataError(f"{path}: column '{name}' is not numeric (read as {values.dtype})")
    if np.issubdtype(values.dtype, np.floating):
        bad = ~np.isfinite(values)
        if bad.any():
            row = int(np.argmax(bad))
            what = "a missing value" if np.isnan(values[row]) else f"the value {values[row]}"
            raise DataError(f"{path}: line {row + 2}: column '{name}' has {what}")
        if dtype.startswith("int"):
            bad = values != np.round(values)
            if bad.any():
                row = int(np.argmax(bad))
                raise DataError(
                    f"{path}: line {row + 2}: column '{name}' must be an integer, "
                    f"got {values[row]}"
                )
    if dtype.startswith("int") or dtype == "float32":
        limits = np.iinfo(dtype) if dtype.startswith("int") else np.finfo(dtype)
        bad = (values < limits.min) | (values > limits.max)
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(
                f"{path}: line {row + 2}: column '{name}' value {values[row]} does not fit {dtype}"
            )
    return values.astype(dtype, copy=False)


def _check_range(path: Path, name: str, values: np.ndarray, bounds) -> None:
    """DataError naming the file, line and column of the first value outside ``bounds``."""
    if bounds is None:
        return
    low, high = bounds
    bad = (values < low) | (values > high)
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(
            f"{path}: line {row + 2}: column '{name}' has the value {values[row]:g}, outside "
            f"[{low:g}, {high:g}] (no real event holds it: the file is damaged or not TrackML)"
        )


def _first_duplicate(values: np.ndarray) -> int | None:
    """Row of the first value that already appeared earlier, or None."""
    _, first = np.unique(values, return_index=True)
    if len(first) == len(values):
        return None
    seen_first = np.zeros(len(values), dtype=bool)
    seen_first[first] = True
    return int(np.argmax(~seen_first))


def _check_event(paths: dict[str, Path], frames: dict[str, pd.DataFrame]) -> None:
    """Cross-file checks: hits present and unique, known layers, truth/cells ids match hits."""
    hits = frames["hits"]
    if len(hits) == 0:
        raise DataError(f"{paths['hits']}: the hits file has no rows; the event is empty")
    hit_id = hits["hit_id"].to_numpy()
    row = _first_duplicate(hit_id)
    if row is not None:
        raise DataError(f"{paths['hits']}: line {row + 2}: duplicate hit_id {hit_id[row]}")
    layer = detector.layer_index(hits["volume_id"].to_numpy(), hits["layer_id"].to_numpy())
    if (layer < 0).any():
        row = int(np.argmax(layer < 0))
        raise DataError(
            f"{paths['hits']}: line {row + 2}: (volume_id, layer_id) = "
            f"({hits['volume_id'].iat[row]}, {hits['layer_id'].iat[row]}) is not a TrackML layer"
        )
    truth = frames["truth"]
    if "truth" in paths:
        truth_id = truth["hit_id"].to_numpy()
        row = _first_duplicate(truth_id)
        if row is not None:
            raise DataError(f"{paths['truth']}: line {row + 2}: duplicate hit_id {truth_id[row]}")
        unknown = ~np.isin(truth_id, hit_id)
        if unknown.any():
            row = int(np.argmax(unknown))
            raise DataError(
                f"{paths['truth']}: line {row + 2}: hit_id {truth_id[row]} is not in the hits file"
            )
        if len(truth_id) != len(hit_id):
            absent = hit_id[~np.isin(hit_id, truth_id)]
            raise DataError(
                f"{paths['truth']}: has {len(truth_id)} rows for {len(hit_id)} hits; hit_id "
                f"{absent[0]} (and {len(absent) - 1} more) has no truth row"
            )
    if "particles" in paths:
        pid = frames["particles"]["particle_id"].to_numpy()
        row = _first_duplicate(pid)
        if row is not None:
            raise DataError(
                f"{paths['particles']}: line {row + 2}: duplicate particle_id {pid[row]}"
            )
    if "cells" in paths:
        cells = frames["cells"]
        unknown = ~np.isin(cells["hit_id"].to_numpy(), hit_id)
        if unknown.any():
            row = int(np.argmax(unknown))
            raise DataError(
                f"{paths['cells']}: line {row + 2}: hit_id {cells['hit_id'].iat[row]} "
                "is not in the hits file"
            )
