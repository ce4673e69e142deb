"""Training: the one loop (``loop``), the distribution seam (``distribute``), optimizer, metrics."""
