"""Epoch plans: greedy edge balancing per step, balanced epoch shares, equal steps, reshuffling,
read order and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.inputs.balance import epoch_read_order, plan_epoch


def test_one_step_is_packed_greedily_largest_first():
    # 9 -> b0, 8 -> b1, 7 -> b2, 3 -> b2 (7 is least), 2 -> b1 (8 < 9), 1 -> b0 (the only one with room)
    edges = np.array([2, 9, 7, 1, 8, 3])
    plan = plan_epoch(edges, num_workers=3, batch_graphs=2, seed=0, epoch=0)
    assert plan.num_steps == 1
    bins = sorted(sorted(plan.graph_ids[w, 0].tolist()) for w in range(3))
    assert bins == [[0, 4], [1, 3], [2, 5]]
    assert plan.edges.tolist() == [[10, 10, 10]]
    assert plan.mean_imbalance == plan.worst_imbalance == 1.0


def test_two_graphs_each_pair_the_largest_with_the_smallest():
    plan = plan_epoch(np.array([10, 7, 5, 1]), num_workers=2, batch_graphs=2, seed=0, epoch=0)
    assert sorted(sorted(plan.graph_ids[w, 0].tolist()) for w in range(2)) == [[0, 3], [1, 2]]
    assert sorted(plan.edges[0].tolist()) == [11, 12]
    assert plan.worst_imbalance == pytest.approx(12 / 11.5)


# One shard read whole: the read order is the graph ids, so the steps below are fixed.
def _one_shard(num_graphs):
    return {"shard_of": np.zeros(num_graphs, int), "record_of": np.arange(num_graphs)}


def test_the_larger_graph_of_a_step_goes_to_the_worker_with_fewer_edges_so_far():
    # Steps (9, 5) and (6, 8): the worker with the 9 gets the 6 (15 and 13 edges, not 17 and 11).
    plan = plan_epoch(np.array([9, 5, 6, 8]), 2, 1, seed=0, epoch=0, **_one_shard(4))
    assert plan.order.tolist() == [0, 1, 2, 3]
    assert sorted(plan.graph_ids[w, :, 0].tolist() for w in range(2)) == [[0, 2], [1, 3]]
    assert sorted(plan.edges.sum(axis=0).tolist()) == [13, 15]


def test_three_equal_steps_give_each_worker_one_graph_of_each_size():
    # Pairing two steps head to tail balances them, but the third then needs a chain of swaps.
    edges = np.array([30, 20, 10, 30, 20, 10, 30, 20, 10])
    plan = plan_epoch(edges, 3, 1, seed=0, epoch=0, **_one_shard(9))
    assert [sorted(edges[plan.graph_ids[w, :, 0]].tolist()) for w in range(3)] == [[10, 20, 30]] * 3
    assert plan.edges.sum(axis=0).tolist() == [60, 60, 60]


def test_epoch_balancing_keeps_each_steps_bins():
    # Steps (8, 5, 4, 1), (7, 6, 3, 1), (9, 2, 6, 4): bins of 9+9, 8+9, 11+10 edges, as if alone.
    edges = np.array([8, 5, 4, 1, 7, 6, 3, 1, 9, 2, 6, 4])
    plan = plan_epoch(edges, 2, 2, seed=0, epoch=0, **_one_shard(12))
    assert [sorted(step.tolist()) for step in plan.edges] == [[9, 9], [8, 9], [10, 11]]
    assert plan.step_imbalance.tolist() == pytest.approx([1.0, 9 / 8.5, 11 / 10.5])
    assert plan.unbalanced_step_imbalance.tolist() == pytest.approx([13 / 9, 13 / 8.5, 11 / 10.5])
    assert plan.edges.sum(axis=0).tolist() == [28, 28]


# Edges of the 40 training graphs of configs/default.yaml (data/default/manifest.json), in
# manifest order: 8 graphs per shard.
DEFAULT_TRAIN_EDGES = [
    7509, 7310, 8752, 7364, 7622, 7972, 8060, 8814, 8416, 7113,
    8423, 7890, 8588, 8724, 8235, 8734, 8659, 8423, 7831, 7936,
    7570, 7590, 9001, 7809, 7839, 8097, 8546, 7563, 8279, 7997,
    7316, 9183, 8534, 8286, 7443, 7247, 7185, 8920, 9163, 7377,
]  # fmt: skip


@pytest.mark.parametrize(
    "num_workers, batch_graphs, streamed",
    [(2, 1, False), (8, 1, False), (2, 1, True), (8, 1, True), (2, 2, False), (4, 2, False)],
)
def test_default_dataset_every_worker_gets_its_share_of_every_epoch(
    num_workers, batch_graphs, streamed
):
    layout = {"shard_of": np.arange(40) // 8, "record_of": np.arange(40) % 8} if streamed else {}
    plans = [  # seed 1: the default config's train.seed
        plan_epoch(DEFAULT_TRAIN_EDGES, num_workers, batch_graphs, seed=1, epoch=e, **layout)
        for e in range(24)
    ]
    per_epoch = np.array([plan.edges.sum(axis=0) for plan in plans])  # [epoch, worker]
    share = per_epoch / per_epoch.mean(axis=1, keepdims=True)
    assert np.abs(share - 1).max() < 0.01
    # No worker favoured: the most loaded one changes, and over 24 epochs all are even.
    assert len(set(np.argmax(per_epoch, axis=1).tolist())) > 1
    assert np.abs(share.mean(axis=0) - 1).max() < 0.001


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


def test_a_sort_window_pairs_graphs_of_neighbouring_size():
    # 16 graphs of 1-16 edges, 2 workers x 1 graph: 8 steps, windows of 2 steps (4 graphs)
    edges = np.array([5, 1, 8, 3, 7, 2, 6, 4, 13, 9, 16, 11, 15, 10, 14, 12])
    plan = plan_epoch(edges, 2, 1, seed=0, epoch=0, sort_window=2)
    as_read = plan_epoch(edges, 2, 1, seed=0, epoch=0)
    for start in range(0, 16, 4):
        window = np.sort(edges[as_read.order[start : start + 4]])
        steps = sorted(sorted(step.tolist()) for step in plan.edges[start // 2 : start // 2 + 2])
        assert steps == [window[:2].tolist(), window[2:].tolist()]
    assert plan.mean_imbalance < as_read.mean_imbalance


def test_each_sort_window_keeps_the_graphs_read_for_it():
    rng = np.random.default_rng(2)
    edges = rng.integers(100, 1000, 50)
    as_read = plan_epoch(edges, 2, 2, seed=5, epoch=3)
    plan = plan_epoch(edges, 2, 2, seed=5, epoch=3, sort_window=3)  # windows of 12 graphs
    for start in range(0, 48, 12):
        window = plan.order[start : start + 12]
        assert set(window.tolist()) == set(as_read.order[start : start + 12].tolist())
        # cut into steps of 4 by size: each step holds 4 consecutive sizes of its window
        ranks = np.argsort(np.argsort(edges[window], kind="stable"), kind="stable")
        assert sorted(sorted(ranks[i : i + 4] // 4) for i in range(0, 12, 4)) == [
            [0] * 4,
            [1] * 4,
            [2] * 4,
        ]
    np.testing.assert_array_equal(plan.order[48:], as_read.order[48:])  # unused, last


def test_a_sort_window_makes_the_same_steps_for_any_number_of_workers():
    rng = np.random.default_rng(3)
    edges = rng.integers(100, 1000, 40)
    one = plan_epoch(edges, 1, 4, seed=1, epoch=0, sort_window=4)
    four = plan_epoch(edges, 4, 1, seed=1, epoch=0, sort_window=4)
    np.testing.assert_array_equal(one.order, four.order)
    np.testing.assert_array_equal(
        np.sort(one.graph_ids[0], axis=1), np.sort(four.graph_ids[:, :, 0].T, axis=1)
    )


def test_a_sort_window_orders_by_the_cost_given():
    # equal edges, costs 4, 1, 3, 2: the cheap pair and the dear pair share steps
    plan = plan_epoch(
        np.full(4, 10), 2, 1, seed=0, epoch=0, sort_window=2, cost=[4.0, 1.0, 3.0, 2.0]
    )
    assert sorted(sorted(plan.graph_ids[:, s, 0].tolist()) for s in range(2)) == [[0, 2], [1, 3]]


def test_a_sort_window_balances_the_steps_of_the_default_dataset():
    plans = [
        plan_epoch(DEFAULT_TRAIN_EDGES, 2, 1, seed=1, epoch=e, sort_window=8) for e in range(24)
    ]
    as_read = [plan_epoch(DEFAULT_TRAIN_EDGES, 2, 1, seed=1, epoch=e) for e in range(24)]
    assert np.mean([p.mean_imbalance for p in plans]) - 1 < 0.02
    assert np.mean([p.mean_imbalance for p in as_read]) - 1 > 0.03
    # still other steps every epoch: 20 steps, windows of 5 (a quarter of the epoch)
    assert len({tuple(np.sort(p.graph_ids[:, 0, 0]).tolist()) for p in plans}) > 12


def test_a_sort_window_spans_at_most_a_quarter_of_the_epoch():
    # 8 workers on 40 graphs: 5 steps, a window of 1 step: the steps as read
    plan = plan_epoch(DEFAULT_TRAIN_EDGES, 8, 1, seed=1, epoch=0, sort_window=8)
    np.testing.assert_array_equal(
        plan.order, plan_epoch(DEFAULT_TRAIN_EDGES, 8, 1, seed=1, epoch=0).order
    )
    # 16 steps: windows of 4 steps, not 8
    edges = np.arange(32)
    plan = plan_epoch(edges, 2, 1, seed=0, epoch=0, sort_window=8)
    as_read = plan_epoch(edges, 2, 1, seed=0, epoch=0)
    for start in range(0, 32, 8):
        assert set(plan.order[start : start + 8]) == set(as_read.order[start : start + 8])


def test_streamed_shards_keep_their_order_whatever_the_sort_window():
    layout = _one_shard(16)
    edges = np.arange(16)[::-1] * 10 + 1
    plan = plan_epoch(edges, 2, 1, seed=0, epoch=0, sort_window=8, **layout)
    np.testing.assert_array_equal(plan.order, np.arange(16))


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
        ({"sort_window": 0}, r"sort_window must be an integer >= 1, got 0"),
        ({"cost": np.ones(7)}, r"cost must have one entry per graph, got shape \(7,\)"),
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
