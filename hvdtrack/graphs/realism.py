"""Synthetic events against real TrackML ones: the figures of ``shared/design/physics.md``.

The real figures ("Real events: figures to match") were measured with hvdtrack's own prepare and
default cuts (|dphi/dr| < 0.0006, |z0| < 200 mm, barrel only, one graph per event) on public
subsamples of real event 1000 extrapolated to full density. Those graph figures come from
samples with double hits removed, so the synthetic graphs are measured the same way (one hit
per particle and layer, the first by hit_id: ``without_double_hits``) and also, for
information, with every hit, as training sees them. A synthetic figure is within +-30% when it
lies in [0.7 low, 1.3 high] of the real range.

    python -m hvdtrack.bench construct --compare-real [--events 2]

Public symbols: ``REAL``, ``without_double_hits``, ``event_figures``, ``compare``,
``markdown_table``.
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from hvdtrack.events import detector
from hvdtrack.events.trackml import Event
from hvdtrack.graphs.construction import GraphConfig, build_hit_graphs

# key: (label, real low, real high); physics.md, "Real events: figures to match".
REAL: dict[str, tuple[str, Optional[float], Optional[float]]] = {
    "pt1_nodes": ("pT > 1: nodes per graph", 6200, 6900),
    "pt1_edges": ("pT > 1: edges per graph", 15100, 15300),
    "pt1_purity": ("pT > 1: purity", 0.33, 0.36),
    "pt1_edges_per_node": ("pT > 1: edges per node", 2.2, 2.4),
    "pt05_nodes": ("pT > 0.5: nodes per graph", 19000, 23000),
    "pt05_edges": ("pT > 0.5: edges per graph", None, None),
    "pt05_purity": ("pT > 0.5: purity", 0.14, 0.15),
    "pt05_edges_per_node": ("pT > 0.5: edges per node", 5.0, 6.7),
    "double_hit_crossings": ("layer crossings of a particle with 2 hits", 0.26, 0.28),
    "noise": ("noise hits, whole event", 0.15, 0.19),
    "noise_barrel": ("noise hits, barrel", 0.20, 0.20),
    "median_pt": ("particles with hits: median pT (GeV)", 0.40, 0.40),
    "above_05": ("particles with hits: share above 0.5 GeV", 0.33, 0.33),
    "above_1": ("particles with hits: share above 1 GeV", 0.12, 0.12),
    "hits": ("hits per event", 94000, 104000),
    "hits_per_particle_median": ("true hits per particle: median", 11, 11),
    "hits_per_particle_max": ("true hits per particle: max", 19, 19),
    "pt1_nodes_doubles": ("with double hits, pT > 1: nodes per graph", None, None),
    "pt1_edges_doubles": ("with double hits, pT > 1: edges per graph", None, None),
    "pt1_purity_doubles": ("with double hits, pT > 1: purity", None, None),
    "pt05_nodes_doubles": ("with double hits, pT > 0.5: nodes per graph", None, None),
    "pt05_edges_doubles": ("with double hits, pT > 0.5: edges per graph", None, None),
    "pt05_purity_doubles": ("with double hits, pT > 0.5: purity", None, None),
}
TOLERANCE = 0.3


def without_double_hits(event: Event) -> Event:
    """The event with one hit per particle and layer (the first by hit_id); noise kept."""
    hits, truth = event.hits, event.truth
    key = np.stack(
        [
            truth["particle_id"].to_numpy(np.int64),
            hits["volume_id"].to_numpy(np.int64),
            hits["layer_id"].to_numpy(np.int64),
        ],
        axis=1,
    )
    order = np.argsort(hits["hit_id"].to_numpy(np.int64), kind="stable")
    _, first = np.unique(key[order], axis=0, return_index=True)
    keep = np.zeros(len(hits), dtype=bool)
    keep[order[first]] = True
    keep |= key[:, 0] == 0
    return Event(
        event.event_id,
        hits[keep].reset_index(drop=True),
        truth[keep].reset_index(drop=True),
        event.particles,
        None,
    )


def event_figures(event: Event) -> dict[str, float]:
    """The counts of one event behind ``REAL``'s figures (sums and per-particle lists are
    combined over events by ``compare``)."""
    out: dict[str, float] = {}
    single = without_double_hits(event)
    for name, cut in (("pt1", 1.0), ("pt05", 0.5)):
        for suffix, source in (("", single), ("_doubles", event)):
            graphs = build_hit_graphs(source, GraphConfig(pt_min=cut))
            out[f"{name}_nodes{suffix}"] = sum(g.num_nodes for g in graphs)
            out[f"{name}_edges{suffix}"] = sum(g.num_edges for g in graphs)
            out[f"{name}_true{suffix}"] = sum(float(g.labels.sum()) for g in graphs)
    truth, hits = event.truth, event.hits
    pid = truth["particle_id"].to_numpy(np.int64)
    barrel = detector.is_barrel(hits["volume_id"].to_numpy())
    signal = pid != 0
    key = np.stack([pid, hits["volume_id"], hits["layer_id"]], axis=1)[signal]
    _, per_crossing = np.unique(key, axis=0, return_counts=True)
    out.update(
        hits=len(hits),
        noise_hits=int((~signal).sum()),
        barrel_hits=int(barrel.sum()),
        barrel_noise_hits=int((barrel & ~signal).sum()),
        crossings=len(per_crossing),
        double_crossings=int((per_crossing >= 2).sum()),
    )
    return out


def compare(events: Iterable[Event]) -> list[tuple[str, Optional[float], Optional[float], float]]:
    """Rows (label, real low, real high, synthetic) of ``REAL``, the synthetic figure averaged
    over ``events`` (graph and hit counts per event, ratios of the summed counts)."""
    totals: dict[str, float] = {}
    pts, nhits = [], []
    num = 0
    for event in events:
        num += 1
        for key, value in event_figures(event).items():
            totals[key] = totals.get(key, 0.0) + value
        particles = event.particles
        with_hits = particles["nhits"].to_numpy() > 0
        pts.append(np.hypot(particles["px"], particles["py"]).to_numpy(np.float64)[with_hits])
        nhits.append(particles["nhits"].to_numpy()[with_hits])
    pt, hits_per_particle = np.concatenate(pts), np.concatenate(nhits)
    value = {
        "double_hit_crossings": totals["double_crossings"] / totals["crossings"],
        "noise": totals["noise_hits"] / totals["hits"],
        "noise_barrel": totals["barrel_noise_hits"] / totals["barrel_hits"],
        "median_pt": float(np.median(pt)),
        "above_05": float((pt > 0.5).mean()),
        "above_1": float((pt > 1.0).mean()),
        "hits": totals["hits"] / num,
        "hits_per_particle_median": float(np.median(hits_per_particle)),
        "hits_per_particle_max": float(hits_per_particle.max()),
    }
    for name in ("pt1", "pt05"):
        for suffix in ("", "_doubles"):
            nodes, edges = totals[f"{name}_nodes{suffix}"], totals[f"{name}_edges{suffix}"]
            value[f"{name}_nodes{suffix}"] = nodes / num
            value[f"{name}_edges{suffix}"] = edges / num
            value[f"{name}_purity{suffix}"] = totals[f"{name}_true{suffix}"] / max(edges, 1)
            if not suffix:
                value[f"{name}_edges_per_node"] = edges / max(nodes, 1)
    return [(label, low, high, value[key]) for key, (label, low, high) in REAL.items()]


def within(low: Optional[float], high: Optional[float], synthetic: float) -> Optional[bool]:
    """Whether ``synthetic`` lies in [0.7 low, 1.3 high]; None without a real figure."""
    if low is None or high is None:
        return None
    return (1 - TOLERANCE) * low <= synthetic <= (1 + TOLERANCE) * high


def markdown_table(rows: list[tuple[str, Optional[float], Optional[float], float]]) -> str:
    """The rows of ``compare`` as a Markdown table with the ratio to the real range's middle."""
    lines = [
        "| figure | real (physics.md) | synthetic | synthetic / real | within +-30% |",
        "|---|---|---|---|---|",
    ]
    for label, low, high, synthetic in rows:
        ok = within(low, high, synthetic)
        if ok is None:
            real, ratio, verdict = "-", "-", "-"
        else:
            real = _number(low) if low == high else f"{_number(low)}-{_number(high)}"
            ratio = f"{synthetic / (0.5 * (low + high)):.2f}"
            verdict = "yes" if ok else "NO"
        lines.append(f"| {label} | {real} | {_number(synthetic)} | {ratio} | {verdict} |")
    return "\n".join(lines)


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
