"""The TrackML score and track rates on hand-made events with known answers."""

import numpy as np
import pytest

from hvdtrack.tracks.matching import (
    TrackCounts,
    binned_efficiency,
    count_tracks,
    match_tracks,
    trackml_score,
)

# Two particles of 4 hits (weights 0.1 / 0.15 each: the event sums to 1) and 2 noise hits.
PARTICLE = np.array([1, 1, 1, 1, 2, 2, 2, 2, 0, 0])
WEIGHT = np.array([0.1] * 4 + [0.15] * 4 + [0.0, 0.0])


def test_perfect_tracks_score_one():
    tracks = np.array([7, 7, 7, 7, 9, 9, 9, 9, 0, 0])
    assert trackml_score(tracks, PARTICLE, WEIGHT) == pytest.approx(1.0)
    match = match_tracks(tracks, PARTICLE)
    assert match.matched.tolist() == [True, True]
    assert match.majority_particle.tolist() == [1, 2]
    counts = count_tracks(match, np.array([2.0, 3.0]), pt_min=1.0, min_hits=4)
    assert counts.rates() == {"efficiency": 1.0, "fake_rate": 0.0, "duplicate_rate": 0.0}


def test_a_split_track_keeps_only_its_larger_piece():
    # Particle 2 split 3 + 1: the 3-hit piece holds > half of it; the 1-hit piece is not matched.
    tracks = np.array([1, 1, 1, 1, 2, 2, 2, 3, 0, 0])
    assert trackml_score(tracks, PARTICLE, WEIGHT) == pytest.approx(0.4 + 3 * 0.15)
    # Split 2 + 2: neither piece holds more than half of the particle.
    tracks = np.array([1, 1, 1, 1, 2, 2, 3, 3, 0, 0])
    assert trackml_score(tracks, PARTICLE, WEIGHT) == pytest.approx(0.4)
    counts = count_tracks(match_tracks(tracks, PARTICLE), np.array([2.0, 3.0]), 1.0, 2)
    assert (counts.reconstructed, counts.tracks, counts.matched_tracks) == (1, 3, 1)
    # Both pieces of particle 2 are pure: one of the 3 majority tracks is a duplicate.
    assert counts.rates() == {"efficiency": 0.5, "fake_rate": 2 / 3, "duplicate_rate": 1 / 3}


def test_merged_tracks_score_nothing_when_no_particle_holds_the_majority():
    tracks = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    assert trackml_score(tracks, PARTICLE, WEIGHT) == 0.0
    # 4 hits of particle 1 + 2 of particle 2: particle 1 wins, only its hits count.
    tracks = np.array([1, 1, 1, 1, 1, 1, 2, 2, 0, 0])
    assert trackml_score(tracks, PARTICLE, WEIGHT) == pytest.approx(0.4)
    match = match_tracks(tracks, PARTICLE)
    assert match.majority_hits.tolist() == [4, 2] and match.matched.tolist() == [True, False]


def test_noise_tracks_score_nothing_and_are_fakes():
    noise = np.zeros(6, np.int64)
    tracks = np.array([1, 1, 1, 2, 2, 2])
    assert trackml_score(tracks, noise, np.zeros(6)) == 0.0
    match = match_tracks(tracks, noise)
    assert match.particle_id.size == 0 and not match.matched.any()
    counts = count_tracks(match, np.zeros(0))
    assert counts.tracks == 2 and counts.rates()["fake_rate"] == 1.0
    assert np.isnan(counts.rates()["efficiency"])


def test_no_tracks_at_all():
    assert trackml_score(np.zeros(10, np.int64), PARTICLE, WEIGHT) == 0.0
    counts = count_tracks(match_tracks(np.zeros(10), PARTICLE), np.array([2.0, 3.0]), 1.0, 4)
    assert (counts.reconstructable, counts.reconstructed, counts.tracks) == (2, 0, 0)


def test_duplicates_are_extra_majority_tracks_of_one_particle():
    particle = np.array([1] * 6)
    tracks = np.array([1, 1, 2, 2, 3, 3])  # three pure pieces, none with > half the particle
    counts = count_tracks(match_tracks(tracks, particle), np.array([5.0]), 1.0, 3)
    assert (counts.majority_tracks, counts.duplicate_tracks) == (3, 2)
    assert counts.rates()["duplicate_rate"] == pytest.approx(2 / 3)


def test_reconstructable_needs_pt_and_hits():
    tracks = np.array([1, 1, 1, 1, 2, 2, 2, 2, 0, 0])
    match = match_tracks(tracks, PARTICLE)
    assert count_tracks(match, np.array([0.5, 3.0]), 1.0, 4).reconstructable == 1
    assert count_tracks(match, np.array([2.0, 3.0]), 1.0, 5).reconstructable == 0


def test_counts_add_over_events():
    a = TrackCounts(2, 1, 3, 1, 2, 0)
    assert a + a == TrackCounts(4, 2, 6, 2, 4, 0)


def test_binned_efficiency():
    result = binned_efficiency(
        np.array([1.5, 1.6, 2.5, 10.0]), np.array([True, False, True, True]), np.array([1, 2, 3])
    )
    assert result["total"] == [2, 1] and result["matched"] == [1, 1]
    assert result["efficiency"] == [0.5, 1.0]
    assert result["error"] == pytest.approx([0.125**0.5, 0.0])
