"""Scaling studies: timing records, scaling maths, cost and energy, predictions, reports, sweeps.

Modules (imports stay light here: the trainer imports ``energy`` on every rank). The timing
records they read are defined where training writes them, ``hvdtrack.train.timing``.

- ``config``: ``ScalingConfig``, the ``scaling:`` config section.
- ``energy``: ``EnergyMeter`` (RAPL, NVML or a labelled estimate).
- ``maths``: speedup, efficiencies, step statistics, cost and energy per epoch.
- ``predict``: ring-allreduce model, efficiency at N = 8..1024, validation on measured runs.
- ``report``: the report of one run (epochs, where their time went) or of a sweep (tables in
  Markdown, CSV and JSON, PNG plots); ``tables`` writes its Markdown, ``plots`` its PNGs.
- ``sweep``: the ``run`` command (horovodrun locally, or SLURM scripts).

Command line: ``python -m hvdtrack.scaling {run,report,summary,predict,energy} --help``.
"""
