"""Tiny hand-made graph batches for the model tests."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from graph_nets import utils_tf

from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import fused_kernels

# A small literal config: node latent 4, edge latent 3, one hidden layer of 2 in the head.
TINY = ModelConfig(
    node_encoder=(4,),
    edge_encoder=(3,),
    edge_update=(3,),
    node_update=(4,),
    output_head=(2,),
    num_message_passing_steps=3,
)


def two_graphs():
    """Two graphs batched: 4 + 3 nodes, 5 + 2 edges (node 3 of graph 0 has no edges)."""
    rng = np.random.default_rng(7)
    graph_a = dict(
        nodes=rng.standard_normal((4, 3)).astype(np.float32),
        edges=rng.standard_normal((5, 2)).astype(np.float32),
        senders=np.array([0, 0, 1, 2, 1], np.int32),
        receivers=np.array([1, 2, 2, 0, 1], np.int32),  # includes a self-loop (1 -> 1)
        globals=np.zeros(1, np.float32),
    )
    graph_b = dict(
        nodes=rng.standard_normal((3, 3)).astype(np.float32),
        edges=rng.standard_normal((2, 2)).astype(np.float32),
        senders=np.array([0, 1], np.int32),
        receivers=np.array([1, 2], np.int32),
        globals=np.zeros(1, np.float32),
    )
    return utils_tf.data_dicts_to_graphs_tuple([graph_a, graph_b])


@pytest.fixture
def graphs():
    return two_graphs()


@pytest.fixture(scope="module")
def kernels():
    """The loaded kernel library (install.sh installs g++; test_kernels.py covers a machine
    without one)."""
    library = fused_kernels()
    assert library is not None
    return library


def cpu_supports(flag: str) -> bool:
    """Whether /proc/cpuinfo lists ``flag`` (``avx512f``, ``avx2``, ``fma``); False without it."""
    try:
        with open("/proc/cpuinfo") as f:
            return flag in f.read().split()
    except OSError:
        return False


def widest_isa() -> str:
    """The vector code the kernel library picks here when nothing caps it (``ChooseIsa``)."""
    avx2 = cpu_supports("avx2") and cpu_supports("fma")
    return "avx512" if avx2 and cpu_supports("avx512f") else "avx2" if avx2 else "none"


def digests_on_every_isa(program: str) -> list[tuple[str, str]]:
    """``program`` (given the intra-op thread count as argv[1], printing its ISA and a digest
    last) run in subprocesses: the widest vector code here on one thread, AVX2's and the scalar
    code on two. Asserts each ran the ISA asked for; returns the (isa, digest) pairs."""
    runs = []
    for isa, threads in ((None, 1), ("avx2", 2), ("none", 2)):
        env = {k: v for k, v in os.environ.items() if k != "HVDTRACK_KERNEL_ISA"}
        env.update({"HVDTRACK_KERNEL_ISA": isa} if isa else {})
        done = subprocess.run(
            [sys.executable, "-c", program, str(threads)],
            capture_output=True, text=True, env=env, timeout=300, check=True,
        )  # fmt: skip
        runs.append(tuple(done.stdout.split()[-2:]))
    avx2 = "avx2" if widest_isa() != "none" else "none"
    assert [isa for isa, _ in runs] == [widest_isa(), avx2, "none"], runs
    return runs
