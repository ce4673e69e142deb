"""The real distributed stack: Horovod allreduce/allgather/broadcast under two ranks, and
hvdtrack's exchange on one rank and on two."""

import json

import pytest

from tests.launch import check, horovodrun

pytestmark = pytest.mark.distributed


def results(out) -> dict[int, dict]:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return {row["rank"]: row for row in rows}


@pytest.mark.parametrize("controller", ["gloo", "mpi", "mpirun"])
def test_two_ranks_reduce_to_the_same_values(controller, tmp_path):
    args = ["tests/distributed/allreduce_program.py", str(tmp_path)]
    check(horovodrun(2, args, controller))  # launch.horovodrun's 300 s hang guard
    out = results(tmp_path)
    assert sorted(out) == [0, 1]
    for rank in (0, 1):
        row = out[rank]
        assert row["size"] == 2
        # rank 0 holds [1,2,3], rank 1 holds [2,4,6].
        assert row["sum"] == [3.0, 6.0, 9.0]
        assert row["average"] == [1.5, 3.0, 4.5]
        assert row["gathered"] == [0.0, 1.0, 1.0]
        assert row["broadcast"] == 10.0
        if controller == "gloo":
            assert row["gloo"] and not row["mpi"]
        else:
            assert row["mpi"] and not row["gloo"]


# hvdtrack's gradient exchange, fp16-compressed: 1.0001 x (rank + 1) on each rank. Where it goes
# through Horovod, each rank's value is rounded to float16 (1.0001 -> 1.0) before the sum.
EXCHANGE = """
import json, os, sys
import tensorflow as tf
from hvdtrack.distributed.config import DistributedConfig
from hvdtrack.distributed.workers import HorovodWorkers
workers = HorovodWorkers(DistributedConfig(strategy="horovod", compression="fp16", deadline_s=None))
value = [tf.constant([1.0001]) * (workers.rank + 1)]
row = {"rank": workers.rank, "alone": workers.alone,
       "sum": float(workers.reduce_gradients(value)[0][0]),
       "exact_sum": float(workers.reduce_sum(value)[0][0])}
# An elastic job keeps the collective, even on one rank (the flag as elastic horovodrun sets
# it; this job is not elastic, so this checks what ``alone`` reads, not an elastic reset).
os.environ["HOROVOD_ELASTIC"] = "1"
row.update(elastic_alone=workers.alone, elastic_sum=float(workers.reduce_gradients(value)[0][0]))
print("RESULT", json.dumps(row), flush=True)
workers.shutdown()
"""


@pytest.mark.parametrize("np", [1, 2])
def test_one_rank_exchanges_nothing_as_horovods_tape(np, tmp_path):
    """On one rank the sums over ranks are the rank's own tensors, untouched: no compression, no
    trip through Horovod's background loop (as ``hvd.DistributedGradientTape``'s
    ``_allreduce_cond``). Two ranks, or an elastic job, go through Horovod. Horovod's timeline
    (rank 0's) lists the allreduces it ran."""
    timeline = tmp_path / "timeline.json"
    out = check(horovodrun(np, ["-c", EXCHANGE], HOROVOD_TIMELINE=str(timeline)))
    rows = {r["rank"]: r for r in (json.loads(line.split("RESULT ", 1)[1])
                                   for line in out.splitlines() if "RESULT " in line)}  # fmt: skip
    assert sorted(rows) == list(range(np))
    for row in rows.values():
        assert row["alone"] is (np == 1)
        assert row["elastic_alone"] is False
        # float32(1.0001) as is on one rank; float16 1.0 + 2.0 on two
        assert row["sum"] == (pytest.approx(1.0001, abs=1e-7) if np == 1 else 3.0)
        assert row["elastic_sum"] == (1.0 if np == 1 else 3.0)
        assert row["exact_sum"] == pytest.approx(1.0001 if np == 1 else 3.0003, abs=1e-6)
    # The allreduces Horovod ran, by the dtype it sent: the float32 exact sums on two ranks only,
    # after the fp16-compressed gradients. The timeline may end before the last allreduce's
    # record (the elastic job's), so that one is not counted.
    ran = timeline.read_text()
    assert ran.count('"dtype": "float32"') == (1 if np == 2 else 0)
    assert ran.count('"dtype": "float16"') >= (1 if np == 2 else 0)
