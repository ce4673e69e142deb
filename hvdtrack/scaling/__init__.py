"""Scaling studies: timing records, scaling maths, cost and energy, predictions, reports, sweeps.

Modules (imports stay light here: the trainer imports ``timing`` and ``energy`` on every rank):

- ``config``: ``ScalingConfig``, the ``scaling:`` config section.
- ``timing``: ``StepRecord``, ``EpochRecord``, ``make_run_info``, ``write_run``, ``read_run``.
- ``energy``: ``EnergyMeter`` (RAPL, NVML or a labelled estimate).
- ``maths``: speedup, efficiencies, step statistics, cost and energy per epoch.
- ``predict``: ring-allreduce model, efficiency at N = 8..1024, validation on measured runs.
- ``report``: Markdown/CSV/JSON tables and PNG plots from run directories.
- ``sweep``: the ``run`` command (horovodrun locally, or SLURM scripts).

Command line: ``python -m hvdtrack.scaling {run,report,predict,energy} --help``.
"""
