"""``Trainer.resize``: what follows from the worker count when it changes during a run (elastic
training), with the schedule continued at the same point of the run's epochs."""

import numpy as np

from hvdtrack.train.trainer import Trainer


def test_a_new_worker_count_keeps_the_schedule_where_the_run_is_in_its_epochs(tiny_config):
    config = tiny_config("train.epochs=6", "train.batch_graphs=1", "train.warmup_epochs=1")
    one = Trainer(config)
    assert (one.size.steps_per_epoch, one.size.global_batch) == (8, 1)  # 8 training graphs
    assert not one.resize()  # nothing changed: nothing rebuilt

    # Two epochs and one step on 1 worker, then the run goes on with 2 workers at the next epoch.
    one.state.optimizer.step.assign(2 * 8 + 1)
    one.state.epoch.assign(3)
    one.state.step_in_epoch.assign(0)
    one.step.compile()  # traced on 1 worker, as in a run that has taken steps
    one.workers.num_processes = 2
    assert one.resize()
    assert (one.size.steps_per_epoch, one.size.global_batch) == (4, 2)
    assert one.data.plan(3).num_steps == 4
    np.testing.assert_allclose(one.learning_rate, 0.01 * np.sqrt(2))
    # Epoch 3 of 6 on 2 workers is schedule step 3 * 4 = 12, whatever the optimizer counted.
    schedule = one.state.optimizer.schedule
    assert schedule.offset == 12 - 17
    # epoch_schedule for 2 workers, 4 steps per epoch: peak 0.01 * sqrt(2), warm-up 1 epoch
    # (4 steps) from peak / 2, cosine decay over the other 20 steps to 1% of the peak.
    assert (schedule.warmup_steps, schedule.total_steps, schedule.warmup_start_divisor) == (
        4,
        24,
        2,
    )
    assert (schedule.decay, schedule.min_fraction) == ("cosine", 0.01)
    # Schedule step 12 is 8/20 into the decay: peak * (0.01 + 0.99 * (1 + cos(0.4 pi)) / 2)
    # = 0.0093050078 (one worker at its own step 17 would be at 0.0088140095).
    np.testing.assert_allclose(float(one.state.optimizer.learning_rate()), 0.0093050078, rtol=1e-6)

    # The recompiled step applies the new schedule (a step traced before the resize would hold
    # the old peak and offset): it reports and uses step 12's rate, then counts on to step 13,
    # peak * (0.01 + 0.99 * (1 + cos(0.45 pi)) / 2) = 0.0082368756.
    taken = one.step.run(one.data.batches(3, 0, one.size.steps_per_epoch))
    np.testing.assert_allclose(taken.learning_rate, 0.0093050078, rtol=1e-6)
    assert int(one.state.optimizer.step.numpy()) == 18
    np.testing.assert_allclose(float(one.state.optimizer.learning_rate()), 0.0082368756, rtol=1e-6)


def test_a_run_started_on_two_workers_has_no_offset(tiny_config):
    two = Trainer(tiny_config("train.epochs=6", "train.batch_graphs=1", "train.warmup_epochs=1"))
    two.workers.num_processes = 2
    assert two.resize()
    assert two.state.optimizer.schedule.offset == 0
    two.state.optimizer.step.assign(12)
    np.testing.assert_allclose(float(two.state.optimizer.learning_rate()), 0.0093050078, rtol=1e-6)
