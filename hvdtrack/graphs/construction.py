"""Hit graphs from events: select hits, pair them on adjacent layers, cut, label, split in sections.

Nodes are hits with features [r/1000, phi/pi, z/1000]. Edges join an inner hit (sender) to an
outer hit (receiver) on a pair of layers of the adjacency table that passes the segment cuts
(``pairs``). An edge is true (label 1) when both hits belong to the same particle and are
consecutive crossings along it (``truth``: two hits of one particle on one layer are one
crossing, never joined to each other). Everything is vectorised numpy; the only Python loops run
over layer pairs and sections.

Public symbols: ``FEATURE_SCALES``, ``GraphConfig``, ``HitGraph``, ``SelectedHits``,
``build_hit_graphs``, ``build_hit_graphs_counting_lost``, ``select_hits``, ``edge_features``,
``hit_sections``, ``split_into_sections``, ``node_positions``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hvdtrack.configtools import check
from hvdtrack.errors import DataError
from hvdtrack.events import detector
from hvdtrack.events.trackml import Event
from hvdtrack.graphs.pairs import (
    find_candidate_pairs,
    layer_adjacency,
    segment_cut_mask,
    wrap_angle,
)
from hvdtrack.graphs.truth import (
    count_lost_segments,
    count_true_segments,
    group_hits_along_particles,
    label_edges,
)

_TWO_PI = 2.0 * np.pi
# Candidate pairs (before the segment cuts) allowed per edge of ``GraphConfig.max_edges``: a
# bound on the candidates' memory, counted before they are allocated. Synthetic events give
# about 1.25 per edge that passes the cuts (barrel or whole detector, pT > 0 to 1 GeV).
CANDIDATES_PER_EDGE = 4
# The GraphConfig keys that define the node and edge features: a model trained on graphs built
# with other values would read other numbers (``GraphConfig.feature_scales``).
FEATURE_SCALES = (
    "r_scale", "phi_scale", "z_scale", "dr_scale", "dphi_scale", "dz_scale", "deta_scale",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GraphConfig:
    """How hit graphs are built.

    Attributes:
      pt_min: keep only hits of particles with pT > pt_min (GeV, truth); 0 keeps every hit,
        noise included.
      barrel_only: use only the 10 barrel layers (volumes 8, 13, 17); else the whole detector.
      phi_slope_max: phi-slope cut, |dphi| / dr < phi_slope_max (rad/mm).
      z0_max: cut on the segment's intercept with the beam line, |z0| < z0_max (mm).
      n_phi_sections: sections in phi per event.
      n_eta_sections: sections in eta per event (uniform on [-eta_max, eta_max]; hits beyond go
        to the outermost sections).
      eta_max: eta range of the sections.
      r_scale, phi_scale, z_scale: node features are [r / r_scale, phi / phi_scale, z / z_scale].
      dr_scale, dphi_scale, dz_scale, deta_scale: edge features are [dr / dr_scale, ...].
      max_edges: the most edges one graph may have; a section with more is refused (naming
        the event and the section) before its features are made. Real TrackML events give at
        most a few 10^5 per graph; more means implausible hits or far too loose cuts, and a
        graph a model could not train on in memory. It does not change a dataset.
    """

    pt_min: float = 1.0
    barrel_only: bool = True
    phi_slope_max: float = 0.0006
    z0_max: float = 200.0
    n_phi_sections: int = 1
    n_eta_sections: int = 1
    eta_max: float = 5.0
    r_scale: float = 1000.0
    phi_scale: float = math.pi
    z_scale: float = 1000.0
    dr_scale: float = 1000.0
    dphi_scale: float = math.pi
    dz_scale: float = 1000.0
    deta_scale: float = 1.0
    max_edges: int = 5_000_000

    def __post_init__(self) -> None:
        check(self.pt_min >= 0, "pt_min", "must be >= 0 (GeV; 0 keeps all hits)")
        check(self.phi_slope_max > 0, "phi_slope_max", "must be > 0 (rad/mm)")
        check(self.z0_max > 0, "z0_max", "must be > 0 (mm)")
        check(self.n_phi_sections >= 1, "n_phi_sections", "must be >= 1")
        check(self.n_eta_sections >= 1, "n_eta_sections", "must be >= 1")
        check(self.eta_max > 0, "eta_max", "must be > 0")
        check(self.max_edges >= 1, "max_edges", "must be >= 1")
        for key in FEATURE_SCALES:
            check(getattr(self, key) > 0, key, "must be > 0")

    @property
    def num_sections(self) -> int:
        return self.n_phi_sections * self.n_eta_sections

    @property
    def feature_scales(self) -> dict[str, float]:
        """The settings that define the features (``FEATURE_SCALES``), by key."""
        return {key: getattr(self, key) for key in FEATURE_SCALES}


@dataclasses.dataclass
class HitGraph:
    """One graph: the contract between graph construction and the TFRecord writer.

    Attributes:
      nodes: float32 [N, 3], [r / r_scale, phi / phi_scale, z / z_scale].
      edges: float32 [E, 4], [dr, dphi, dz, deta] each divided by its scale.
      senders: int32 [E], node index of the inner hit.
      receivers: int32 [E], node index of the outer hit.
      labels: float32 [E], 1.0 for a true segment, 0.0 for a fake one.
      hit_id: int64 [N], the event's hit_id of each node.
      event_id: the event number.
      section: section number, eta_bin * n_phi_sections + phi_bin.
      num_true_segments: true consecutive segments whose inner hit is in this section, counted
        before the geometric cuts (the denominator of the construction efficiency).
    """

    nodes: np.ndarray
    edges: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    labels: np.ndarray
    hit_id: np.ndarray
    event_id: int
    section: int
    num_true_segments: int

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0])


@dataclasses.dataclass
class SelectedHits:
    """The hits kept for graph building, in event row order; every array has length N.

    Attributes:
      hit_id: int64, layer: int64 (global layer index), r, phi, z, eta: float64 (mm, rad),
      particle_id: int64 (0 = noise), distance: float64, distance of the true position from the
      particle's production vertex (orders a particle's hits along its path).
    """

    hit_id: np.ndarray
    layer: np.ndarray
    r: np.ndarray
    phi: np.ndarray
    z: np.ndarray
    eta: np.ndarray
    particle_id: np.ndarray
    distance: np.ndarray

    def __len__(self) -> int:
        return len(self.hit_id)


# ------------------------------------------------------------------------------------ the whole
def build_hit_graphs(event: Event, cfg: GraphConfig) -> list[HitGraph]:
    """Builds the hit graphs of one event, one per section.

    Edges are built once for the whole event; each edge then goes to the section of its inner
    hit, and a section's nodes are its own hits plus the outer hits its edges reach, so no edge
    is lost or duplicated at a section boundary.

    Args:
      event: the event; its truth is needed for the labels and a pT cut (without truth, only
        with ``cfg.pt_min`` 0: every edge labelled 0).
      cfg: construction settings.

    Returns:
      ``cfg.num_sections`` graphs, ordered by section number (some may be empty).

    Raises:
      DataError: if the event has no truth and pt_min > 0, or its truth does not cover its
        hits.
    """
    return build_hit_graphs_counting_lost(event, cfg)[0]


def build_hit_graphs_counting_lost(
    event: Event, cfg: GraphConfig
) -> tuple[list[HitGraph], np.ndarray]:
    """``build_hit_graphs``, plus the true segments that no layer pair of the adjacency table can
    form, per section.

    Such segments (a particle's consecutive crossings on layers that are not an adjacency pair:
    a layer skipped by inefficiency, or layers the detector description orders wrongly) can
    never become edges and are not in ``num_true_segments``; count them so that an efficiency
    cannot hide them.

    Returns:
      (graphs, lost): the graphs of ``build_hit_graphs`` and int64 [num_sections], lost segments
      by the section of their inner hit.
    """
    hits = select_hits(event, cfg)
    adjacency = layer_adjacency(cfg.barrel_only)
    senders, receivers = _candidate_pairs(event.event_id, hits, adjacency, cfg)
    keep = segment_cut_mask(
        hits.r, hits.phi, hits.z, senders, receivers, cfg.phi_slope_max, cfg.z0_max
    )
    senders, receivers = senders[keep], receivers[keep]
    section = hit_sections(hits.phi, hits.eta, cfg)
    _check_edge_count(event.event_id, section[senders], cfg)
    order = np.argsort(senders * len(hits) + receivers, kind="stable")
    senders, receivers = senders[order], receivers[order]

    group = group_hits_along_particles(hits.particle_id, hits.layer, hits.distance)
    segments_per_hit = count_true_segments(hits.particle_id, hits.layer, group, adjacency)
    lost_per_hit = count_lost_segments(hits.particle_id, hits.layer, group, adjacency)
    labels = label_edges(hits.particle_id, group, senders, receivers)
    features = edge_features(hits, senders, receivers, cfg)
    nodes = np.stack(
        [hits.r / cfg.r_scale, hits.phi / cfg.phi_scale, hits.z / cfg.z_scale], axis=1
    ).astype(np.float32)
    lost = np.bincount(section, weights=lost_per_hit, minlength=cfg.num_sections)
    graphs = split_into_sections(
        event.event_id,
        cfg.num_sections,
        section,
        nodes,
        hits.hit_id,
        segments_per_hit,
        senders,
        receivers,
        features,
        labels,
    )
    return graphs, np.rint(lost).astype(np.int64)


# ------------------------------------------------------------------------------------ the pieces
def select_hits(event: Event, cfg: GraphConfig) -> SelectedHits:
    """Hits that pass the barrel and pT selections, with cylindrical coordinates and truth.

    A hit's pT is its particle's pT from the particles table (the truth momentum at the hit when
    the particle is not listed); noise hits have pT 0, so any pt_min > 0 drops them. An event
    without truth (real data) can only be taken whole: with pt_min 0 its hits are all kept, as
    noise (particle_id 0, so every edge is labelled fake).

    Raises:
      DataError: if the truth is missing or does not match the hits, or a hit is on an unknown
        (volume_id, layer_id).
    """
    hits, truth, particles = event.hits, event.truth, event.particles
    hit_id = hits["hit_id"].to_numpy(np.int64)
    layer = detector.layer_index(hits["volume_id"].to_numpy(), hits["layer_id"].to_numpy())
    if (layer < 0).any():
        row = int(np.argmax(layer < 0))
        raise DataError(
            f"event {event.event_id}: hit_id {hit_id[row]} has (volume_id, layer_id) = "
            f"({hits['volume_id'].iat[row]}, {hits['layer_id'].iat[row]}), not a TrackML layer"
        )
    if len(truth) == 0 and cfg.pt_min == 0:
        keep = _in_region(layer, cfg)
        return _selected(hits, hit_id, layer, keep, np.zeros(keep.sum(), np.int64), 0.0)
    truth_row = _align_truth(event.event_id, hit_id, truth["hit_id"].to_numpy(np.int64))
    particle_id = truth["particle_id"].to_numpy(np.int64)[truth_row]

    vertex = np.zeros((len(hit_id), 3))
    pt = np.hypot(truth["tpx"].to_numpy(np.float64), truth["tpy"].to_numpy(np.float64))[truth_row]
    if len(particles):
        pid_table = particles["particle_id"].to_numpy(np.int64)
        by_id = np.argsort(pid_table)
        pos = np.minimum(np.searchsorted(pid_table[by_id], particle_id), len(by_id) - 1)
        row = by_id[pos]
        listed = (pid_table[row] == particle_id) & (particle_id != 0)
        table_pt = np.hypot(
            particles["px"].to_numpy(np.float64), particles["py"].to_numpy(np.float64)
        )
        pt = np.where(listed, table_pt[row], pt)
        for k, name in enumerate(("vx", "vy", "vz")):
            vertex[:, k] = np.where(listed, particles[name].to_numpy(np.float64)[row], 0.0)
    pt = np.where(particle_id == 0, 0.0, pt)

    keep = _in_region(layer, cfg)
    if cfg.pt_min > 0:
        keep &= pt > cfg.pt_min
    true_xyz = np.stack(
        [truth[c].to_numpy(np.float64)[truth_row[keep]] for c in ("tx", "ty", "tz")], 1
    )
    distance = np.linalg.norm(true_xyz - vertex[keep], axis=1)
    return _selected(hits, hit_id, layer, keep, particle_id[keep], distance)


def edge_features(
    hits: SelectedHits, senders: np.ndarray, receivers: np.ndarray, cfg: GraphConfig
) -> np.ndarray:
    """float32 [E, 4]: [dr / dr_scale, dphi / dphi_scale, dz / dz_scale, deta / deta_scale],
    outer minus inner, dphi wrapped to [-pi, pi)."""
    return np.stack(
        [
            (hits.r[receivers] - hits.r[senders]) / cfg.dr_scale,
            wrap_angle(hits.phi[receivers] - hits.phi[senders]) / cfg.dphi_scale,
            (hits.z[receivers] - hits.z[senders]) / cfg.dz_scale,
            (hits.eta[receivers] - hits.eta[senders]) / cfg.deta_scale,
        ],
        axis=1,
    ).astype(np.float32)


def hit_sections(phi: np.ndarray, eta: np.ndarray, cfg: GraphConfig) -> np.ndarray:
    """int64 [N]: section of each hit, eta_bin * n_phi_sections + phi_bin (uniform bins on
    [-pi, pi] and [-eta_max, eta_max], out-of-range etas clipped into the end bins)."""
    phi_bin = np.floor((phi + np.pi) / _TWO_PI * cfg.n_phi_sections).astype(np.int64)
    eta_bin = np.floor((eta + cfg.eta_max) / (2 * cfg.eta_max) * cfg.n_eta_sections)
    phi_bin = np.clip(phi_bin, 0, cfg.n_phi_sections - 1)
    eta_bin = np.clip(eta_bin, 0, cfg.n_eta_sections - 1).astype(np.int64)
    return eta_bin * cfg.n_phi_sections + phi_bin


def split_into_sections(
    event_id: int,
    num_sections: int,
    section: np.ndarray,
    nodes: np.ndarray,
    hit_id: np.ndarray,
    segments_per_hit: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    edges: np.ndarray,
    labels: np.ndarray,
) -> list[HitGraph]:
    """Gives each edge to the section of its inner hit and builds one graph per section.

    A section's nodes are its own hits plus the outer hits of its edges (sorted by their index
    in the event), so a hit near a boundary can be a node of two sections while each edge is in
    exactly one graph.

    Args:
      section: int64 [N] section per hit; nodes: float32 [N, 3]; hit_id: int64 [N];
      segments_per_hit: int64 [N] from ``count_true_segments``; senders, receivers: int [E]
      hit indices; edges: float32 [E, 4]; labels: float32 [E].

    Returns:
      ``num_sections`` graphs in section order.
    """
    edge_section = section[senders]
    edge_order = np.argsort(edge_section, kind="stable")
    edge_bounds = np.searchsorted(edge_section[edge_order], np.arange(num_sections + 1))
    hit_order = np.argsort(section, kind="stable")
    hit_bounds = np.searchsorted(section[hit_order], np.arange(num_sections + 1))
    true_segments = np.bincount(section, weights=segments_per_hit, minlength=num_sections)
    graphs = []
    for s in range(num_sections):
        edge = edge_order[edge_bounds[s] : edge_bounds[s + 1]]
        in_graph = np.zeros(len(section), dtype=bool)
        in_graph[hit_order[hit_bounds[s] : hit_bounds[s + 1]]] = True
        in_graph[receivers[edge]] = True
        node = np.flatnonzero(in_graph)
        local = np.cumsum(in_graph) - 1  # event hit index -> node index in this graph
        graphs.append(
            HitGraph(
                nodes=nodes[node],
                edges=edges[edge],
                senders=local[senders[edge]].astype(np.int32),
                receivers=local[receivers[edge]].astype(np.int32),
                labels=labels[edge],
                hit_id=hit_id[node].astype(np.int64),
                event_id=int(event_id),
                section=s,
                num_true_segments=int(round(true_segments[s])),
            )
        )
    return graphs


# ------------------------------------------------------------------------------------ internals
def _candidate_pairs(
    event_id: int, hits: SelectedHits, adjacency: np.ndarray, cfg: GraphConfig
) -> tuple[np.ndarray, np.ndarray]:
    """``find_candidate_pairs`` of the selected hits, refused (DataError) before allocation
    when there are more than ``CANDIDATES_PER_EDGE`` per edge ``cfg.max_edges`` allows."""
    max_pairs = CANDIDATES_PER_EDGE * cfg.max_edges * cfg.num_sections
    try:
        return find_candidate_pairs(
            hits.layer, hits.r, hits.phi, hits.z, adjacency, cfg.phi_slope_max, cfg.z0_max,
            max_pairs,
        )  # fmt: skip
    except DataError:
        raise DataError(
            f"event {event_id}: more than {max_pairs} candidate hit pairs before the cuts "
            f"({CANDIDATES_PER_EDGE} per edge data.graph.max_edges={cfg.max_edges} allows in "
            f"each of {cfg.num_sections} sections) - {_TOO_MANY}"
        ) from None


def _check_edge_count(event_id: int, edge_section: np.ndarray, cfg: GraphConfig) -> None:
    """Refuses an event with a section of more than ``cfg.max_edges`` edges (DataError)."""
    counts = np.bincount(edge_section, minlength=cfg.num_sections)
    if counts.max(initial=0) > cfg.max_edges:
        section = int(np.argmax(counts))
        raise DataError(
            f"event {event_id}, section {section}: {counts[section]} edges, more than "
            f"data.graph.max_edges={cfg.max_edges} - {_TOO_MANY}"
        )


_TOO_MANY = (
    "are its hits plausible (positions, layers)? Tighten the cuts or add sections "
    "(data.graph.n_phi_sections), or raise data.graph.max_edges if the machine has the memory"
)


def _in_region(layer: np.ndarray, cfg: GraphConfig) -> np.ndarray:
    """bool [N]: the hits of the graphs' region (the barrel layers when ``cfg.barrel_only``)."""
    return detector.LAYER_IS_BARREL[layer] if cfg.barrel_only else np.ones(len(layer), bool)


def _selected(hits, hit_id, layer, keep, particle_id, distance) -> SelectedHits:
    """The kept hits (``keep``) with their cylindrical coordinates; ``particle_id`` and
    ``distance`` are already the kept ones' (``distance`` may be a scalar)."""
    x, y, z = (hits[c].to_numpy(np.float64)[keep] for c in ("x", "y", "z"))
    r = np.hypot(x, y)
    return SelectedHits(
        hit_id=hit_id[keep],
        layer=layer[keep],
        r=r,
        phi=np.arctan2(y, x),
        z=z,
        eta=np.arcsinh(z / r),
        particle_id=particle_id,
        distance=np.broadcast_to(np.asarray(distance, np.float64), r.shape).copy(),
    )


def _align_truth(event_id: int, hit_id: np.ndarray, truth_hit_id: np.ndarray) -> np.ndarray:
    """int64 [N]: the truth row of each hit."""
    if len(truth_hit_id) == 0:
        raise DataError(
            f"event {event_id}: no truth; graph construction with a pT cut needs truth.csv "
            "(particle_id) for the labels and the cut (pt_min 0 takes every hit, unlabelled)"
        )
    if np.array_equal(hit_id, truth_hit_id):
        return np.arange(len(hit_id))
    by_id = np.argsort(truth_hit_id)
    pos = np.minimum(np.searchsorted(truth_hit_id[by_id], hit_id), len(by_id) - 1)
    row = by_id[pos]
    missing = truth_hit_id[row] != hit_id
    if missing.any():
        raise DataError(
            f"event {event_id}: hit_id {hit_id[np.argmax(missing)]} has no truth row "
            f"({int(missing.sum())} hits without truth)"
        )
    return row


def node_positions(nodes: np.ndarray, cfg: GraphConfig) -> np.ndarray:
    """float64 [N, 3] x, y, z (mm) of nodes with features [r, phi, z] / their scales."""
    r, phi, z = (
        np.asarray(nodes[:, i], np.float64) * scale
        for i, scale in enumerate((cfg.r_scale, cfg.phi_scale, cfg.z_scale))
    )
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)
