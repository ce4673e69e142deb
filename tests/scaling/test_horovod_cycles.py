"""run_scripts/horovod_cycles.py: the wait in each step's exchange from a Horovod timeline, on a
hand-made timeline whose figures are worked out by hand, and on the timeline of a real
``horovodrun -np 2`` training."""

import importlib.util
import json

import pytest

from tests.launch import REPO, check, horovodrun, tiny_training
from tests.scaling.test_prediction_model import write_steps

SCRIPT = REPO / "run_scripts/horovod_cycles.py"


@pytest.fixture(scope="module")
def cycles():
    spec = importlib.util.spec_from_file_location("horovod_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _span(name, pid, begin, end):
    return [{"ph": "B", "name": name, "pid": pid, "ts": begin}, {"ph": "E", "pid": pid, "ts": end}]


def _exchange(agreed, done, nested=False):
    """Tensors 1 and 2 of one grouped allreduce: requested at agreed - 9 ms, agreed at
    ``agreed`` (tensor 2 one microsecond later), reduced until ``done`` (tensor 1: with a
    nested copy into the fusion buffer)."""
    events = []
    for pid, shift in ((1, 0), (2, 1)):
        events += _span("NEGOTIATE_ALLREDUCE", pid, agreed - 9000, agreed + shift)
        reduce = _span("ALLREDUCE", pid, agreed + 100, done if pid == 2 else done - 1)
        if nested and pid == 1:
            reduce[1:1] = _span("MEMCPY_IN_FUSION_BUFFER", pid, agreed + 110, agreed + 200)
        events += reduce
    return events


def hand_made_timeline(path, close=False):
    """Rank 0's loop starts every 20 ms. Three exchanges: agreed 1.001, 5.001 and 12.0 ms after
    a cycle start, reduced in 3, 2 and 4 ms. A broadcast (another tensor) is no exchange."""
    tensors = ((1, "gradients_1of2"), (2, "gradients_2of2"), (3, "broadcast_x"))
    names = [{"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}} for p, n in tensors]
    marks = [{"ph": "i", "name": "CYCLE_START", "ts": t, "s": "g"} for t in range(0, 100000, 20000)]
    events = names + marks + _span("NEGOTIATE_BROADCAST", 3, 500, 900)
    events += _exchange(21000, 24001) + _exchange(45000, 47001, nested=True)
    events += _exchange(71999, 76000)
    text = ",\n".join(json.dumps(e) for e in events)
    path.write_text("[\n" + text + ("\n]" if close else ",\n"))  # Horovod leaves it open
    return path


def hand_made_run(path, steps=3):
    """Two ranks; step 0 warm-up (a tie: rank 0 counts as last); step 1: rank 1 finishes last,
    its exchange 10 ms; step 2: rank 0 last, exchange 18 ms."""
    rank0 = [(100, 0.50, 0.030), (100, 0.47, 0.018)][: steps - 1]
    rank1 = [(100, 0.52, 0.010), (100, 0.45, 0.040)][: steps - 1]
    return write_steps(path, [rank0, rank1], distributed={"horovod_cycle_time_ms": 20})


def test_hand_made_timeline(cycles, tmp_path, capsys):
    timeline, run_dir = hand_made_timeline(tmp_path / "tl.json"), hand_made_run(tmp_path / "run")
    both, period, unwritten = cycles.pair(timeline, run_dir)
    assert (period, unwritten) == (20.0, 0)
    assert both["last_rank"].tolist() == [0, 1, 0]
    assert both["lag_ms"].tolist() == pytest.approx([1.001, 5.001, 12.0])
    assert both["allreduce_ms"].tolist() == pytest.approx([3.0, 2.0, 4.0])
    assert both["before_ms"].tolist()[1:] == pytest.approx([8.0, 14.0])
    # Step 0: rank 0 last, agreed 1 ms after its loop's start: its loop the latest. Step 1:
    # rank 1 last, rank 0's loop 5 ms ahead: rank 1's the latest. Neither waits for another.
    # Step 2: rank 0 last, rank 1's loop 12 ms behind: it waits for that one.
    assert both["waits_for_other"].tolist() == [False, False, True]
    assert cycles.main([str(timeline), str(run_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "3 exchanges, 2 after warm-up; 2 ranks; rank 0's loop every 20.00 ms",
        "agreement after rank 0's cycle start (the latest loop's lag): mean 8.50 ms, median "
        "8.50 ms",
        "rank last to finish | steps | its exchange | allreduce | exchange without it "
        "(ms, medians)",
        "                  0 |     1 |        18.00 |      4.00 |    14.00",
        "                  1 |     1 |        10.00 |      2.00 |     8.00",
        "                all |     2 |        14.00 |      3.00 |    11.00",
        "the last rank does not wait for the other's loop: 1 step(s), its exchange without the "
        "allreduce 8.00 ms on average",
        "the last rank waits for the other's loop: 1 step(s), its exchange without the allreduce "
        "14.00 ms on average (rank 0's wait, the lag: 12.00 ms)",
        "model (maths.cycle_wait): 10.00 ms for the last rank's own loop, 15.00 ms with the "
        "latest loop's lag at N=2",
    ]
    # A closed array reads the same.
    closed = hand_made_timeline(tmp_path / "closed.json", close=True)
    assert cycles.pair(closed, run_dir)[0].equals(both)


def test_what_does_not_pair_is_refused(cycles, tmp_path, capsys):
    timeline = hand_made_timeline(tmp_path / "tl.json")
    # The timeline ended before the last exchange's record: that step is left out.
    longer = hand_made_run(tmp_path / "longer")
    timing = longer / "timing.jsonl"
    rows = [json.loads(line) for line in timing.read_text().splitlines()]
    extra = [dict(r, step=3) for r in rows if r.get("kind") == "step" and r["step"] == 2]
    timing.write_text("".join(json.dumps(r) + "\n" for r in rows + extra))
    both, _, unwritten = cycles.pair(timeline, longer)
    assert (len(both), unwritten) == (3, 1)
    # More exchanges than steps: another run's timeline.
    fewer = hand_made_run(tmp_path / "fewer", steps=2)
    assert cycles.main([str(timeline), str(fewer)]) == 2
    err = capsys.readouterr().err
    assert f"{timeline} holds 3 gradient exchanges, {fewer} 2 steps" in err
    unmarked = tmp_path / "unmarked.json"
    unmarked.write_text(timeline.read_text().replace("CYCLE_START", "OTHER"))
    assert cycles.main([str(unmarked), str(fewer)]) == 2
    assert "no cycle marks - run with HOROVOD_TIMELINE_MARK_CYCLES=1" in capsys.readouterr().err
    # A last record cut mid-write is dropped: the end of tensor 2's third allreduce, here, so
    # that exchange ends with tensor 1's (a microsecond earlier).
    cut = tmp_path / "cut.json"
    cut.write_text(timeline.read_text().rstrip().rstrip(",")[:-12])
    assert cycles.pair(cut, longer)[0]["allreduce_ms"].tolist() == pytest.approx([3, 2, 3.999])
    for text, message in (
        ('[{"ph": ', "not a Horovod timeline (a JSON array of events): Expecting value"),
        ('{"ph": "B"}', "not a Horovod timeline (a JSON array of events)"),
        ('[{"ph": "i", "name": "CYCLE_START"}]', "not a Horovod timeline (an event without 'ts')"),
    ):
        broken = tmp_path / "broken.json"
        broken.write_text(text)
        assert cycles.main([str(broken), str(fewer)]) == 2
        assert f"{broken}: {message}" in capsys.readouterr().err, text
    adasum = tmp_path / "adasum.json"
    adasum.write_text(timeline.read_text().replace("gradients_", "adasum_"))
    assert cycles.main([str(adasum), str(fewer)]) == 2
    assert "no allreduce of gradients_* tensors" in capsys.readouterr().err


@pytest.mark.distributed
def test_the_timeline_of_a_real_two_rank_training(cycles, tiny_dataset, tmp_path):
    """Every exchange of a real run pairs with its step; each agreement comes within one cycle
    of rank 0's loop start, after Horovod reduced something."""
    run_dir, timeline = tmp_path / "run", tmp_path / "timeline.json"
    args = tiny_training(tiny_dataset, run_dir, "train.resume=false")
    marks = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    check(horovodrun(2, args, **marks))
    both, period, unwritten = cycles.pair(timeline, run_dir)
    assert len(both) >= 2 and unwritten <= cycles.UNWRITTEN
    assert period == pytest.approx(20.0, rel=0.2)  # configs/tiny.yaml's cycle
    assert ((both["lag_ms"] >= 0) & (both["lag_ms"] < period * 1.5)).all(), both
    assert (both["allreduce_ms"] > 0).all(), both
    assert set(both["last_rank"]) <= {0, 1}
