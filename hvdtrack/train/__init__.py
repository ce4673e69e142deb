"""Training: the trainer (``trainer``), the one loop (``loop``), its timing records (``timing``),
the distribution seam (``distribute``), optimizer, metrics, console output."""
