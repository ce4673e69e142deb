"""User-facing errors: what was wrong, where, and what to do; the CLI prints them without a traceback."""

from __future__ import annotations


class HvdtrackError(Exception):
    """An error the user can fix. Entry points print ``str(err)`` and exit with ``exit_code``."""

    exit_code = 2


class ConfigError(HvdtrackError):
    """A configuration key is unknown, mistyped or out of range. The message names the key."""


class DataError(HvdtrackError):
    """An input file or record is unreadable or invalid. The message names the file and row/record."""


class TrainingError(HvdtrackError):
    """Training cannot go on (e.g. a non-finite loss). The message names the step."""

    exit_code = 3
