"""Ranks that outnumber the cores: read from the launcher's environment, MPI told to yield."""

import pytest

from hvdtrack.distributed.cores import core_slice, launcher_local_size, share_cores


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, 1),
        ({"HOROVOD_LOCAL_SIZE": "8"}, 8),  # horovodrun --gloo
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),  # mpirun, horovodrun --mpi
        ({"MPI_LOCALNRANKS": "3"}, 3),  # MPICH
        ({"HOROVOD_LOCAL_SIZE": "x", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
        ({"HOROVOD_LOCAL_SIZE": "0"}, 1),
    ],
)
def test_local_size_from_launcher(environ, expected):
    assert launcher_local_size(environ) == expected


def test_more_ranks_than_cores_makes_mpi_yield():
    environ = {}
    assert share_cores(100_000, environ) is True
    assert environ == {"OMPI_MCA_mpi_yield_when_idle": "1"}


def test_an_explicit_mpi_setting_wins():
    environ = {"OMPI_MCA_mpi_yield_when_idle": "0"}
    assert share_cores(100_000, environ) is True
    assert environ == {"OMPI_MCA_mpi_yield_when_idle": "0"}


def test_one_rank_per_core_changes_nothing():
    environ = {}
    assert share_cores(1, environ) is False
    assert environ == {}


@pytest.mark.parametrize(
    ("cpus", "rank", "size", "expected"),
    [
        ([0, 1], 0, 2, [0]),
        ([0, 1], 1, 2, [1]),
        ([3, 1, 2, 0], 1, 2, [2, 3]),  # sorted, then sliced
        ([0, 1, 2, 3, 4], 1, 2, [2, 3]),  # the odd core is left to nobody
        ([0, 1], 0, 1, [0, 1]),
        ([0, 1], 2, 4, []),  # more ranks than cores: no slice
    ],
)
def test_core_slices_are_disjoint_and_in_order(cpus, rank, size, expected):
    assert core_slice(cpus, rank, size) == expected
