"""Data preparation, ``python -m hvdtrack.prepare [--config FILE|NAME]``: events -> hit graphs -> TFRecord shards + manifest.

Events come from the synthetic detector (written as TrackML CSV files first, so the reader path is
the one exercised) or from a TrackML directory. Events are processed in parallel; one writer in
this process shards the graphs. The dataset is built in a temporary sibling directory and moved
into place only when complete, so a failure never leaves a half-written dataset or loses the old one.
A worker process that dies (the out-of-memory killer, ``kill -9``) or an event that outlasts
``data.prepare_timeout_s`` is such a failure: an error naming the unfinished events, never a hang.
``hvdtrack train`` calls ``prepare_dataset`` itself when its dataset is missing or out of date.

Under ``mpirun -np N python -m hvdtrack.prepare ...`` (or ``srun --mpi=...``) the ranks share the
events, each with its own worker pool, and write the same dataset byte for byte as one process
(``hvdtrack.prepare.mpi``); a rank that fails or stops ends every rank with an error naming it.

Modules, each importing only those below it:

- ``__main__``: the command (``parser``, ``main``).
- ``local``: ``prepare_dataset``, in one process; ``mpi``: ``prepare_dataset_mpi``, over MPI ranks.
- ``report``: the construction report (report.md, report.json, prepare.json).
- ``jobs``: the shared steps - event jobs, the worker pool with its deadlines, the checks that a
  directory may be replaced and that a dataset is up to date (``up_to_date``, ``stale_reason``).
"""
