"""The events ``hvdtrack reconstruct`` takes: TrackML files named on the command line, read and
checked, each with its graphs.

An argument is a directory (every event in it), an event prefix (``DIR/event000001000``) or one
of its files (``DIR/event000001000-hits.csv[.gz]``). Only hits are needed; truth (and particles)
are read when present. An event with truth gets the run's own graphs (its pT cut, which takes a
hit's pT from the truth); an event without truth can only be taken whole: every hit of the graph
region, noise included (``graphs.construction.select_hits``).

Public symbols: ``OUTSIDE_MM``, ``Input``, ``event_prefixes``, ``read_input``, ``input_graphs``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.events import detector, trackml
from hvdtrack.graphs.construction import GraphConfig, HitGraph, build_hit_graphs

# A hit farther than this from its layer's (r, z) extent is outside the detector: a wrong unit,
# swapped columns or a wrong layer id (real and synthetic hits lie within ~5 mm of it).
OUTSIDE_MM = 50.0
_FILE = re.compile(r"^(event\d+)-(hits|truth|particles|cells)\.csv(\.gz)?$")


@dataclasses.dataclass
class Input:
    """One event read for reconstruction. ``cut``: built with the run's pT cut (it has truth
    and the cut was not turned off); ``hits_file``: where its hits came from (for messages)."""

    prefix: str
    event: trackml.Event
    has_truth: bool
    cut: bool
    hits_file: Path


def event_prefixes(paths: Sequence[str]) -> list[str]:
    """The event prefixes named by ``paths`` (see the module docstring), in order.

    Raises:
      DataError: a path that is no event or directory of events, or two events of one number.
    """
    prefixes: list[str] = []
    for path in map(Path, paths):
        match = _FILE.match(path.name)
        if path.is_dir():
            prefixes += trackml.find_events(path)
        elif match and path.is_file():
            prefixes.append(str(path.with_name(match.group(1))))
        elif _has(path, "hits"):
            prefixes.append(str(path))
        else:
            raise DataError(
                f"{path}: not an event (no {path.name}-hits.csv[.gz]) nor a directory of events "
                "- give event directories, prefixes like DIR/event000001000 or their hits files"
            )
    seen: dict[int, str] = {}
    for prefix in prefixes:
        event_id = trackml.event_id_from_prefix(prefix)
        if event_id in seen:
            raise DataError(
                f"{prefix}: event {event_id} is also {seen[event_id]}; their submissions would "
                "have one name - reconstruct them separately"
            )
        seen[event_id] = prefix
    return prefixes


def read_input(prefix: str, cut: bool = True) -> Input:
    """Reads one event (hits; truth and particles when present, cells never: the graphs do not
    use them) and checks that its hits lie in the detector.

    Raises:
      DataError: naming the file and line of a missing column or bad value (``trackml``), or
        of a hit outside its layer by more than ``OUTSIDE_MM``.
    """
    parts = [p for p in ("hits", "truth", "particles") if p == "hits" or _has(Path(prefix), p)]
    event = trackml.read_event(prefix, parts, with_cells=False)
    hits_file = next(
        p for p in map(Path, (f"{prefix}-hits.csv", f"{prefix}-hits.csv.gz")) if p.is_file()
    )
    _check_in_detector(event, hits_file)
    has_truth = "truth" in parts
    return Input(prefix, event, has_truth, cut and has_truth, hits_file)


def input_graphs(item: Input, graph: GraphConfig) -> list[HitGraph]:
    """The event's graphs: the run's ``graph`` config, without its pT cut unless ``item.cut``.

    Raises:
      DataError: no hit of the event is in the graphs' region (or passes the pT cut).
    """
    config = graph if item.cut else dataclasses.replace(graph, pt_min=0.0)
    event = item.event
    if not item.cut:  # the truth is not used, even when read
        event = dataclasses.replace(event, truth=trackml.empty_frame("truth"))
    graphs = build_hit_graphs(event, config)
    if sum(g.num_nodes for g in graphs) == 0:
        region = "the barrel layers (data.graph.barrel_only)" if graph.barrel_only else "any layer"
        cut = f" with pT > {graph.pt_min:g} GeV" if item.cut and graph.pt_min > 0 else ""
        raise DataError(
            f"{item.hits_file}: event {event.event_id} has no hit on {region}{cut}, the region "
            "the run's graphs cover: there is nothing to reconstruct"
        )
    return graphs


def _check_in_detector(event: trackml.Event, hits_file: Path) -> None:
    hits = event.hits
    layer = detector.layer_index(hits["volume_id"].to_numpy(), hits["layer_id"].to_numpy())
    r = np.hypot(hits["x"].to_numpy(np.float64), hits["y"].to_numpy(np.float64))
    z = hits["z"].to_numpy(np.float64)
    r_min, r_max = detector.LAYER_R_MIN[layer], detector.LAYER_R_MAX[layer]
    z_min, z_max = detector.LAYER_Z_MIN[layer], detector.LAYER_Z_MAX[layer]
    outside = (r < r_min - OUTSIDE_MM) | (r > r_max + OUTSIDE_MM)
    outside |= (z < z_min - OUTSIDE_MM) | (z > z_max + OUTSIDE_MM)
    if outside.any():
        row = int(np.argmax(outside))
        raise DataError(
            f"{hits_file}: line {row + 2}: hit_id {hits['hit_id'].iat[row]} at r {r[row]:.1f} mm, "
            f"z {z[row]:.1f} mm is outside the detector: its layer (volume_id, layer_id) = "
            f"({hits['volume_id'].iat[row]}, {hits['layer_id'].iat[row]}) spans r "
            f"{r_min[row]:g}..{r_max[row]:g} mm, z {z_min[row]:g}..{z_max[row]:g} mm "
            f"(+-{OUTSIDE_MM:g} mm); {int(outside.sum())} such hits (x, y, z must be in mm)"
        )


def _has(prefix: Path, part: str) -> bool:
    return any(Path(f"{prefix}-{part}.csv{e}").is_file() for e in ("", ".gz"))
