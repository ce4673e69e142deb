"""Hostile config files and sizes: refused in one line naming the file, key and line, fast and
before anything is built (empty files, duplicate keys, alias bombs, binary and self-referencing
YAML, empty directories, sizes beyond their bounds, a model larger than the machine)."""

import os
import subprocess
import sys

import pytest

from hvdtrack.config import load_config
from hvdtrack.configtools import load_yaml
from hvdtrack.distributed.launch import check_memory
from hvdtrack.errors import ConfigError
from tests.launch import REPO, worker_env

TINY = REPO / "configs/tiny.yaml"
# 306 bytes standing for 9**9 (387 million) values: it took minutes and 10 GB before.
BOMB = "".join(
    f"{name}: &{name} [{','.join([f'*{prev}' if prev else 'x'] * 9)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi")
)


def refused(tmp_path, text: str | bytes) -> str:
    path = tmp_path / "run.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message[len(f"{path}: ") :]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "~\n", "{}\n"])
def test_an_empty_config_file_is_an_error(tmp_path, text):
    assert refused(tmp_path, text) == (
        "the config file is empty (no sections); give the settings, or --config default for "
        "the packaged default"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: a\nname: b\n", "duplicate key 'name' on line 2 (first on line 1)"),
        (
            "model:\n  node_encoder: [16, 16]\n  layer_norm: true\n  node_encoder: [8]\n",
            "duplicate key 'model.node_encoder' on line 4 (first on line 2)",
        ),
        (
            "data:\n  graph: {pt_min: 1.0, pt_min: 2.0}\n",
            "duplicate key 'data.graph.pt_min' on line 2 (first on line 2)",
        ),
    ],
)
def test_a_duplicate_key_is_named_with_its_lines(tmp_path, text, message):
    assert refused(tmp_path, text) == message


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    assert len(BOMB) < 310
    assert refused(tmp_path, BOMB) == (
        "'f' (line 6) expands to more than 100000 values through aliases: not a config"
    )


def test_aliases_within_the_limit_still_work():
    assert load_yaml("a: &a [1, 2]\nb: *a\n") == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("model: &m\n  x: *m\n", "'model.x' (line 1) refers to itself through an alias"),
        ("a: &a [1, *a]\n", "'a[1]' (line 1) refers to itself through an alias"),
    ],
)
def test_a_self_referencing_config_is_refused(tmp_path, text, message):
    assert refused(tmp_path, text).startswith(message)


@pytest.mark.parametrize(
    "data, message",
    [
        (bytes(range(256)), "not a text (UTF-8) file: byte 0x80 at offset 128"),
        (b"name: a\x00\n", "not valid YAML: unacceptable character #x0000: special characters"),
        (b"model: [1, 2\n", "not valid YAML: while parsing a flow sequence: expected ',' or ']'"),
        (b"a: " + b"[" * 5000 + b"]" * 5000, "nested too deeply to be a config"),
        (b"#" * (1 << 20) + b"\n", "larger than 1048576 bytes: not a config file"),
    ],
    ids=["binary", "nul", "unclosed", "deep", "huge"],
)
def test_binary_and_broken_files_get_one_line(tmp_path, data, message):
    assert refused(tmp_path, data).startswith(message)


def test_a_broken_override_value_names_the_override():
    with pytest.raises(ConfigError, match=r"^override 'train\.thresholds=\[0\.5 ': not valid YAML"):
        load_config(TINY, ["train.thresholds=[0.5 "])


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.run_dir=", "'train.run_dir' must not be empty"),
        ("train.run_dir=' '", "'train.run_dir' must not be empty"),
        ("data.dataset_dir=", "'data.dataset_dir' must not be empty"),
        (
            "model.node_encoder=[100000000,16]",
            "'model.node_encoder' must list at most 64 sizes of at most 16384 each, "
            "got [100000000, 16]",
        ),
        (
            f"model.output_head=[{','.join(['8'] * 65)}]",
            "'model.output_head' must list at most 64 sizes of at most 16384 each, "
            "got 65 sizes up to 8",
        ),
        (
            "model.num_message_passing_steps=100000",
            "'model.num_message_passing_steps' must be at most 128, got 100000",
        ),
        ("data.num_events=1000000000", "'data.num_events' must be in [1, 1000000]"),
        ("data.workers=100000", "'data.workers' must be in [1, 1024] or null"),
        ("data.records.graphs_per_shard=1000000", "'data.records.graphs_per_shard' must be in"),
        ("data.records.split_counts=[1,1,2000000]", "'data.records.split_counts' must be in"),
        ("data.synthetic.num_particles=10000000", "'data.synthetic.num_particles' must be in"),
        ("data.synthetic.num_vertices=1000000", "'data.synthetic.num_vertices' must be in"),
        ("train.batch_graphs=1000000", "'train.batch_graphs' must be in [1, 65536]"),
        ("train.epochs=1000000000", "'train.epochs' must be in [1, 1000000]"),
        ("train.keep_checkpoints=100000", "'train.keep_checkpoints' must be in [1, 1000]"),
        ("train.sort_window=0", "'train.sort_window' must be in [1, 1000000]"),
        (
            f"train.thresholds=[{','.join(['0.5'] * 65)}]",
            "'train.thresholds' needs 1 to 64 thresholds, got 65",
        ),
        ("distributed.num_cpu_devices=1000000", "'distributed.num_cpu_devices' must be in"),
        ("distributed.threads_per_worker=100000", "'distributed.threads_per_worker' must be in"),
        ("distributed.stages.micro_batches=100000", "'distributed.stages.micro_batches' must"),
    ],
)
def test_sizes_beyond_their_bounds_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override])
    assert message in str(err.value)


def test_sizes_at_their_bounds_load():
    config = load_config(
        TINY,
        [
            "model.num_message_passing_steps=128",
            "model.node_encoder=[16384,16]",
            "data.num_events=1000000",
            "train.batch_graphs=65536",
        ],
    )
    assert config.model.num_message_passing_steps == 128


def test_a_model_larger_than_the_memory_is_refused():
    config = load_config(TINY, ["model.edge_update=[4096,4096,16]"])  # 17,246,465 parameters
    check_memory(config, memory_bytes=16 * 17_246_465)
    with pytest.raises(ConfigError) as err:
        check_memory(config, memory_bytes=16 * 17_246_465 - 1)
    assert str(err.value) == (
        "'model.edge_update' [4096, 4096, 16]: the model has 17,246,465 parameters, whose "
        "weights, gradients and Adam state take 0.3 GiB, more than this machine's 0.3 GiB of "
        "memory; use smaller model layer sizes"
    )


def test_train_refuses_a_model_beyond_the_machine_before_writing(tmp_path):
    # 63 layers of 16384: 16.6e9 parameters, 248 GiB with Adam; refused by hvdtrack train
    # before the dataset or the run directory exist.
    widths = ",".join(["16384"] * 63 + ["16"])
    config = load_config(TINY, [f"model.edge_update=[{widths}]"])
    if (memory := os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) > 248 * 2**30:
        pytest.skip(f"this machine has {memory / 2**30:.0f} GiB: the model fits")
    args = [f"train.run_dir={tmp_path / 'run'}", f"data.dataset_dir={tmp_path / 'data'}"]
    done = subprocess.run(
        [sys.executable, "-m", "hvdtrack.train", "--config", str(TINY), *args,
         f"model.edge_update=[{widths}]"],
        env=worker_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert config.model.edge_update[0] == 16384
    assert "hvdtrack: error: 'model.edge_update' [16384, " in done.stderr, done.stderr
    assert "248.0 GiB, more than this machine's" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()
