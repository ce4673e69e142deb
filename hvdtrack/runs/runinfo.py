"""The run's description in ``run.json`` (``info``): built, checked and hashed, and the field
readers that every timing shares (``hvdtrack.runs.timing``).

Public symbols: ``make_run_info``, ``check_run_info``, ``hash_config``, ``flatten_config``, the
field readers ``read_int``, ``read_number``, ``read_seconds``, ``read_bool``, ``read_str``,
``read_metrics`` (each raises ValueError naming the field), ``plain`` (JSON types), and ``STATUSES``, ``STRATEGIES``,
``ENERGY_SOURCES``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import socket
from typing import Any, Iterable, Mapping, Optional

from hvdtrack.errors import DataError

STATUSES = ("running", "stopped", "finished", "failed")
ENERGY_SOURCES = ("rapl", "nvml", "estimate")
STRATEGIES = ("local", "horovod", "mirrored", "multiworker")


def make_run_info(
    *,
    config_name: str,
    config_hash: str,
    strategy: str,
    num_workers: int,
    batch_graphs: int,
    learning_rate: float,
    epochs: int,
    device_kind: str,
    config: Mapping[str, Any],
    global_batch_graphs: Optional[int] = None,
    status: str = "running",
    started: Optional[str] = None,
    finished: Optional[str] = None,
    host: Optional[str] = None,
    threads_per_worker: Optional[int] = None,
    num_params: Optional[int] = None,
    gradient_bytes: Optional[int] = None,
    graphs_processed: int = 0,
    edges_processed: int = 0,
    metrics: Optional[Mapping[str, float]] = None,
    energy: Optional[Mapping[str, Any]] = None,
    **extra: Any,
) -> dict[str, Any]:
    """Builds the ``info`` dict of ``run.json``, filling defaults and checking every field.

    Args:
      config_name: the config's name (e.g. the YAML file's stem).
      config_hash: ``hash_config`` of the resolved config (or any stable digest).
      strategy: "local", "horovod", "mirrored" or "multiworker".
      num_workers: workers (replicas) of the run.
      batch_graphs: graphs per worker per step.
      learning_rate: the effective learning rate after any scaling with the worker count.
      epochs: epochs configured.
      device_kind: e.g. "cpu-core" or "gpu".
      config: the resolved config as nested dicts.
      global_batch_graphs: graphs per step over all workers; default
        ``batch_graphs * num_workers``.
      status: "running", "finished" or "failed".
      started, finished: ISO 8601 times; ``started`` defaults to now (UTC).
      host: default ``socket.gethostname()``.
      threads_per_worker, num_params: as measured; optional.
      gradient_bytes: bytes allreduced per step (sum over trainable variables); needed for
        predictions.
      graphs_processed, edges_processed: totals over all workers and epochs so far.
      metrics: final validation metrics: loss, auc, efficiency, purity, accuracy.
      energy: ``EnergyReading.to_info()`` with ``joules`` replaced by the sum over all
        processes: joules (the run's total), seconds (metered wall time), source
        ("rapl"/"nvml"/"estimate"), watts. Reports use joules / seconds as the run's mean power
        (``watts`` when ``seconds`` is absent).
      **extra: kept as they are.

    Returns:
      The info dict.

    Raises:
      DataError: a field has the wrong type or an impossible value (the message names it).
    """
    info: dict[str, Any] = {
        "config_name": config_name,
        "config_hash": config_hash,
        "strategy": strategy,
        "num_workers": num_workers,
        "batch_graphs": batch_graphs,
        "global_batch_graphs": (
            batch_graphs * num_workers if global_batch_graphs is None else global_batch_graphs
        ),
        "learning_rate": learning_rate,
        "epochs": epochs,
        "status": status,
        "started": started or _now(),
        "finished": finished,
        "host": host or socket.gethostname(),
        "device_kind": device_kind,
        "threads_per_worker": threads_per_worker,
        "num_params": num_params,
        "gradient_bytes": gradient_bytes,
        "graphs_processed": graphs_processed,
        "edges_processed": edges_processed,
        "metrics": dict(metrics) if metrics is not None else None,
        "energy": dict(energy) if energy is not None else None,
        "config": plain(config),
    }
    info.update(extra)
    check_run_info(info, "run info")
    return info


def hash_config(config: Mapping[str, Any], exclude: Iterable[str] = ("train.run_dir",)) -> str:
    """A short stable digest of a nested config mapping, leaving out dotted keys in ``exclude``.

    Args:
      config: the resolved config as nested dicts.
      exclude: dotted keys (``"train.run_dir"``) or whole sections (``"scaling"``) to leave out.

    Returns:
      16 hex digits of the SHA-256 of the canonical JSON.
    """
    flat = {k: v for k, v in flatten_config(config).items() if not _excluded(k, exclude)}
    text = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"section.key": value}`` (lists and scalars are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def check_run_info(info: Mapping[str, Any], where: str) -> None:
    try:
        for key in ("config_name", "config_hash", "strategy", "status"):
            read_str(info, key)
        for key in ("num_workers", "batch_graphs", "global_batch_graphs"):
            if read_int(info, key) < 1:
                raise ValueError(f"'{key}' must be >= 1, got {info[key]}")
        if info["status"] not in STATUSES:
            raise ValueError(
                f"'status' must be one of {', '.join(STATUSES)}, got {info['status']!r}"
            )
        if info["strategy"] not in STRATEGIES:
            raise ValueError(
                f"'strategy' must be one of {', '.join(STRATEGIES)}, got {info['strategy']!r}"
            )
        if "learning_rate" in info:
            read_number(info, "learning_rate")
        for key in ("epochs", "graphs_processed", "edges_processed"):
            if key in info:
                read_int(info, key)
        for key in ("threads_per_worker", "num_params", "gradient_bytes"):
            if key in info:
                read_int(info, key, optional=True)
        for key in ("started", "finished", "host", "device_kind"):
            if key in info and info[key] is not None:
                read_str(info, key)
        if "metrics" in info:
            read_metrics(info, "metrics", optional=True)
        if info.get("energy") is not None:
            energy = info["energy"]
            if not isinstance(energy, Mapping):
                raise ValueError(f"'energy' must be an object, got {type(energy).__name__}")
            read_seconds(energy, "joules", name="energy.joules")
            read_seconds(energy, "watts", name="energy.watts")
            if energy.get("source") not in ENERGY_SOURCES:
                raise ValueError(
                    f"'energy.source' must be one of {', '.join(ENERGY_SOURCES)}, "
                    f"got {energy.get('source')!r}"
                )
        if info.get("config") is not None and not isinstance(info["config"], Mapping):
            raise ValueError(f"'config' must be an object, got {type(info['config']).__name__}")
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def _get(data: Mapping[str, Any], key: str, name: str) -> Any:
    if key not in data:
        raise ValueError(f"missing '{name}'")
    return data[key]


def read_int(data: Mapping[str, Any], key: str, optional: bool = False) -> Any:
    value = _get(data, key, key)
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{key}' must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"'{key}' must be >= 0, got {value}")
    return value


def read_number(data: Mapping[str, Any], key: str, name: str = "") -> float:
    value = _get(data, key, name or key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{name or key}' must be a number, got {value!r}")
    return float(value)


def read_seconds(data: Mapping[str, Any], key: str, optional: bool = False, name: str = "") -> Any:
    if optional and data.get(key, 0) is None:
        return None
    value = read_number(data, key, name)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"'{name or key}' must be a finite number >= 0, got {value!r}")
    return value


def read_bool(data: Mapping[str, Any], key: str) -> bool:
    value = _get(data, key, key)
    if not isinstance(value, bool):
        raise ValueError(f"'{key}' must be true or false, got {value!r}")
    return value


def read_str(data: Mapping[str, Any], key: str) -> str:
    value = _get(data, key, key)
    if not isinstance(value, str):
        raise ValueError(f"'{key}' must be a string, got {value!r}")
    return value


def read_metrics(data: Mapping[str, Any], key: str, optional: bool = False) -> Any:
    value = _get(data, key, key)
    if optional and value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"'{key}' must be an object of numbers, got {value!r}")
    # null: a metric with no value (purity with no edge kept), which strict JSON cannot hold as NaN
    return {
        str(k): math.nan if value[k] is None else read_number(value, k, f"{key}.{k}") for k in value
    }


def _excluded(key: str, exclude: Iterable[str]) -> bool:
    return any(key == e or key.startswith(f"{e}.") for e in exclude)


def plain(value: Any) -> Any:
    # Tuples from frozen config dataclasses become lists, as JSON would make them anyway.
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
