"""Scaling studies: scaling maths, cost and energy, predictions, reports, sweeps.

Reads run directories (records defined in ``hvdtrack.runs.timing``); imports stay light here, as
the trainer imports ``energy`` on every rank. Command line: ``python -m hvdtrack.scaling --help``.
"""
