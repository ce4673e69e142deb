"""Epoch plans: greedy edge balancing, equal steps, reshuffling, read order and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.inputs.balance import epoch_read_order, plan_epoch


def test_one_step_is_packed_greedily_largest_first():
    # 9 -> w0, 8 -> w1, 7 -> w2, 3 -> w2 (7 is least), 2 -> w1 (8 < 9), 1 -> w0 (the only one with room)
    edges = np.array([2, 9, 7, 1, 8, 3])
    plan = plan_epoch(edges, num_workers=3, batch_graphs=2, seed=0, epoch=0)
    assert plan.num_steps == 1
    assert [sorted(plan.graph_ids[w, 0].tolist()) for w in range(3)] == [[1, 3], [0, 4], [2, 5]]
    assert plan.edges.tolist() == [[10, 10, 10]]
    assert plan.mean_imbalance == plan.worst_imbalance == 1.0


def test_ties_go_to_the_lowest_worker():
    plan = plan_epoch(np.array([10, 7, 5, 1]), num_workers=2, batch_graphs=2, seed=0, epoch=0)
    assert [sorted(plan.graph_ids[w, 0].tolist()) for w in range(2)] == [[0, 3], [1, 2]]
    assert plan.edges.tolist() == [[11, 12]]
    assert plan.worst_imbalance == pytest.approx(12 / 11.5)


def test_each_step_keeps_read_order_within_a_worker():
    rng = np.random.default_rng(0)
    plan = plan_epoch(rng.integers(1, 1000, 50), num_workers=2, batch_graphs=3, seed=1, epoch=2)
    position = np.empty(50, dtype=np.int64)
    position[plan.order] = np.arange(50)
    for worker in range(2):
        steps = position[plan.graph_ids[worker]]  # [steps, batch]
        assert (np.diff(steps, axis=1) > 0).all()
        assert (steps // 6 == np.arange(plan.num_steps)[:, None]).all()  # step s from block s


def test_equal_steps_and_every_graph_at_most_once():
    rng = np.random.default_rng(1)
    num_edges = rng.integers(1_000, 100_000, 103)
    plan = plan_epoch(num_edges, num_workers=4, batch_graphs=3, seed=7, epoch=0)
    assert plan.graph_ids.shape == (4, 8, 3)  # 103 // 12 = 8 steps for every worker
    used = plan.graph_ids.reshape(-1)
    assert len(np.unique(used)) == used.size == plan.num_used_graphs == 96
    np.testing.assert_array_equal(np.sort(used), np.sort(plan.order[:96]))
    np.testing.assert_array_equal(plan.edges, num_edges[plan.graph_ids].sum(axis=2).T)
    assert plan.mean_imbalance < plan.unbalanced_step_imbalance.mean()
    assert plan.worst_imbalance <= plan.unbalanced_step_imbalance.max()


def test_plan_is_deterministic_and_reshuffled_every_epoch():
    num_edges = np.arange(40) * 10 + 5
    first = plan_epoch(num_edges, 2, 2, seed=3, epoch=1)
    again = plan_epoch(num_edges, 2, 2, seed=3, epoch=1)
    following = plan_epoch(num_edges, 2, 2, seed=3, epoch=2)
    other_seed = plan_epoch(num_edges, 2, 2, seed=4, epoch=1)
    np.testing.assert_array_equal(first.graph_ids, again.graph_ids)
    np.testing.assert_array_equal(first.order, again.order)
    assert not np.array_equal(first.order, following.order)
    assert not np.array_equal(first.order, other_seed.order)


def test_read_order_interleaves_groups_of_shards_round_robin():
    # Shards of 3, 2 and 3 graphs: ids 0-2 in shard 0, 3-4 in shard 1, 5-7 in shard 2.
    shard_of = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    record_of = np.array([0, 1, 2, 0, 1, 0, 1, 2])
    order = epoch_read_order(shard_of, record_of, np.array([2, 0, 1]), shards_per_group=2)
    assert order.tolist() == [5, 0, 6, 1, 7, 2, 3, 4]


def test_plan_with_shards_reads_whole_shards_in_a_new_order_each_epoch():
    shard_of = np.repeat(np.arange(6), 4)
    record_of = np.tile(np.arange(4), 6)
    num_edges = np.full(24, 10)
    plans = [
        plan_epoch(
            num_edges,
            2,
            2,
            seed=0,
            epoch=e,
            shard_of=shard_of,
            record_of=record_of,
            shards_per_group=2,
        )
        for e in range(2)
    ]
    for plan in plans:
        assert sorted(plan.shard_order.tolist()) == list(range(6))
        expected = epoch_read_order(shard_of, record_of, plan.shard_order, 2)
        np.testing.assert_array_equal(plan.order, expected)
    assert plans[0].shard_order.tolist() != plans[1].shard_order.tolist()


def test_too_few_graphs_are_refused():
    with pytest.raises(
        DataError, match="the split has 5 graphs but one step of 2 workers x 4 graphs needs 8"
    ):
        plan_epoch(np.ones(5), num_workers=2, batch_graphs=4, seed=0, epoch=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"num_workers": 0},
            r"num_workers \(0\), batch_graphs \(2\) and shards_per_group \(4\) must be >= 1",
        ),
        ({"epoch": -1}, r"seed \(0\) and epoch \(-1\) must be >= 0"),
        ({"shard_of": np.zeros(8, int)}, "needs both shard_of and record_of"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = {"num_workers": 2, "batch_graphs": 2, "seed": 0, "epoch": 0} | kwargs
    with pytest.raises(ConfigError, match=message):
        plan_epoch(np.ones(8), **args)


def test_worker_outside_the_plan_is_refused():
    plan = plan_epoch(np.ones(8), 2, 2, seed=0, epoch=0)
    with pytest.raises(ConfigError, match=r"worker 2 is not in \[0, 2\)"):
        plan.worker_graph_ids(2)
