"""Hit graphs from events: select hits, pair them on adjacent layers, cut, label, split in sections.

Nodes are hits with features [r/1000, phi/pi, z/1000]. Edges join an inner hit (sender) to an
outer hit (receiver) on a pair of layers of the adjacency table, when the pair passes the phi-slope
cut |dphi| <= phi_slope_max * dr and the z0 cut |z1 - r1 dz/dr| <= z0_max. Candidate pairs come
from phi-sorted layers and ``np.searchsorted`` windows (never all pairs), with wrap-around at
+-pi. An edge is true (label 1) when both hits belong to the same particle and are consecutive
along it. Everything is vectorised numpy; the only Python loops run over layer pairs and sections.

Public symbols: ``GraphConfig``, ``HitGraph``, ``SelectedHits``, ``build_hit_graphs``,
``build_hit_graphs_counting_lost``, ``select_hits``, ``layer_adjacency``,
``find_candidate_pairs``, ``segment_cut_mask``, ``edge_features``,
``group_hits_along_particles``, ``count_true_segments``, ``count_lost_segments``,
``label_edges``, ``hit_sections``, ``split_into_sections``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from hvdtrack.configtools import check
from hvdtrack.errors import DataError
from hvdtrack.events import detector
from hvdtrack.events.trackml import Event

_TWO_PI = 2.0 * np.pi


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

    def __post_init__(self) -> None:
        check(self.pt_min >= 0, "pt_min", "must be >= 0 (GeV; 0 keeps all hits)")
        check(self.phi_slope_max > 0, "phi_slope_max", "must be > 0 (rad/mm)")
        check(self.z0_max > 0, "z0_max", "must be > 0 (mm)")
        check(self.n_phi_sections >= 1, "n_phi_sections", "must be >= 1")
        check(self.n_eta_sections >= 1, "n_eta_sections", "must be >= 1")
        check(self.eta_max > 0, "eta_max", "must be > 0")
        for key in ("r_scale", "phi_scale", "z_scale", "dr_scale", "dphi_scale", "dz_scale"):
            check(getattr(self, key) > 0, key, "must be > 0")
        check(self.deta_scale > 0, "deta_scale", "must be > 0")

    @property
    def num_sections(self) -> int:
        return self.n_phi_sections * self.n_eta_sections


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
      event: the event; its truth is needed (labels and the pT cut).
      cfg: construction settings.

    Returns:
      ``cfg.num_sections`` graphs, ordered by section number (some may be empty).

    Raises:
      DataError: if the event has no truth or its truth does not cover its hits.
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
    senders, receivers = find_candidate_pairs(
        hits.layer, hits.r, hits.phi, hits.z, adjacency, cfg.phi_slope_max, cfg.z0_max
    )
    keep = segment_cut_mask(
        hits.r, hits.phi, hits.z, senders, receivers, cfg.phi_slope_max, cfg.z0_max
    )
    senders, receivers = senders[keep], receivers[keep]
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
    section = hit_sections(hits.phi, hits.eta, cfg)
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
    the particle is not listed); noise hits have pT 0, so any pt_min > 0 drops them.

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

    keep = np.ones(len(hit_id), dtype=bool)
    if cfg.barrel_only:
        keep &= detector.LAYER_IS_BARREL[layer]
    if cfg.pt_min > 0:
        keep &= pt > cfg.pt_min
    x = hits["x"].to_numpy(np.float64)[keep]
    y = hits["y"].to_numpy(np.float64)[keep]
    z = hits["z"].to_numpy(np.float64)[keep]
    r = np.hypot(x, y)
    true_xyz = np.stack(
        [truth[c].to_numpy(np.float64)[truth_row[keep]] for c in ("tx", "ty", "tz")], 1
    )
    return SelectedHits(
        hit_id=hit_id[keep],
        layer=layer[keep],
        r=r,
        phi=np.arctan2(y, x),
        z=z,
        eta=np.arcsinh(z / r),
        particle_id=particle_id[keep],
        distance=np.linalg.norm(true_xyz - vertex[keep], axis=1),
    )


def layer_adjacency(barrel_only: bool) -> np.ndarray:
    """The (inner, outer) pairs of global layer indices that edges may join.

    Barrel only: consecutive barrel layers, [[0, 1], [1, 2], ..., [8, 9]]. Whole detector: every
    pair of surfaces crossed one after the other by some helix from the luminous region
    (|z0| <= 200 mm, pT >= 0.15 GeV up to straight lines, |eta| <= 4.5); this yields
    barrel -> barrel, barrel -> first disks, disk -> next disk, pixel end-cap -> strip end-cap or
    strip barrel, and so on, derived from the geometry in ``detector`` rather than typed by hand.

    Returns:
      int64 array [P, 2], sorted by (inner, outer); read-only.
    """
    return _scanned_adjacency() if not barrel_only else _barrel_adjacency()


def find_candidate_pairs(
    layer: np.ndarray,
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    adjacency: np.ndarray,
    phi_slope_max: float,
    z0_max: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate (inner, outer) hit pairs on adjacent layers that may pass the segment cuts.

    For each layer pair, the z0 cut bounds where on the outer layer a partner can lie (a z range
    on a cylinder, an r range on a disk, hence also the largest dr), and dr bounds the phi
    window |dphi| <= phi_slope_max * dr. The outer layer's hits are binned along z (or r) and
    sorted by phi within each bin, with each bin's phis repeated at -2pi and +2pi so windows
    wrap around +-pi; every inner hit then finds its partners by binary search in the bins its
    range covers. The result is a superset of the pairs passing ``segment_cut_mask`` and costs
    O(N log N + candidates), never O(N_inner * N_outer).

    Args:
      layer: int64 [N] global layer index per hit.
      r, phi, z: float64 [N] hit coordinates (phi in [-pi, pi]).
      adjacency: int [P, 2] (inner, outer) layer pairs.
      phi_slope_max: rad/mm; z0_max: mm.

    Returns:
      (senders, receivers): int64 [C] hit indices, inner and outer.
    """
    order = np.argsort(layer, kind="stable")
    num_layers = max(int(adjacency.max(initial=-1)), int(layer.max(initial=-1))) + 1
    bounds = np.searchsorted(layer[order], np.arange(num_layers + 1))
    senders, receivers = [], []
    for inner, outer in adjacency:
        a = order[bounds[inner] : bounds[inner + 1]]
        b = order[bounds[outer] : bounds[outer + 1]]
        if len(a) and len(b):
            pair = _candidates_between(
                a, b, r, phi, z, bool(detector.LAYER_IS_BARREL[outer]), phi_slope_max, z0_max
            )
            senders.append(pair[0])
            receivers.append(pair[1])
    if not senders:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(senders), np.concatenate(receivers)


def segment_cut_mask(
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    phi_slope_max: float,
    z0_max: float,
) -> np.ndarray:
    """Which candidate segments pass the geometric cuts.

    A segment needs dr > 0 (it points outwards), |dphi| <= phi_slope_max * dr and
    |z0| <= z0_max with z0 = z1 - r1 dz / dr. Both cuts are evaluated multiplied through by dr,
    so end-cap pairs with dr close to 0 need no division: their allowed dphi and z0 window shrink
    with dr, as a track's own dphi does.

    Args:
      r, phi, z: float64 [N] hit coordinates.
      senders, receivers: int [C] inner and outer hit indices.

    Returns:
      bool [C].
    """
    r1, r2 = r[senders], r[receivers]
    dr = r2 - r1
    dphi = _wrap_angle(phi[receivers] - phi[senders])
    dz = z[receivers] - z[senders]
    return (
        (dr > 0)
        & (np.abs(dphi) <= phi_slope_max * dr)
        & (np.abs(z[senders] * dr - r1 * dz) <= z0_max * dr)
    )


def edge_features(
    hits: SelectedHits, senders: np.ndarray, receivers: np.ndarray, cfg: GraphConfig
) -> np.ndarray:
    """float32 [E, 4]: [dr / dr_scale, dphi / dphi_scale, dz / dz_scale, deta / deta_scale],
    outer minus inner, dphi wrapped to [-pi, pi)."""
    return np.stack(
        [
            (hits.r[receivers] - hits.r[senders]) / cfg.dr_scale,
            _wrap_angle(hits.phi[receivers] - hits.phi[senders]) / cfg.dphi_scale,
            (hits.z[receivers] - hits.z[senders]) / cfg.dz_scale,
            (hits.eta[receivers] - hits.eta[senders]) / cfg.deta_scale,
        ],
        axis=1,
    ).astype(np.float32)


def group_hits_along_particles(
    particle_id: np.ndarray, layer: np.ndarray, distance: np.ndarray
) -> np.ndarray:
    """Numbers each particle's hits by layer crossing, in order along its path.

    A particle's hits are ordered by distance from its vertex; consecutive hits on the same
    layer (double hits) share a group. Groups are numbered globally so that the next crossing
    of the same particle is group + 1.

    Args:
      particle_id: int64 [N] (0 = noise).
      layer: int64 [N] global layer index.
      distance: float64 [N] distance from the particle's vertex.

    Returns:
      int64 [N] group number; -1 for noise.
    """
    group = np.full(len(particle_id), -1, dtype=np.int64)
    signal = np.flatnonzero(particle_id != 0)
    if len(signal) == 0:
        return group
    order = signal[np.lexsort((distance[signal], particle_id[signal]))]
    pid, lay = particle_id[order], layer[order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (pid[1:] != pid[:-1]) | (lay[1:] != lay[:-1])
    group[order] = np.cumsum(new_group) - 1
    return group


def count_true_segments(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> np.ndarray:
    """Per hit, the true segments it starts: hits of its particle's next group, when the two
    groups' layers are an adjacency pair (a segment across a missing layer cannot be an edge).

    Args:
      particle_id: int64 [N]; layer: int64 [N]; group: int64 [N] from
        ``group_hits_along_particles``; adjacency: int [P, 2].

    Returns:
      int64 [N]; its sum is the number of true segments.
    """
    return _next_group_sizes(particle_id, layer, group, adjacency)[0]


def count_lost_segments(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> np.ndarray:
    """Per hit, the true segments it starts that no layer pair can form: hits of its particle's
    next group when the two groups' layers are not an adjacency pair.

    Args and Returns: as ``count_true_segments``; the two counts never share a segment.
    """
    return _next_group_sizes(particle_id, layer, group, adjacency)[1]


def label_edges(
    particle_id: np.ndarray, group: np.ndarray, senders: np.ndarray, receivers: np.ndarray
) -> np.ndarray:
    """float32 [E]: 1.0 when both hits belong to the same (non-noise) particle and the outer
    hit is on the particle's next crossing after the inner one, else 0.0.

    Args:
      particle_id: int64 [N]; group: int64 [N] from ``group_hits_along_particles``;
      senders, receivers: int [E] inner and outer hit indices.
    """
    same = (particle_id[senders] == particle_id[receivers]) & (particle_id[senders] != 0)
    consecutive = group[receivers] == group[senders] + 1
    return (same & consecutive).astype(np.float32)


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
def _next_group_sizes(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per hit, the size of its particle's next group: int64 [N] where the two layers are an
    adjacency pair (formable), and int64 [N] where they are not (lost); 0 without a next group."""
    formable = np.zeros(len(group), dtype=np.int64)
    lost = np.zeros(len(group), dtype=np.int64)
    signal = group >= 0
    if not signal.any():
        return formable, lost
    num_groups = int(group.max()) + 1
    size = np.bincount(group[signal], minlength=num_groups)
    group_pid = np.zeros(num_groups, dtype=np.int64)
    group_layer = np.zeros(num_groups, dtype=np.int64)
    group_pid[group[signal]] = particle_id[signal]
    group_layer[group[signal]] = layer[signal]
    allowed = _adjacency_mask(
        adjacency, max(int(layer.max()) + 1, int(adjacency.max(initial=0)) + 1)
    )
    has_next = np.zeros(num_groups, dtype=bool)
    has_next[:-1] = group_pid[1:] == group_pid[:-1]
    is_pair = np.zeros(num_groups, dtype=bool)
    is_pair[:-1] = allowed[group_layer[:-1], group_layer[1:]]
    next_size = np.zeros(num_groups, dtype=np.int64)
    next_size[:-1] = size[1:]
    formable[signal] = np.where(has_next & is_pair, next_size, 0)[group[signal]]
    lost[signal] = np.where(has_next & ~is_pair, next_size, 0)[group[signal]]
    return formable, lost


def _wrap_angle(angle: np.ndarray) -> np.ndarray:
    """Maps a difference of two angles in [-pi, pi] into [-pi, pi]."""
    return angle - _TWO_PI * ((angle > np.pi).astype(np.float64) - (angle < -np.pi))


def _align_truth(event_id: int, hit_id: np.ndarray, truth_hit_id: np.ndarray) -> np.ndarray:
    """int64 [N]: the truth row of each hit."""
    if len(truth_hit_id) == 0:
        raise DataError(
            f"event {event_id}: no truth; graph construction needs truth.csv (particle_id) "
            "for the labels and the pT cut"
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


def _candidates_between(
    a: np.ndarray,
    b: np.ndarray,
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    outer_is_barrel: bool,
    phi_slope_max: float,
    z0_max: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates from inner hits ``a`` to outer hits ``b`` (one layer pair); see
    ``find_candidate_pairs``."""
    r_a, z_a = r[a], z[a]
    r_b_min, r_b_max = r[b].min(), r[b].max()
    # u: the coordinate along the outer surface (z on a cylinder, r on a disk). From
    # z0 = z_a - r_a dz / dr with |z0| <= z0_max and dr > 0, bound u_b (and dr) per inner hit.
    with np.errstate(divide="ignore", invalid="ignore"):
        if outer_is_barrel:
            u_b = z[b]
            # z_b = z_a + (z_a - z0) dr / r_a, linear in z0 and dr: take the extreme corners.
            corners = [
                z_a + (z_a - z0) * (dr / r_a)
                for z0 in (-z0_max, z0_max)
                for dr in (r_b_min - r_a, r_b_max - r_a)
            ]
            u_lo, u_hi = np.minimum.reduce(corners), np.maximum.reduce(corners)
            dr_hi = r_b_max - r_a
        else:
            u_b = r[b]
            # z0 = z_a - r_a dz / dr with dr > 0 puts z_a - z0 on the side of dz, so
            # dr = r_a |dz| / |z_a - z0| with |z_a - z0| in [near, far]. Disk modules may be
            # staggered in z, so |dz| spans the layer's z range; an inner hit inside that range
            # (dz of either sign) is not bounded.
            dz_min, dz_max = z[b].min() - z_a, z[b].max() - z_a
            side = np.where(dz_min > 0, 1.0, np.where(dz_max < 0, -1.0, 0.0))
            abs_dz_min = np.where(side > 0, dz_min, -dz_max)
            abs_dz_max = np.where(side > 0, dz_max, -dz_min)
            near = side * z_a - z0_max
            far = side * z_a + z0_max
            dr_lo = np.where(far > 0, r_a * abs_dz_min / far, np.inf)
            dr_hi = np.where(near > 0, r_a * abs_dz_max / near, np.inf)
            unbounded = side == 0
            dr_lo = np.where(unbounded, -np.inf, dr_lo)
            dr_hi = np.where(unbounded, np.inf, dr_hi)
            u_lo, u_hi = r_a + dr_lo, r_a + dr_hi
            dr_hi = np.minimum(dr_hi, r_b_max - r_a)
    margin = 1e-9 * (np.abs(r_a) + np.abs(z_a) + z0_max)  # keep boundary pairs for the exact cut
    u_lo, u_hi = u_lo - margin, u_hi + margin
    half_width = phi_slope_max * np.maximum(dr_hi, 0.0) * (1.0 + 1e-12)

    # Bin the outer hits along u; inside a bin, phis sorted and repeated at -2pi, 0, +2pi, all
    # in one sorted key array: key = bin * stride + phi + 3 pi.
    u_min, u_max = u_b.min(), u_b.max()
    num_bins = int(np.clip(len(b) // 32, 1, 64))
    bin_width = max((u_max - u_min) / num_bins, 1e-9)
    b_bin = np.minimum(((u_b - u_min) / bin_width).astype(np.int64), num_bins - 1)
    stride = 32.0  # > 6 pi, so bins never overlap
    shifted = phi[b] + 3.0 * np.pi
    keys = (
        np.concatenate([shifted - _TWO_PI, shifted, shifted + _TWO_PI]) + np.tile(b_bin, 3) * stride
    )
    key_order = np.argsort(keys, kind="stable")
    keys = keys[key_order]
    key_hit = np.tile(b, 3)[key_order]

    valid = (u_hi >= u_min) & (u_lo <= u_max) & (half_width > 0)
    bin_lo = np.clip(np.floor((np.where(valid, u_lo, u_min) - u_min) / bin_width), 0, num_bins - 1)
    bin_hi = np.clip(np.floor((np.where(valid, u_hi, u_min) - u_min) / bin_width), 0, num_bins - 1)
    bin_lo, bin_hi = bin_lo.astype(np.int64), bin_hi.astype(np.int64)
    num_spanned = np.where(valid, bin_hi - bin_lo + 1, 0)
    inner = np.repeat(np.arange(len(a)), num_spanned)
    offset = np.arange(len(inner)) - np.repeat(np.cumsum(num_spanned) - num_spanned, num_spanned)
    base = (bin_lo[inner] + offset) * stride + phi[a][inner] + 3.0 * np.pi
    w = half_width[inner]
    full = w >= np.pi
    # Closed window [phi - w, phi + w]; a full turn is taken half-open so no hit comes twice.
    start = np.searchsorted(keys, np.where(full, base - np.pi, base - w), side="left")
    stop = np.where(
        full,
        np.searchsorted(keys, base + np.pi, side="left"),
        np.searchsorted(keys, base + w, side="right"),
    )
    count = np.maximum(stop - start, 0)
    total = int(count.sum())
    position = np.repeat(start - (np.cumsum(count) - count), count) + np.arange(total)
    return np.repeat(a[inner], count), key_hit[position]


def _adjacency_mask(adjacency: np.ndarray, num_layers: int) -> np.ndarray:
    mask = np.zeros((num_layers, num_layers), dtype=bool)
    if len(adjacency):
        mask[adjacency[:, 0], adjacency[:, 1]] = True
    return mask


@functools.lru_cache(maxsize=1)
def _barrel_adjacency() -> np.ndarray:
    inner = np.arange(detector.NUM_BARREL_LAYERS - 1)
    pairs = np.stack([inner, inner + 1], axis=1)
    pairs.flags.writeable = False
    return pairs


@functools.lru_cache(maxsize=1)
def _scanned_adjacency() -> np.ndarray:
    """Consecutive surface crossings of helices from the beam line, over a grid of
    pseudorapidity, vertex z and curvature radius. (A grid 6x denser in eta, 3x in z and 2x in
    pT gives the same 114 pairs.)"""
    eta = np.linspace(-4.5, 4.5, 601)
    z0 = np.linspace(-200.0, 200.0, 5)
    pt = np.array([0.15, 0.3, 0.6, 1.0, 3.0, np.inf])
    lam_grid, z0_grid, pt_grid = np.meshgrid(np.sinh(eta), z0, pt, indexing="ij")
    lam, vz = lam_grid.ravel(), z0_grid.ravel()
    radius = pt_grid.ravel() / 0.6 * 1000.0  # mm at 2 T
    # Transverse path s to reach radius r: 2R asin(r / 2R) (s = r for a straight line);
    # the transverse radius at path s: 2R sin(s / 2R); the outgoing arc ends at s = pi R.
    path = np.full((len(lam), detector.NUM_LAYERS), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for layer in detector.LAYERS:
            if layer.is_barrel:
                ratio = layer.r_min / (2.0 * radius)
                s = np.where(ratio <= 1.0, 2.0 * radius * np.arcsin(np.minimum(ratio, 1.0)), np.inf)
                s = np.where(np.isinf(radius), layer.r_min, s)
                ok = np.isfinite(s) & (np.abs(vz + lam * s) <= layer.z_max)
            else:
                s = (layer.z_min - vz) / lam
                rho = np.where(np.isinf(radius), s, 2.0 * radius * np.sin(s / (2.0 * radius)))
                ok = (s > 0) & (s <= np.pi * radius) & (rho >= layer.r_min) & (rho <= layer.r_max)
            path[:, layer.index] = np.where(ok, s, np.inf)
    order = np.argsort(path, axis=1)
    ordered_path = np.take_along_axis(path, order, axis=1)
    consecutive = np.isfinite(ordered_path[:, 1:])
    keys = order[:, :-1][consecutive] * detector.NUM_LAYERS + order[:, 1:][consecutive]
    keys = np.unique(keys)
    pairs = np.stack([keys // detector.NUM_LAYERS, keys % detector.NUM_LAYERS], axis=1)
    pairs.flags.writeable = False
    return pairs
