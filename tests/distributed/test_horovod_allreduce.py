"""The real distributed stack: Horovod allreduce/allgather/broadcast under two ranks."""

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
