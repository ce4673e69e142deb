"""The distributed bench: the runs it launches, and its figures from finished run directories."""

from __future__ import annotations

import json
import shutil

import pytest

from hvdtrack.bench import distributed
from hvdtrack.bench.ceiling import Ceiling
from hvdtrack.errors import DataError
from tests.scaling.conftest import write_synthetic_run

# name -> (workers, epoch_s[epoch][rank], per-worker batch), global batch 2
RUNS = {
    "local": (1, [[13.0], [12.5], [12.6]], 2),
    "mirrored1": (1, [[13.0], [12.5], [12.7]], 2),
    "mirrored2": (1, [[9.0], [8.1], [8.2]], 1),
    "sweep/strong-np1": (1, [[14.0], [13.5], [13.6]], 2),
    "sweep/strong-np2": (2, [[8.0, 8.1], [7.5, 7.6], [7.4, 7.7]], 1),
    "fit/weak-np1": (1, [[7.0], [6.8], [6.9]], 1),
}


# Step times (the first two warm-up): the one-graph steps of np1-half take about half of np1's
# two-graph ones, so the model's fit has a per-edge cost (every other run: 0.7 0.65 0.62 ...).
HALF_STEP_S = [0.4, 0.36, 0.33, 0.31, 0.32, 0.34]


def write_round(out, scale=1.0, local_s=None):
    """The six runs of one round in ``out``: RUNS's epochs times ``scale``, the local run's
    epochs ``local_s`` if given."""
    for name, (n, epoch_s, batch) in RUNS.items():
        if name == "local" and local_s is not None:
            epoch_s = [[t] for t in local_s]
        full = [0.7, 0.65, 0.62, 0.6, 0.61, 0.63]
        write_synthetic_run(
            out / name,
            n,
            epoch_s=[[scale * t for t in epoch] for epoch in epoch_s],
            step_s=HALF_STEP_S if name == "fit/weak-np1" else full,
            batch_graphs=batch,
            global_batch_graphs=2,
            info={"edges_processed": 1200, "local_size": n},
        )


def write_ceiling(directory, alone_s, together_s):
    """A ceiling.json of one alone / together pair (8000 nodes, 22000 edges) in ``directory``."""
    ceiling = dict(processes=2, nodes=8000, edges=22000, alone_s=[alone_s], together_s=[together_s])
    (directory / "ceiling.json").write_text(json.dumps(ceiling))


def test_report_only_computes_the_figures_of_the_runs_in_out(tmp_path, capsys):
    out = tmp_path / "bench"
    write_round(out / "round-1")
    write_ceiling(out / "round-1", 0.40, [0.44, 0.45])
    args = ["--out", str(out), "--epochs", "3", "--report-only", "--json", str(tmp_path / "f.json")]
    assert distributed.main([*args, "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[1]
        == "Global batch 2 graphs/step (np1-half: 1), one thread per worker, 3 epochs (first "
        "excluded):"
    )
    assert [line.split()[0] for line in lines[3:9]] == [
        "local",
        "np1",
        "np2",
        "np1-half",
        "mirrored1",
        "mirrored2",
    ]
    assert lines[3].split()[1:] == ["12.55", "1.23", "0.6150"]
    assert lines[9] == (
        "  ceiling for 2 ranks here, measured in each round, after np1-half: a rank's step "
        "(8000 nodes, 22000 edges, synthetic graphs) 400 ms alone, 450 ms two at once, in "
        "turn -> t_alone/t_together 0.889"
    )
    # Compute per edge: the steps after the 2 warm-up ones take 0.62, 0.60, 0.61, 0.63 s, less
    # 0.01 s of data: median 0.605 s over 200 edges (np1, 2 graphs a step), over 100 (np2).
    assert lines[10] == (
        "  the Horovod ranks' own contention: np1's compute per edge / np2's 0.500 "
        "(3025.000 / 6050.000 us, median steps)"
    )
    assert lines[11].startswith("  horovod strong-scaling efficiency t1/(2*t2): 0.886 on epochs")
    assert lines[11].endswith("; 0.996 of the ceiling on epochs")
    assert lines[12].startswith("  mirrored strong-scaling efficiency t1/(2*t2): 0.773 on epochs")
    assert lines[13] == "  Horovod overhead on one rank: +8.0% on epochs (+0.0% on steps)"
    # The model at N=2, fitted on np1's steps (0.62 0.60 0.61 0.63 s at 200 edges) and
    # np1-half's (0.33 0.31 0.32 0.34 s at 100): 2.9 ms an edge and 35 ms a step, over the
    # ceiling 0.889 for np2's 100 edges a rank; Horovod's default 1 ms cycle: half of it for
    # the last rank's loop and a quarter for the other's; measured 0.615 / (2 x 0.616).
    assert lines[14] == (
        "  the scaling model at N=2, fitted on each round's np1 and np1-half, against np2 on "
        "median steps: error +61.9%"
    )
    assert lines[15].startswith(
        "    round 1: N=2 (shared-memory): predicted efficiency 0.808, measured 0.499, error "
        "+61.9% (step 380.56 ms predicted = compute 326.25 + fixed 39.37 + straggler 3.54 + "
        "cycle 0.75 + allreduce 10.65 ms"
    )
    figures = json.loads((tmp_path / "f.json").read_text())
    (check,) = figures["prediction_n2"]["rounds"]
    assert check["predicted_compute_s"] == pytest.approx(0.0029 * 100 / (0.40 / 0.45))
    assert check["predicted_fixed_s"] == pytest.approx(0.035 / (0.40 / 0.45))
    assert check["measured_efficiency"] == pytest.approx(0.615 / (2 * 0.616))
    assert figures["prediction_n2"]["relative_error"] == check["relative_error"]
    assert list(figures)[:9] == [
        "config", "global_batch_graphs", "epochs", "epoch_s", "median_step_s",
        "edges_per_epoch", "horovod_overhead_epoch", "horovod_overhead_step", "epoch_step_sum_s",
    ]  # fmt: skip
    assert figures["edges_per_epoch"] == 400.0
    assert figures["horovod_strong_efficiency_epoch"] == pytest.approx(13.55 / (2 * 7.65))
    assert figures["mirrored_strong_efficiency_epoch"] == pytest.approx(12.6 / (2 * 8.15))
    assert figures["horovod_of_ceiling_epoch"] == pytest.approx(13.55 / (2 * 7.65) / (0.40 / 0.45))
    assert figures["compute_per_edge_s"]["np2"] == pytest.approx(0.00605)
    assert figures["horovod_own_contention"] == pytest.approx(0.5)
    assert len(figures["rounds"]) == 1


def test_rounds_give_the_median_of_each_rounds_own_figures(tmp_path, capsys):
    """Three rounds: the machine 20% slower in the second (every run alike), the local run
    slower than np1 in the third. Each figure is the median of the rounds' figures, not a
    figure of the median times."""
    out = tmp_path / "bench"
    write_round(out / "round-1")
    write_round(out / "round-2", scale=1.2)
    write_round(out / "round-3", local_s=[14.0, 14.0, 14.0])
    # Each round's own ceiling: 0.889, 0.800, 1.000.
    write_ceiling(out / "round-1", 0.40, [0.44, 0.45])
    write_ceiling(out / "round-2", 0.40, [0.50, 0.48])
    write_ceiling(out / "round-3", 0.45, [0.45, 0.44])
    args = ["--out", str(out), "--epochs", "3", "--report-only", "--json", str(tmp_path / "f.json")]
    assert distributed.main(args) == 0  # --rounds 3, the default
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("3 epochs (first excluded), 3 rounds in turn, medians:")
    # local: 12.55 s, 15.06 s (1.2 x 12.55), 14.00 s: median 14.00
    assert (
        lines[3] == "  local          14.00        1.23          0.6150 (rounds: 12.55 15.06 14.00)"
    )
    assert lines[9] == (
        "  ceiling for 2 ranks here, measured in each round, after np1-half: a rank's step "
        "(8000 nodes, 22000 edges, synthetic graphs) 400 ms alone, 450 ms two at once; 400 ms "
        "alone, 500 ms two at once; 450 ms alone, 450 ms two at once, in turn -> "
        "t_alone/t_together 0.889 "
        "(rounds: 0.889 0.800 1.000)"
    )
    # np1 13.55 s, np2 7.65 s: the same efficiency in rounds 1 and 2 (the scale cancels);
    # against each round's own ceiling 0.886 / 0.889, 0.886 / 0.8, 0.886 / 1
    assert lines[11].startswith(
        "  horovod strong-scaling efficiency t1/(2*t2): 0.886 on epochs (rounds: 0.886 0.886 0.886)"
    )
    assert lines[11].endswith("; 0.996 of the ceiling on epochs (rounds: 0.996 1.107 0.886)")
    # overhead: +8.0% (rounds 1 and 2), 13.55 / 14.00 - 1 = -3.2% (round 3): median +8.0%
    assert lines[13] == (
        "  Horovod overhead on one rank: +8.0% on epochs (rounds: +8.0% +8.0% -3.2%) "
        "(+0.0% on steps)"
    )
    figures = json.loads((tmp_path / "f.json").read_text())
    assert figures["epoch_s"]["local"] == pytest.approx(14.0)
    assert figures["epoch_s"]["np1"] == pytest.approx(13.55)
    assert figures["horovod_overhead_epoch"] == pytest.approx(13.55 / 12.55 - 1)
    assert [r["horovod_overhead_epoch"] for r in figures["rounds"]] == pytest.approx(
        [13.55 / 12.55 - 1, 13.55 / 12.55 - 1, 13.55 / 14.0 - 1]
    )
    assert figures["ceiling"] == pytest.approx(0.40 / 0.45)
    assert [r["ceiling"] for r in figures["rounds"]] == pytest.approx([0.40 / 0.45, 0.8, 1.0])
    # Each round's prediction over its own ceiling: np2's compute 0.29 s (2.9 ms x 100 edges)
    checks = figures["prediction_n2"]["rounds"]
    assert [c["predicted_compute_s"] for c in checks] == pytest.approx(
        [0.29 * 0.45 / 0.40, 0.29 / 0.8, 0.29]
    )


def test_report_only_on_rounds_without_np1_half_gives_the_rest(tmp_path, capsys):
    """A bench trained before np1-half: its runs' figures, and a line saying the model's check
    at N=2 needs that run."""
    out = tmp_path / "bench"
    write_round(out / "round-1")
    shutil.rmtree(out / "round-1" / "fit")
    # ... and from before per-round ceilings: one ceiling.json beside the rounds, written before
    # the ceiling had pairs (one number, one list)
    ceiling = dict(processes=2, nodes=8000, edges=22000, alone_s=0.40, together_s=[0.44, 0.45])
    (out / "ceiling.json").write_text(json.dumps(ceiling))
    args = ["--out", str(out), "--epochs", "3", "--report-only", "--rounds", "1"]
    assert distributed.main([*args, "--json", str(tmp_path / "f.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[3:8]] == [
        "local", "np1", "np2", "mirrored1", "mirrored2",
    ]  # fmt: skip
    assert lines[8] == (
        "  ceiling for 2 ranks here, measured once, after the rounds: a rank's step (8000 "
        "nodes, 22000 edges, synthetic graphs) 400 ms alone, 450 ms two at once, in turn -> "
        "t_alone/t_together 0.889"
    )
    assert lines[-1] == "  the scaling model at N=2: not checked, these rounds have no np1-half run"
    figures = json.loads((tmp_path / "f.json").read_text())
    assert "prediction_n2" not in figures
    assert figures["horovod_strong_efficiency_epoch"] == pytest.approx(13.55 / (2 * 7.65))


def test_report_only_names_a_missing_round(tmp_path):
    out = tmp_path / "bench"
    write_round(out / "round-1")
    write_ceiling(out / "round-1", 0.40, [0.44, 0.45])
    with pytest.raises(DataError, match="round-2"):
        distributed.main(["--out", str(out), "--report-only", "--rounds", "2"])


def test_rounds_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as stop:
        distributed.parse_args(["--rounds", "0"])
    assert stop.value.code == 2
    assert "--rounds 0: at least 1" in capsys.readouterr().err


def test_report_only_without_a_measured_ceiling_says_so(tmp_path):
    out = tmp_path / "bench"
    write_round(out / "round-1")
    with pytest.raises(
        DataError, match=r"round-1/ceiling.json: no ceiling measured .* without --report-only"
    ):
        distributed.main(["--out", str(out), "--report-only", "--rounds", "1"])


def test_it_prepares_then_trains_each_round_local_horovod_half_ceiling_then_mirrored(
    tmp_path, monkeypatch
):
    calls = []
    monkeypatch.setattr(distributed.subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.setattr(distributed, "run_sweep", lambda plan, skip_prepare: calls.append(plan))
    monkeypatch.setattr(
        distributed, "measure_round_ceiling", lambda args, common, out: calls.append(out)
    )

    def stop(path):
        raise StopIteration(path)

    monkeypatch.setattr(distributed, "read_run", stop)
    with pytest.raises(StopIteration):
        distributed.main(["--out", str(tmp_path), "--max-steps", "5", "--controller", "mpi"])
    prepare, local, plan, half, ceiling, mirrored1, mirrored2 = calls
    assert prepare[1:3] == ["-m", "hvdtrack.prepare"]
    common = ["train.epochs=4", "train.progress_bar=false", "distributed.threads_per_worker=1"]
    common += ["train.validate_every_epochs=1000", "train.max_steps_per_epoch=5"]
    out = tmp_path / "round-1"
    assert local[5:] == [
        *common, "distributed.strategy=local", "train.batch_graphs=2",
        f"train.run_dir={out / 'local'}", "train.resume=false",
    ]  # fmt: skip
    for n, command in ((1, mirrored1), (2, mirrored2)):
        assert command[5:] == [
            *common, "distributed.strategy=mirrored", f"distributed.num_cpu_devices={n}",
            f"distributed.threads_per_worker={n}", f"train.batch_graphs={2 // n}",
            f"train.run_dir={out / f'mirrored{n}'}", "train.resume=false",
        ]  # fmt: skip
    assert (plan.mode, plan.nps, plan.controller, plan.batches) == (
        "strong",
        (1, 2),
        "mpi",
        {1: 2, 2: 1},
    )
    assert plan.out_dir == out / "sweep"
    assert plan.overrides == (*common, "train.resume=false")
    # then np1 with half the global batch, for the model's fit
    assert (half.mode, half.nps, half.controller, half.batches) == ("weak", (1,), "mpi", {1: 1})
    assert (half.out_dir, half.overrides) == (out / "fit", plan.overrides)
    # then the round's ceiling, into the round's folder
    assert ceiling == out


def test_report_only_takes_no_stale_ceiling_for_a_round_without_its_own(tmp_path):
    """A round with no ceiling.json beside rounds that have one is an error naming it, even
    where an older bench left its one ceiling.json in --out."""
    out = tmp_path / "bench"
    for k in (1, 2):
        write_round(out / f"round-{k}")
    write_ceiling(out / "round-1", 0.40, [0.44, 0.45])
    write_ceiling(out, 0.40, [0.50, 0.50])
    with pytest.raises(DataError, match=r"round-2/ceiling.json: no ceiling measured"):
        distributed.main(["--out", str(out), "--report-only", "--rounds", "2"])


def test_report_only_on_rounds_of_which_one_lacks_np1_half(tmp_path, capsys):
    """The runs every round has: np1-half missing from round 2 leaves it out of the figures and
    the model unchecked, no error."""
    out = tmp_path / "bench"
    for k in (1, 2):
        write_round(out / f"round-{k}")
        write_ceiling(out / f"round-{k}", 0.40, [0.44, 0.45])
    shutil.rmtree(out / "round-2" / "fit")
    args = ["--out", str(out), "--epochs", "3", "--report-only", "--rounds", "2"]
    assert distributed.main([*args, "--json", str(tmp_path / "f.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[3:8]] == [
        "local", "np1", "np2", "mirrored1", "mirrored2",
    ]  # fmt: skip
    assert lines[-1] == "  the scaling model at N=2: not checked, these rounds have no np1-half run"
    assert "np1-half" not in json.loads((tmp_path / "f.json").read_text())["epoch_s"]


def test_a_rounds_ceiling_is_measured_on_training_graphs_with_the_runs_model(tmp_path, monkeypatch):
    """Two ranks' share (G/2 graphs) of the config's training split, the runs' model overrides,
    ``CEILING_PAIRS`` pairs of ``CEILING_STEPS`` steps; written to the round's ceiling.json,
    read back as it."""
    asked = {}

    def measure(config, processes, nodes, edges, repeats, overrides, rounds, training):
        asked.update(config=config, processes=processes, overrides=overrides, rounds=rounds)
        asked["repeats"] = repeats
        asked["training"] = training
        return Ceiling(processes, 8000, 22000, [0.40], [[0.44, 0.45]], "training")

    monkeypatch.setattr(distributed, "measure_ceiling", measure)
    args = distributed.parse_args(["--out", str(tmp_path), "--global-batch", "4", "--rounds", "1"])
    (tmp_path / "round-1").mkdir()
    common = ["train.epochs=4", "model.keep_edge_term=true"]
    distributed.measure_round_ceiling(args, common, tmp_path / "round-1")
    assert asked == dict(
        config="configs/default.yaml", processes=2, overrides=["model.keep_edge_term=true"],
        rounds=distributed.CEILING_PAIRS, training=("data/default", 2.0),
        repeats=distributed.CEILING_STEPS,
    )  # fmt: skip
    (ceiling,) = distributed.read_ceilings(args)
    assert (ceiling["graphs"], ceiling["in_round"]) == ("training", True)
    assert ceiling["ceiling"] == pytest.approx(0.40 / 0.45)
