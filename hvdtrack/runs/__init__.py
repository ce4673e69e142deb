"""The run directory: timings and run info (``timing``, ``runinfo``), resume checks and
provenance (``rundir``), TensorBoard and console summaries (``summaries``), the energy meter
(``energy``). Written by training, read by scaling reports. Nothing is imported here."""
