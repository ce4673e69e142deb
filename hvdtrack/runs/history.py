"""A run's timings as training goes: this rank's new ones, every rank's gathered, the totals.

Every rank keeps the step and epoch timings it measured since the last gather (``new_steps``,
``new_epochs``); ``gather`` joins every rank's, in rank order, onto the run's (``steps``,
``epochs``), which the chief writes to ``run.json`` and ``timing.jsonl``
(``timing.write_run``). Every rank runs the same steps, so every rank reaches the gather's
collectives. A resume keeps only what its checkpoint holds (``resume_from``).

Public symbols: ``TimingHistory``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

import numpy as np

from hvdtrack.runs.timing import EpochTiming, Run, StepTiming

# A collective that gathers one array from every rank, concatenated in rank order, on every
# rank (``hvdtrack.distributed.workers.Workers.allgather_host``).
Allgather = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class TimingHistory:
    """The run's timings (every rank's, gathered) and this rank's not yet gathered ones.

    ``graphs_done`` / ``edges_done`` count graphs and edges over all workers so far;
    ``epoch_start`` is the index in ``steps`` of the current epoch's first gathered step.
    """

    steps: list[StepTiming] = dataclasses.field(default_factory=list)
    epochs: list[EpochTiming] = dataclasses.field(default_factory=list)
    new_steps: list[StepTiming] = dataclasses.field(default_factory=list)
    new_epochs: list[EpochTiming] = dataclasses.field(default_factory=list)
    graphs_done: int = 0
    edges_done: int = 0
    epoch_start: int = 0

    def add_step(self, timing: StepTiming, graphs: int, edges: int) -> None:
        """This rank's timing of one step that processed ``graphs`` / ``edges`` (all workers)."""
        self.new_steps.append(timing)
        self.graphs_done += graphs
        self.edges_done += edges

    def start_epoch(self) -> None:
        """Marks where the epoch's steps start, once gathered."""
        self.epoch_start = len(self.steps)

    def gather(self, allgather: Allgather) -> list[EpochTiming]:
        """Joins every rank's new timings onto the run's; returns the epoch timings joined."""
        steps = gather_timings(self.new_steps, StepTiming, allgather)
        epochs = gather_timings(self.new_epochs, EpochTiming, allgather)
        self.steps += steps
        self.epochs += epochs
        self.new_steps, self.new_epochs = [], []
        return epochs

    def drop_new(self) -> None:
        """Forgets this rank's ungathered timings (an interrupted epoch that runs again)."""
        self.new_steps, self.new_epochs = [], []

    def all_steps(self) -> list[StepTiming]:
        """Gathered and this rank's new step timings (what a failing chief still writes)."""
        return self.steps + self.new_steps

    def all_epochs(self) -> list[EpochTiming]:
        return self.epochs + self.new_epochs

    def epoch_run(self, run_dir, info: dict, epoch: int, epochs: Sequence[EpochTiming]) -> Run:
        """A ``Run`` of ``epoch``'s gathered steps and of its timings among ``epochs``."""
        steps = [r for r in self.steps[self.epoch_start :] if r.epoch == epoch]
        return Run(run_dir, info, steps, [r for r in epochs if r.epoch == epoch])

    def resume_from(self, previous: Run, at: tuple[int, int]) -> None:
        """Keeps the timings of ``previous`` before position ``at`` (epoch, step): steps that
        ran after the checkpoint (before a crash) run again."""
        self.steps = [r for r in previous.steps if (r.epoch, r.step) < at]
        self.epochs = [r for r in previous.epochs if r.epoch < at[0]]
        self.graphs_done = sum(r.graphs for r in self.steps)
        self.edges_done = sum(r.edges for r in self.steps)


def gather_timings(timings: list, cls: type, allgather: Allgather) -> list:
    """``timings`` (dataclasses) of every rank, concatenated in rank order, on every rank."""
    payload = np.frombuffer(json.dumps([dataclasses.asdict(r) for r in timings]).encode(), np.uint8)
    sizes = allgather(np.array([payload.size], np.int64))
    joined = allgather(payload).tobytes()
    out, start = [], 0
    for size in sizes:
        out += [cls(**d) for d in json.loads(joined[start : start + int(size)])]
        start += int(size)
    return out
