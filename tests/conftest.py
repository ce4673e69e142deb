"""Test-wide settings: quiet TensorFlow and keep the suite on one thread per process."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
