"""What a sweep's report holds (``ScalingReport``): computed by ``scaling.report``, shown by
``scaling.render``; both import it from here, so the report imports the renderer, never back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pandas as pd

from hvdtrack.scaling import maths
from hvdtrack.scaling.config import ScalingConfig


@dataclasses.dataclass(frozen=True)
class ScalingReport:
    """Everything ``report.write_report`` writes. ``table``: one row per run by (training mode,
    N), the columns of ``report``'s rows; ``prediction``: the ring model's inputs and efficiency
    per network (None without inputs); ``validation``: the model against each measured
    multi-worker run."""

    mode: str
    config_name: str
    table: pd.DataFrame
    scaling: ScalingConfig
    notes: list[str]
    prediction: Optional[dict[str, Any]]
    validation: list[maths.Validation]
