"""The construction benchmark runs end to end on a small event and prints its figures."""

from __future__ import annotations

import json

from hvdtrack.bench import construct


def test_benchmark_prints_and_records_every_figure(tmp_path, capsys):
    out = tmp_path / "construct.json"
    assert construct.main(["--num-particles", "200", "--repeats", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for name in (
        "generate_event",
        "write_event (csv.gz)",
        "read_event (csv)",
        *construct.CONSTRUCTIONS,
    ):
        assert name in text
    records = json.loads(out.read_text())
    assert set(records["graphs"]) == set(construct.CONSTRUCTIONS)
    assert all(len(seconds) == 1 for seconds in records["timings"].values())


def test_compare_real_prints_the_table(capsys):
    assert construct.main(["--compare-real", "--num-particles", "200", "--events", "1"]) == 0
    text = capsys.readouterr().out
    assert "| figure | real (physics.md) | synthetic | synthetic / real | within +-30% |" in text
    assert "| pT > 1: edges per graph | 15,100-15,300 |" in text
