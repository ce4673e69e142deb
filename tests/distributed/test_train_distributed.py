"""The one training loop under real distribution: Horovod (Gloo, MPI), MirroredStrategy on 2
logical CPU devices, and MultiWorkerMirroredStrategy with 2 local processes.

Each job checks, against a single-worker reference computed here:
  * gradients of one step on 2 workers x b graphs == 1 worker x the same 2b graphs;
  * validation metrics on 2 workers == on 1 worker (same weights);
  * every rank holds the same weights after training (ranks start from different seeds, so
    only the broadcast makes them equal), and a rerun gives the same losses;
  * only rank 0 wrote files.
"""

import dataclasses
import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from hvdtrack.config import load_config
from hvdtrack.inputs import pipeline
from hvdtrack.train.trainer import Trainer
from tests.launch import REPO, check, horovodrun, worker_env

pytestmark = [pytest.mark.distributed]
PROGRAM = "tests/distributed/train_program.py"
CONFIG = str(REPO / "configs/tiny.yaml")
OVERRIDES = ["train.epochs=2", "train.batch_graphs=2", "train.checkpoint_every_steps=1"]


def results(out) -> dict[int, dict]:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("result-rank*.json"))]
    return {row["rank"]: row for row in rows}


def reference(tiny_dataset, out, saved):
    """Gradients and validation metrics of one local worker given all workers' step-0 graphs."""
    config = load_config(
        CONFIG,
        [
            f"data.dataset_dir={tiny_dataset}",
            f"train.run_dir={out / 'reference'}",
            "train.batch_graphs=4",
        ],
    )
    trainer = Trainer(config)
    for i, v in enumerate(trainer.state.variables):
        v.assign(saved[f"init{i}"])
    ids = saved["graph_ids"].reshape(1, 1, -1)  # every worker's step-0 graphs, one batch
    plan = trainer.data.plan(0)
    plan = dataclasses.replace(plan, num_workers=1, batch_graphs=ids.shape[-1], graph_ids=ids)
    batch = next(iter(pipeline.train_dataset(tiny_dataset, trainer.data.manifest, plan, 0)))
    loss, grads = trainer.step.gradients([batch])
    return loss, grads, trainer.evaluate("val")


def check_job(out_rows, tiny_dataset, out, num_workers=2):
    assert sorted(out_rows) == list(range(len(out_rows)))
    saved = np.load(out / "grads-rank0.npz")
    assert saved["graph_ids"].shape == (num_workers, 2)
    ref_loss, ref_grads, ref_val = reference(tiny_dataset, out, saved)
    dist_grads = [saved[f"grad{i}"] for i in range(len(ref_grads))]
    for g_ref, g_dist in zip(ref_grads, dist_grads):
        np.testing.assert_allclose(g_dist, g_ref, rtol=2e-5, atol=1e-7)
    assert float(saved["loss"]) == pytest.approx(ref_loss, rel=1e-5)
    rows = list(out_rows.values())
    for row in rows:
        assert row["num_workers"] == num_workers and row["status"] == "finished"
        for key in ("loss", "auc", "efficiency", "purity", "accuracy", "num_edges"):
            # NaN == NaN here: an untrained model may predict no positives (purity undefined).
            np.testing.assert_allclose(
                row["val"][key], ref_val[key], rtol=1e-9, equal_nan=True, err_msg=key
            )
        assert row["weights"] == rows[0]["weights"]  # identical after the broadcast
        assert row["losses_a"] == row["losses_b"] and len(row["losses_a"]) == 2  # deterministic
    # Only rank 0 wrote: one TensorBoard event file, and records of every rank in one file.
    run = out / "a"
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    ranks = {json.loads(line).get("rank") for line in open(run / "timing.jsonl")} - {None}
    assert ranks == set(range(len(out_rows)))
    assert sorted(p.name for p in run.iterdir()) == [
        "best",
        "checkpoints",
        "config.yaml",
        "run.json",
        "tensorboard",
        "timing.jsonl",
        "versions.json",
    ]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_horovod(controller, tiny_dataset, tmp_path):
    job = horovodrun(
        2, [PROGRAM, CONFIG, str(tiny_dataset), str(tmp_path), "horovod", *OVERRIDES], controller
    )
    check(job)
    check_job(results(tmp_path), tiny_dataset, tmp_path)


def test_mirrored_two_logical_cpus(tiny_dataset, tmp_path):
    job = subprocess.run(
        [sys.executable, PROGRAM, CONFIG, str(tiny_dataset), str(tmp_path), "mirrored", *OVERRIDES],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    check(job)
    rows = results(tmp_path)
    assert list(rows) == [0]
    check_job(rows, tiny_dataset, tmp_path)


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multiworker_two_processes(tiny_dataset, tmp_path):
    workers = [f"localhost:{p}" for p in _free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    PROGRAM,
                    CONFIG,
                    str(tiny_dataset),
                    str(tmp_path),
                    "multiworker",
                    *OVERRIDES,
                ],
                cwd=REPO,
                env=worker_env(TF_CONFIG=tf_config),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        check(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    rows = results(tmp_path)
    check_job(rows, tiny_dataset, tmp_path)


def test_too_few_graphs_fails_fast_on_every_rank(tiny_dataset, tmp_path):
    # 8 training graphs cannot fill one step of 2 workers x 5 graphs: refused at start, no hang.
    job = horovodrun(
        2,
        [
            "-m",
            "hvdtrack.train",
            "--config",
            CONFIG,
            f"data.dataset_dir={tiny_dataset}",
            f"train.run_dir={tmp_path / 'run'}",
            "distributed.strategy=horovod",
            "train.batch_graphs=5",
        ],
        "gloo",
        timeout=200,
    )
    assert job.returncode != 0
    assert "hvdtrack: error:" in job.stdout + job.stderr
    assert "8" in job.stdout + job.stderr


def exchange(out) -> list[dict]:
    """Per rank: the terms its step-0 exchange got and what it gave (train_program.py)."""
    records = []
    for rank in range(2):
        saved = np.load(out / f"exchange-rank{rank}.npz")
        record = {}
        for key in sorted(saved.files, key=lambda k: int(k.rpartition("_")[2])):
            record.setdefault(key.rpartition("_")[0], []).append(saved[key])
        records.append(record)
    return records


def adasum(a, b):
    """Adasum of 2 ranks, tensor by tensor: (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b; as in
    Horovod (common/ops/adasum/adasum.h) a coefficient stays 1 when its |x|^2 < 1e-8."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
    ca = 1 - dot / (2 * aa) if aa >= 1e-8 else 1.0
    cb = 1 - dot / (2 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def assert_differs(actual, other, rtol, what):
    """Some gradient entry differs from ``other``'s by more than rtol x that tensor's largest."""
    gap = max(np.abs(x - y).max() / np.abs(y).max() for x, y in zip(actual, other) if y.any())
    assert gap > rtol, f"the exchange gave {what} (largest relative difference {gap:.2g})"


def check_fp16_exchange(records):
    """Every rank's normalised gradient, cast to float16, summed in float16 (Horovod's fp16
    compression), then cast back: exactly, and not the float32 sum the option replaces."""
    terms = [r["terms"] for r in records]
    total = np.float32(terms[0][1] + terms[1][1])  # the exact weight sum (never compressed)
    for i, got in enumerate(records[0]["reduced"][2:]):
        halves = [(t[2 + i] / total).astype(np.float16) for t in terms]
        np.testing.assert_array_equal(got, (halves[0] + halves[1]).astype(np.float32), f"grad {i}")
    plain = [(a + b) / total for a, b in zip(terms[0][2:], terms[1][2:])]
    assert_differs(records[0]["reduced"][2:], plain, 1e-4, "the float32 sum")


def check_adasum_exchange(records):
    """Adasum of the 2 ranks' mean gradients (each over its own weight), not their average."""
    a, b = ([g / t[1] for g in t[2:]] for t in (r["terms"] for r in records))
    got = records[0]["reduced"][2:]
    expected = [adasum(x, y) for x, y in zip(a, b)]
    for i, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(
            g, e, rtol=1e-5, atol=1e-6 * np.abs(e).max(), err_msg=f"grad {i}"
        )
    assert_differs(got, [(x + y) / 2 for x, y in zip(a, b)], 1e-3, "the average")
    assert_differs(got, [x + y for x, y in zip(a, b)], 1e-3, "the sum")


@pytest.mark.parametrize(
    "controller, options",
    [
        ("gloo", ["distributed.compression=fp16", "distributed.backward_passes_per_step=2"]),
        ("mpi", ["distributed.reduce_op=adasum"]),
    ],
    ids=["fp16-accumulate-gloo", "adasum-mpi"],
)
def test_horovod_options(controller, options, tiny_dataset, tmp_path):
    """The option changes what the exchange gives (checked against numpy on each rank's real
    step-0 terms), and training with it runs: ranks in step, deterministic, right step count."""
    args = [PROGRAM, CONFIG, str(tiny_dataset), str(tmp_path), "horovod", *OVERRIDES, *options]
    check(horovodrun(2, args, controller))
    records = exchange(tmp_path)
    for got, other in zip(records[0]["reduced"], records[1]["reduced"]):
        np.testing.assert_array_equal(got, other)  # every rank got the same result
    passes = 2 if "distributed.backward_passes_per_step=2" in options else 1
    if passes == 2:
        # The exchange got both passes' terms (pass 0 holds edges: dropping it would show).
        # Not bit for bit: each pass was computed again, and TF's CPU sums vary in the last bit.
        for r in records:
            assert r["pass0"][1] > 0
            for got, p0, p1 in zip(r["terms"], r["pass0"], r["pass1"]):
                np.testing.assert_allclose(got, p0 + p1, rtol=1e-5, atol=1e-6 * np.abs(got).max())
    if "distributed.compression=fp16" in options:
        check_fp16_exchange(records)
    else:
        check_adasum_exchange(records)
    rows = results(tmp_path)
    assert sorted(rows) == [0, 1]
    for row in rows.values():
        assert row["status"] == "finished"
        assert row["weights"] == rows[0]["weights"]  # the ranks stay in step
        assert all(np.isfinite(row["losses_a"])) and row["losses_a"] == row["losses_b"]
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["global_batch_graphs"] == 2 * 2 * passes
    steps = [json.loads(line) for line in open(tmp_path / "a" / "timing.jsonl")]
    # 8 graphs / (2 workers x 2 graphs x passes) optimizer steps per epoch, each rank, 2 epochs.
    assert sum(1 for s in steps if s["kind"] == "step") == 2 * 2 * (2 // passes)
