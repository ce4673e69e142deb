"""The run configuration: one YAML file, validated into typed sections, with command-line overrides.

A file looks like::

    name: tiny
    data: {source: synthetic, dataset_dir: data/tiny, num_events: 8, synthetic: {...}, graph: {...}}
    model: {num_message_passing_steps: 2, ...}
    train: {epochs: 2, batch_graphs: 2, ...}
    distributed: {strategy: horovod}
    scaling: {price_per_device_hour: 0.05}

Each section's dataclass lives beside the code it configures; this module composes them.
The package ships named configurations (``hvdtrack/configs/NAME.yaml``; a checkout's ``configs/``
links to them): every ``--config`` accepts a path or such a name (``resolve_config_path``).
Public symbols: ``Config``, ``DataConfig``, ``load_config``, ``config_to_dict``, ``dump_config``,
``resolve_config_path``, ``packaged_configs``, ``DEFAULT_CONFIG_NAME``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from pathlib import Path
from typing import Literal, Optional

import yaml

from hvdtrack.configtools import apply_overrides, check, from_mapping, load_yaml, to_mapping
from hvdtrack.distributed.config import DistributedConfig
from hvdtrack.errors import ConfigError
from hvdtrack.events.synthetic import SyntheticConfig
from hvdtrack.graphs.construction import GraphConfig
from hvdtrack.model.config import ModelConfig
from hvdtrack.records.shards import RecordsConfig
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.train.config import TrainConfig
from hvdtrack.utils.io import atomic_write

# Upper bounds of the data section, far above real use (see DataConfig).
MAX_EVENTS = 1_000_000
MAX_WORKERS = 1024


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where events come from and how they become TFRecord graphs (``hvdtrack prepare``).

    ``num_events`` synthetic events are generated (seeded by ``seed``), or the first
    ``num_events`` TrackML events of ``trackml_dir`` are read (null: all of them). Events are then
    split by event (``records.split_counts`` or ``records.split_fractions``), never by section,
    so no event feeds two splits.

    ``workers``: event-processing processes (null: the CPUs in this process's affinity mask).
    ``prepare_timeout_s``: when ``hvdtrack train`` finds no (up-to-date) dataset, rank 0 prepares
    it and the other ranks wait at most this long for it before giving up; preparation itself
    gives up when no event finishes within it (a stuck worker). Neither it nor ``workers``
    changes the dataset (``hvdtrack.prepare.jobs.up_to_date`` ignores them).

    ``dataset_dir`` may not be empty. Upper bounds, far above real use (TrackML's whole
    training set is 8,850 events): ``num_events`` ``MAX_EVENTS`` (1,000,000), ``workers``
    ``MAX_WORKERS`` (1024).
    """

    source: Literal["synthetic", "trackml"] = "synthetic"
    trackml_dir: Optional[str] = None
    dataset_dir: str = "data/default"
    num_events: Optional[int] = 20
    seed: int = 7
    workers: Optional[int] = None
    keep_csv: bool = True
    prepare_timeout_s: float = 1800.0
    synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    graph: GraphConfig = dataclasses.field(default_factory=GraphConfig)
    records: RecordsConfig = dataclasses.field(default_factory=RecordsConfig)

    def __post_init__(self):
        check(
            bool(self.dataset_dir.strip()),
            "dataset_dir",
            "must not be empty (the directory of the prepared dataset, e.g. data/NAME)",
        )
        check(
            self.source != "trackml" or bool(self.trackml_dir),
            "trackml_dir",
            "is required when data.source is trackml (a directory of event000...-hits.csv files)",
        )
        check(
            self.num_events is None or 1 <= self.num_events <= MAX_EVENTS,
            "num_events",
            f"must be in [1, {MAX_EVENTS}] (or null: every TrackML event in trackml_dir)",
        )
        check(
            self.num_events is not None or self.source == "trackml",
            "num_events",
            "may only be null with data.source trackml",
        )
        check(
            self.workers is None or 1 <= self.workers <= MAX_WORKERS,
            "workers",
            f"must be in [1, {MAX_WORKERS}] or null",
        )
        check(self.prepare_timeout_s > 0, "prepare_timeout_s", "must be > 0 (seconds)")


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run: data preparation, model, training, distribution and scaling settings.

    Across sections it checks ``distributed.pipeline`` against ``model`` and
    ``distributed.strategy`` (``hvdtrack.distributed.stages.PipelineConfig`` says what is refused).
    """

    name: str = "default"
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    scaling: ScalingConfig = dataclasses.field(default_factory=ScalingConfig)

    def __post_init__(self):
        _check_stages(self)


def _check_stages(config: Config) -> None:
    """``distributed.stages`` against the sections it depends on (see ``StagesConfig``)."""
    stages = config.distributed.stages.num_stages
    steps = config.model.num_message_passing_steps
    require(
        stages <= steps,
        f"'distributed.stages.num_stages' ({stages}) must be at most "
        f"model.num_message_passing_steps ({steps}): a stage runs at least one message-passing step",
    )
    if stages == 1:
        return
    strategy = config.distributed.strategy
    require(
        strategy in ("local", "horovod"),
        f"'distributed.stages.num_stages' {stages} needs distributed.strategy local or horovod "
        f"(one set of stages per process), not {strategy}: tf.distribute places each replica on a "
        "device of its own, the stages need theirs. Set distributed.stages.num_stages=1 or "
        "distributed.strategy=horovod",
    )
    for key, plain in (("precision", "float32"), ("recompute", False)):
        value = getattr(config.model, key)
        require(
            value == plain,
            f"'distributed.stages.num_stages' {stages} needs model.{key}={str(plain).lower()} "
            f"(the stages run the plain float32 forward), not {value!r}. Set "
            f"distributed.stages.num_stages=1 or model.{key}={str(plain).lower()}",
        )


DEFAULT_CONFIG_NAME = "default"
# Package data (setup.cfg [options.package_data]); a file beside this module in an editable
# install and in an installed wheel alike.
PACKAGED_CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def packaged_configs() -> dict[str, Path]:
    """The configurations shipped in the package: ``{name: path}``, sorted by name."""
    return {p.stem: p for p in sorted(PACKAGED_CONFIG_DIR.glob("*.yaml"))}


def resolve_config_path(config: str | os.PathLike | None = None) -> Path:
    """What a ``--config`` argument names: a YAML file, or a configuration shipped in the package.

    ``None`` is the packaged default. An existing path is itself. A bare name (no directory
    part, no ``.yaml``/``.yml`` suffix) that is not a path here is the packaged file of that
    name (``tiny`` -> ``.../hvdtrack/configs/tiny.yaml``). Anything else is returned unchanged,
    so ``load_config`` reports the file it cannot read.

    Raises:
      ConfigError: a bare name that is neither a path nor a packaged configuration (the message
        lists the packaged names).
    """
    packaged = packaged_configs()
    if config is None:
        if DEFAULT_CONFIG_NAME not in packaged:
            raise ConfigError(
                f"the packaged default configuration is missing ({PACKAGED_CONFIG_DIR / DEFAULT_CONFIG_NAME}.yaml): "
                "reinstall hvdtrack or give --config"
            )
        return packaged[DEFAULT_CONFIG_NAME]
    path = Path(config)
    text = os.fspath(config)
    is_name = (
        bool(text)
        and path.name == text
        and not (os.altsep and os.altsep in text)
        and path.suffix.lower() not in (".yaml", ".yml")
        and text not in (".", "..")
    )
    if path.exists() or not is_name:
        return path
    if text in packaged:
        return packaged[text]
    near = difflib.get_close_matches(text, list(packaged), n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    raise ConfigError(
        f"--config {text}: no such file, and no packaged configuration of that name{hint}; "
        f"packaged configurations: {', '.join(packaged) or '(none)'}; or give the path of a YAML file"
    )


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> Config:
    """Reads a YAML config, applies ``section.key=value`` overrides, validates everything.

    Raises:
      ConfigError: naming the file and key for an unreadable file, unknown or mistyped key,
        or a value out of range.
    """
    path = Path(path)
    data = load_yaml(_read_text(path), str(path))
    if data is None or data == {}:
        raise ConfigError(
            f"{path}: the config file is empty (no sections); give the settings, or "
            f"--config {DEFAULT_CONFIG_NAME} for the packaged default"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    data = rename_legacy_keys(apply_overrides(data, overrides or []), str(path))
    data.setdefault("name", path.stem)
    source = str(path) if not overrides else f"{path} (with overrides {' '.join(overrides)})"
    return from_mapping(Config, data, source=source)


# Configs are a few kB; anything much larger (or endless, as /dev/zero) is not one.
MAX_CONFIG_BYTES = 1 << 20


def _read_text(path: Path) -> str:
    """The text of config file ``path``: UTF-8, at most ``MAX_CONFIG_BYTES``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a config file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not a text (UTF-8) file: byte 0x{raw[err.start]:02x} at offset {err.start}"
        ) from None


def rename_legacy_keys(data: dict, where: str) -> dict:
    """A config mapping with keys that were renamed given their new names (a warning each).

    ``distributed.pipeline: {stages, micro_batches}`` is now ``distributed.stages:
    {num_stages, micro_batches}``: "pipeline" names the tf.data input pipeline alone. Used on
    config files and on the configs that older run directories recorded (resume checks).

    Raises:
      ConfigError: both the old and the new key are given.
    """
    distributed = data.get("distributed")
    if not isinstance(distributed, dict) or "pipeline" not in distributed:
        return data
    if "stages" in distributed:
        raise ConfigError(
            f"{where}: 'distributed.pipeline' is the old name of 'distributed.stages'; "
            "give only 'distributed.stages'"
        )
    old = distributed["pipeline"]
    new = dict(old) if isinstance(old, dict) else old
    if isinstance(new, dict) and "stages" in new:
        new["num_stages"] = new.pop("stages")
    warnings.warn(
        f"{where}: 'distributed.pipeline' (stages, micro_batches) is deprecated; it is read as "
        "'distributed.stages' (num_stages, micro_batches)",
        FutureWarning,  # shown to users by default, unlike DeprecationWarning
        stacklevel=2,
    )
    renamed = {k: v for k, v in distributed.items() if k != "pipeline"} | {"stages": new}
    return {**data, "distributed": renamed}


def config_to_dict(config: Config) -> dict:
    """The config as plain nested dicts (what ``dump_config`` writes)."""
    return to_mapping(config)


def dump_config(config: Config, path: str | os.PathLike) -> None:
    """Writes the resolved config as YAML, atomically; ``load_config`` reads it back equal."""
    with atomic_write(path) as f:
        yaml.safe_dump(config_to_dict(config), f, sort_keys=False)


def require(condition: bool, message: str) -> None:
    """Raises ``ConfigError(message)`` unless ``condition`` (for cross-section checks)."""
    if not condition:
        raise ConfigError(message)
