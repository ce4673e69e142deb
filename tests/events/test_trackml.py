"""TrackML CSV reading and writing: exact round trips and every bad input refused by name."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hvdtrack.errors import DataError
from hvdtrack.events.trackml import (
    COLUMNS,
    Event,
    empty_frame,
    event_id_from_prefix,
    find_events,
    read_event,
    write_event,
)


def _with_cells(event: Event) -> Event:
    hit_id = event.hits.hit_id.to_numpy()
    cells = pd.DataFrame(
        {
            "hit_id": np.repeat(hit_id[:5], 2),
            "ch0": np.arange(10),
            "ch1": np.arange(10) * 3,
            "value": np.linspace(0.01, 0.1, 10),
        }
    ).astype(COLUMNS["cells"])
    return Event(event.event_id, event.hits, event.truth, event.particles, cells)


def _assert_same(a: Event, b: Event) -> None:
    assert a.event_id == b.event_id
    for part in ("hits", "truth", "particles", "cells"):
        if getattr(a, part) is None:
            assert getattr(b, part) is None
        else:
            pd.testing.assert_frame_equal(getattr(a, part), getattr(b, part), check_exact=True)


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_is_exact(tmp_path, small_event, compress):
    event = _with_cells(small_event)
    prefix = write_event(event, tmp_path, compress=compress)
    assert prefix == str(tmp_path / "event000001000")
    suffix = ".csv.gz" if compress else ".csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"event000001000-{part}{suffix}" for part in ("cells", "hits", "particles", "truth")
    ]
    _assert_same(read_event(prefix), event)


def test_writing_the_other_format_replaces_the_stale_files(tmp_path, small_event):
    write_event(small_event, tmp_path, compress=True)
    prefix = write_event(small_event, tmp_path / "event000001000", compress=False)
    assert not list(tmp_path.glob("*.gz"))
    _assert_same(read_event(prefix), small_event)


def test_parts_not_read_are_empty_frames_and_cells_are_optional(tmp_path, small_event):
    no_cells = Event(1000, small_event.hits, small_event.truth, small_event.particles)
    prefix = write_event(no_cells, tmp_path)
    event = read_event(prefix, parts=("hits",), with_cells="auto")
    assert len(event.hits) > 0 and event.cells is None
    pd.testing.assert_frame_equal(event.truth, empty_frame("truth"))
    with pytest.raises(DataError, match=r"event000001000-cells\.csv: file not found"):
        read_event(prefix, with_cells=True)


def test_find_events_lists_plain_and_gzip_prefixes_sorted(tmp_path, small_event):
    write_event(Event(1002, small_event.hits, small_event.truth, small_event.particles), tmp_path)
    write_event(small_event, tmp_path, compress=True)
    (tmp_path / "notes.txt").write_text("not an event")
    assert find_events(tmp_path) == [
        str(tmp_path / "event000001000"),
        str(tmp_path / "event000001002"),
    ]


def test_find_events_refuses_empty_and_missing_directories(tmp_path):
    with pytest.raises(DataError, match="no TrackML events found"):
        find_events(tmp_path)
    with pytest.raises(DataError, match="event directory does not exist"):
        find_events(tmp_path / "nowhere")


def test_event_id_comes_from_the_prefix(tmp_path):
    assert event_id_from_prefix("/d/train_1/event000001042") == 1042
    with pytest.raises(DataError, match="not a TrackML event prefix"):
        read_event(tmp_path / "hits")


# ---------------------------------------------------------------------------------- bad inputs
def _edit(path: str, edit) -> None:
    lines = Path(path).read_text().splitlines(keepends=True)
    Path(path).write_text("".join(edit(lines)))


def _replace_field(lines, line_number, column, value):
    """Sets a field of the 1-based CSV line ``line_number``."""
    header = lines[0].rstrip("\n").split(",")
    fields = lines[line_number - 1].rstrip("\n").split(",")
    fields[header.index(column)] = value
    lines[line_number - 1] = ",".join(fields) + "\n"
    return lines


@pytest.mark.parametrize(
    "value, message",
    [
        ("nan", "line 4: column 'y' has a missing value"),
        ("", "line 4: column 'y' has a missing value"),
        ("inf", "line 4: column 'y' has the value inf"),
        ("-Infinity", "line 4: column 'y' has the value -inf"),
        ("abc", "line 4: column 'y' has the non-numeric value 'abc'"),
    ],
)
def test_bad_coordinates_are_refused_with_their_line(written_event, value, message):
    _edit(f"{written_event}-hits.csv", lambda lines: _replace_field(lines, 4, "y", value))
    with pytest.raises(DataError, match=rf"event000001000-hits\.csv: {message}"):
        read_event(written_event)


@pytest.mark.parametrize(
    "part, line, column, value, message",
    [
        # a barrel hit far outside the detector would become a node feature of 1e35
        ("hits", 3, "x", "3e38", "column 'x' has the value 3e\\+38, outside \\[-10000, 10000\\]"),
        ("hits", 3, "z", "-20000", "column 'z' has the value -20000, outside"),
        ("hits", 3, "hit_id", "-5", "column 'hit_id' has the value -5, outside \\[0, inf\\]"),
        ("truth", 3, "weight", "2", "column 'weight' has the value 2, outside \\[0, 1\\]"),
        ("truth", 3, "particle_id", "-1", "column 'particle_id' has the value -1, outside"),
        ("particles", 2, "px", "1e9", "column 'px' has the value 1e\\+09, outside"),
        ("particles", 2, "q", "1e39", "column 'q' value 1e\\+39 does not fit int32"),
        ("particles", 2, "vx", "1e39", "column 'vx' value 1e\\+39 does not fit float32"),
    ],
)
def test_values_no_real_event_holds_are_refused_with_their_line(
    written_event, part, line, column, value, message
):
    _edit(f"{written_event}-{part}.csv", lambda lines: _replace_field(lines, line, column, value))
    with pytest.raises(DataError, match=rf"event000001000-{part}\.csv: line {line}: {message}"):
        read_event(written_event)


def test_non_integer_id_is_refused(written_event):
    _edit(
        f"{written_event}-truth.csv", lambda lines: _replace_field(lines, 3, "particle_id", "1.5")
    )
    with pytest.raises(
        DataError, match=r"truth\.csv: line 3: column 'particle_id' must be an integer"
    ):
        read_event(written_event)


def test_missing_column_is_refused(written_event):
    path = f"{written_event}-hits.csv"
    pd.read_csv(path).drop(columns=["z", "module_id"]).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"hits\.csv: missing column\(s\) z, module_id"):
        read_event(written_event)


def test_empty_hits_file_is_refused(written_event):
    _edit(f"{written_event}-hits.csv", lambda lines: lines[:1])
    with pytest.raises(DataError, match=r"hits\.csv: the hits file has no rows"):
        read_event(written_event, parts=("hits",))
    Path(f"{written_event}-hits.csv").write_text("")
    with pytest.raises(DataError, match=r"hits\.csv: file is empty"):
        read_event(written_event)


def test_truncated_plain_file_is_refused(written_event):
    path = Path(f"{written_event}-particles.csv")
    text = path.read_text()
    path.write_text(text[: text.index("\n", len(text) // 2) + 6])  # cut inside a row
    with pytest.raises(
        DataError, match=r"particles\.csv: line \d+: column '\w+' has a missing value"
    ):
        read_event(written_event)


def test_truncated_gzip_file_is_refused(tmp_path, small_event):
    prefix = write_event(small_event, tmp_path, compress=True)
    path = Path(f"{prefix}-truth.csv.gz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"truth\.csv\.gz: cannot read the file .*truncated"):
        read_event(prefix)


def test_garbage_gzip_file_is_refused(written_event):
    Path(f"{written_event}-hits.csv").unlink()
    Path(f"{written_event}-hits.csv.gz").write_bytes(b"this is not gzip data")
    with pytest.raises(DataError, match=r"hits\.csv\.gz: cannot read the file"):
        read_event(written_event)


def test_two_versions_of_a_part_are_refused(written_event):
    with gzip.open(f"{written_event}-hits.csv.gz", "wt") as f:
        f.write(Path(f"{written_event}-hits.csv").read_text())
    with pytest.raises(
        DataError, match=r"both event000001000-hits\.csv and event000001000-hits\.csv\.gz"
    ):
        read_event(written_event)


def test_missing_part_is_refused(written_event):
    Path(f"{written_event}-particles.csv").unlink()
    with pytest.raises(DataError, match=r"particles\.csv: file not found"):
        read_event(written_event)


def test_truth_hit_id_not_in_hits_is_refused(written_event):
    _edit(f"{written_event}-truth.csv", lambda lines: _replace_field(lines, 5, "hit_id", "999999"))
    with pytest.raises(
        DataError, match=r"truth\.csv: line 5: hit_id 999999 is not in the hits file"
    ):
        read_event(written_event)


def test_truth_missing_rows_is_refused(written_event):
    _edit(f"{written_event}-truth.csv", lambda lines: lines[:-3])
    with pytest.raises(
        DataError, match=r"truth\.csv: has \d+ rows for \d+ hits; hit_id \d+ \(and 2 more\)"
    ):
        read_event(written_event)


def test_duplicate_hit_id_is_refused(written_event):
    _edit(f"{written_event}-hits.csv", lambda lines: _replace_field(lines, 6, "hit_id", "2"))
    with pytest.raises(DataError, match=r"hits\.csv: line 6: duplicate hit_id 2"):
        read_event(written_event)


def test_unknown_layer_is_refused(written_event):
    _edit(f"{written_event}-hits.csv", lambda lines: _replace_field(lines, 2, "layer_id", "3"))
    with pytest.raises(DataError, match=r"hits\.csv: line 2: \(volume_id, layer_id\) = \(\d+, 3\)"):
        read_event(written_event)


def test_extra_field_in_a_row_is_refused(written_event):
    _edit(
        f"{written_event}-hits.csv",
        lambda lines: lines[:3] + [lines[3].rstrip("\n") + ",7\n"] + lines[4:],
    )
    with pytest.raises(DataError, match=r"hits\.csv: cannot read the file \(ParserError: .*line 4"):
        read_event(written_event)


def test_write_refuses_a_frame_without_its_columns(tmp_path, small_event):
    event = Event(5, small_event.hits, small_event.truth, small_event.particles.drop(columns=["q"]))
    with pytest.raises(DataError, match=r"event 5 particles frame lacks column\(s\) q"):
        write_event(event, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written, not even the valid parts
