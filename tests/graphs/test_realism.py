"""Synthetic against real figures: double-hit removal, the +-30% verdict, the printed table."""

from __future__ import annotations

from hvdtrack.events.synthetic import SyntheticConfig, generate_event
from hvdtrack.graphs import realism

from .conftest import make_event


def test_without_double_hits_keeps_the_first_hit_of_each_crossing_and_all_noise():
    event = make_event(
        [
            (1, 8, 2, 32.0, 0.10, 0.0, 1),
            (2, 8, 2, 33.5, 0.11, 0.0, 1),  # particle 1's second hit on layer 8:2
            (3, 8, 4, 72.0, 0.10, 0.0, 1),
            (4, 8, 2, 32.0, 1.00, 0.0, 0),  # noise
            (5, 8, 2, 32.0, 1.01, 0.0, 0),  # noise on the same layer: kept
            (6, 13, 2, 260.0, 2.0, 0.0, 2),
        ],
        {1: 2.0, 2: 2.0},
    )
    single = realism.without_double_hits(event)
    assert single.hits.hit_id.tolist() == [1, 3, 4, 5, 6]
    assert single.truth.hit_id.tolist() == [1, 3, 4, 5, 6]


def test_within_thirty_percent_of_the_real_range():
    assert realism.within(0.33, 0.36, 0.36 * 1.3)
    assert not realism.within(0.33, 0.36, 0.36 * 1.31)
    assert realism.within(6200, 6900, 6200 * 0.7)
    assert not realism.within(6200, 6900, 6200 * 0.69)
    assert realism.within(None, None, 1.0) is None


def test_markdown_table_shows_ratio_and_verdict():
    rows = [("a", 2.0, 4.0, 3.3), ("b", 100.0, 100.0, 200.0), ("c", None, None, 5.0)]
    assert realism.markdown_table(rows).splitlines()[2:] == [
        "| a | 2-4 | 3.3 | 1.10 | yes |",
        "| b | 100 | 200 | 2.00 | NO |",
        "| c | - | 5 | - | - |",
    ]


def test_compare_gives_every_figure_on_small_events():
    cfg = SyntheticConfig(num_particles=300, num_vertices=10)
    rows = realism.compare(generate_event(cfg, 1000 + i, seed=2) for i in range(2))
    assert [row[0] for row in rows] == [label for label, _, _ in realism.REAL.values()]
    values = {label: value for label, _, _, value in rows}
    assert 0.1 < values["layer crossings of a particle with 2 hits"] < 0.5
    assert abs(values["noise hits, whole event"] - cfg.noise_fraction) < 0.01
    # with double hits a graph has more nodes than without
    assert values["with double hits, pT > 1: nodes per graph"] > values["pT > 1: nodes per graph"]


def test_a_default_event_lands_within_thirty_percent_of_the_real_figures():
    rows = realism.compare([generate_event(SyntheticConfig(), 1000, seed=1)])
    # the maximum of hits per particle depends on how many particles are looked at
    missed = [
        (label, low, high, value)
        for label, low, high, value in rows
        if realism.within(low, high, value) is False and "max" not in label
    ]
    assert not missed
