"""The run's checkpoints: the newest in RUN/checkpoints, the best by validation loss in RUN/best.

A resume starts from the newest *intact* checkpoint (``resume_point``): the folder is scanned
for ``ckpt-N`` files (N is the optimizer step), each candidate read in full (TensorFlow checks
every tensor's checksum), and a missing or damaged one, or one that run.json or the
``checkpoint`` file names but that is gone, is skipped and named. Before the chief's
``CheckpointManager`` starts, the ``checkpoint`` file is made to list only the checkpoints up to
the resume point that exist: the manager deletes the oldest it lists when it saves, so a stale
list could never make it delete a checkpoint the run did not supersede.

Public symbols: ``Checkpoints``, ``ResumePoint``, ``resume_point``, ``repair_state``,
``damage``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from pathlib import Path
from typing import Optional

import tensorflow as tf

from hvdtrack.train.trainer import Trainer
from hvdtrack.utils.io import atomic_write

STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's list of its checkpoints
_NUMBERED = re.compile(r"^ckpt-(\d+)(?:\.index|\.data-\d+-of-\d+)$")
_NAMED = re.compile(r'^model_checkpoint_path:\s*"(?:.*/)?ckpt-(\d+)"', re.M)


@dataclasses.dataclass
class ResumePoint:
    """Where a resume starts: ``path`` (a checkpoint prefix, None: nothing intact) and what
    newer checkpoints were skipped, each with why (missing, damaged)."""

    path: Optional[str]
    skipped: list[str]

    @property
    def name(self) -> Optional[str]:
        return Path(self.path).name if self.path else None


def number(name: Optional[str]) -> Optional[int]:
    """``ckpt-N`` (a path or name) -> N; None for anything else."""
    match = re.search(r"ckpt-(\d+)$", name or "")
    return int(match[1]) if match else None


def resume_point(directory: Path, recorded: Optional[str] = None) -> ResumePoint:
    """The newest intact checkpoint in ``directory``, newer ones skipped with why.

    Candidates: every ``ckpt-N`` with files there, the one the ``checkpoint`` file names and
    ``recorded`` (run.json's), newest first; the first that reads in full wins.
    """
    found = {int(m[1]) for p in _listing(directory) if (m := _NUMBERED.match(p))}
    named = _named(directory)
    expected = {n: "named by run.json" for n in [number(recorded)] if n is not None}
    if named is not None:
        expected.setdefault(named, f"named by {directory / STATE_FILE}")
    skipped = []
    for n in sorted(found | set(expected), reverse=True):
        prefix = directory / f"ckpt-{n}"
        if not prefix.with_name(f"ckpt-{n}.index").exists():
            skipped.append(f"{prefix} (missing, {expected.get(n, 'its index file is gone')})")
            continue
        reason = damage(str(prefix))
        if reason is None:
            return ResumePoint(str(prefix), skipped)
        skipped.append(f"{prefix} (damaged: {reason})")
    return ResumePoint(None, skipped)


def damage(prefix: str) -> Optional[str]:
    """Why the checkpoint ``prefix`` cannot be read (its first error line); None when every
    tensor reads back with its checksum."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    # TensorFlow's reader raises IndexError for a truncated data file, OpError (DataLoss) for a
    # bad checksum or index.
    except (tf.errors.OpError, ValueError, OSError, IndexError) as err:
        text = str(err).strip()
        return text.splitlines()[0][:300] if text else type(err).__name__
    return None


def _listing(directory: Path) -> list[str]:
    try:
        return [p.name for p in directory.iterdir()]
    except OSError:
        return []


def _named(directory: Path) -> Optional[int]:
    """The checkpoint number the ``checkpoint`` file names (None: no file, or unreadable)."""
    try:
        match = _NAMED.search((directory / STATE_FILE).read_text(errors="replace"))
    except OSError:
        return None
    return int(match[1]) if match else None


def repair_state(directory: Path, point: ResumePoint) -> None:
    """Makes the ``checkpoint`` file list the existing checkpoints up to ``point``, newest
    ``point``, when it is missing or names another (the manager deletes what it lists)."""
    newest = number(point.path)
    if newest is None or (not point.skipped and _named(directory) == newest):
        return  # nothing to resume from, or it lists what exists up to the resume point
    kept = {
        int(m[1]): (directory / p).stat().st_mtime
        for p in _listing(directory)
        if (m := _NUMBERED.match(p)) and p.endswith(".index") and int(m[1]) <= newest
    }
    # With their times (the files'), the manager keeps rotating them (a checkpoint without
    # one counts as preserved for good).
    lines = [f'model_checkpoint_path: "ckpt-{newest}"']
    lines += [f'all_model_checkpoint_paths: "ckpt-{n}"' for n in sorted(kept)]
    lines += [f"all_model_checkpoint_timestamps: {kept[n]}" for n in sorted(kept)]
    lines += [f"last_preserved_timestamp: {min(kept.values()) - 1}"]
    with atomic_write(directory / STATE_FILE) as f:
        f.write("\n".join(lines) + "\n")


class Checkpoints:
    """The run's checkpoints: the newest in RUN/checkpoints, the best by validation loss in RUN/best."""

    def __init__(self, trainer: Trainer, run_dir: Path):
        self.trainer = trainer
        self.directory = run_dir / "checkpoints"
        keep = trainer.config.train.keep_checkpoints
        self.latest = tf.train.CheckpointManager(
            trainer.state.checkpoint, str(self.directory), max_to_keep=keep
        )
        self.best = tf.train.CheckpointManager(
            trainer.state.checkpoint, str(run_dir / "best"), max_to_keep=1
        )
        self.saved_at = time.monotonic()

    def due(self) -> bool:
        """True when ``train.checkpoint_every_minutes`` have passed since the last save."""
        minutes = self.trainer.config.train.checkpoint_every_minutes
        return minutes is not None and time.monotonic() - self.saved_at >= 60 * minutes

    def save(self, epoch: int, step: int) -> None:
        """Saves the state to resume at (epoch, step); every rank returns after the chief wrote."""
        self.saved_at = time.monotonic()
        t = self.trainer
        t.state.epoch.assign(epoch)
        t.state.step_in_epoch.assign(step)
        if t.workers.is_chief:
            # Numbered by optimizer step: steps per epoch change in an elastic run.
            n = int(t.state.optimizer.step.numpy())
            try:
                self.latest.save(checkpoint_number=n)
            except BaseException:  # a full disk: TensorFlow leaves its staging folder
                shutil.rmtree(self.directory / f"ckpt-{n}_temp", ignore_errors=True)
                raise
        t.workers.barrier()

    def save_best(self, number: int) -> None:
        if self.trainer.workers.is_chief:
            self.best.save(checkpoint_number=number)
