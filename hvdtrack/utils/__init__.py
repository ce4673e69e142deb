"""Small helpers shared by every stage (atomic file output: ``hvdtrack.utils.io``)."""
