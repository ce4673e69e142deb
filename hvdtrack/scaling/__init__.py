"""Scaling studies: scaling maths, cost and energy, predictions, reports, sweeps.

Reads run directories through ``hvdtrack.runs`` (the timings of ``hvdtrack.runs.timing``), never
the trainer. Command line: ``python -m hvdtrack.scaling --help``.
"""
