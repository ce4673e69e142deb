"""Benchmarks: ``python -m hvdtrack.bench.<name>`` prints measured figures for one stage."""
