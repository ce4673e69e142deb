"""Scaling maths on run records: step statistics, epoch time and work, speedup, efficiency.

t1: time on 1 worker, tN: on N workers. Speedup = t1 / tN; strong-scaling efficiency
t1 / (N tN) (fixed global batch and data), weak-scaling efficiency t1 / tN (fixed work per
worker). A synchronous step or epoch takes its slowest rank's time; ``epoch_time`` is the median
over the epochs after the first ``warmup_epochs`` (all of them when there are no more); step
statistics leave out the steps any rank marked warm-up.

Beyond this machine (``predict_scaling``, ``validate_against``): a model of the synchronous
step of N workers, fed by the N=1 run's measured steps (``baseline_inputs`` -> ``StepModel``):

    step(N) = [b E_N + a + straggler(N)] / ceiling + cycle + t(N)

- compute that shrinks, b E_N, and compute that does not, a: least squares over the N=1 run's
  non-warm-up steps of the step without exchange (``total_s - exchange_s``: compute and data
  wait) on the step's edges E. Strong scaling: E_N = mean(E) / N; weak: E_N = mean(E).
- straggler(N): E[max over N ranks] - mean of per-rank work b e + r (``straggler_wait``): e the
  rank's edges in the epoch plans for N ranks, else a share of an N=1 step's edges; r a
  step-to-step change of the fit's residuals, centred (a drift is common to all ranks), times
  the rank's share of an N=1 step's work (strong: 1/N; the spread grows with the work);
  deterministic.
- ceiling (0, 1]: t_alone / t_concurrent when ranks share a host (``bench distributed``'s
  "ceiling"); 1.0 unless given.
- cycle: the last rank's gradients wait half a cycle per fused round (ceil(B / fusion buffer))
  for its own Horovod loop, then cycle (N-1)/(2N) for the loop running latest (``cycle_wait``);
  the cycle from run.json's config (``distributed.horovod_cycle_time_ms``), else Horovod
  0.28.1's default 1 ms; fusion buffer Horovod's 128 MiB. None without Horovod's loop; at N = 1
  the N=1 run's measured exchange, whatever the strategy.
- t(N): ring allreduce of the B gradient bytes, no overlap with compute:
  t(N) = 2(N-1)/N * B / bandwidth + 2(N-1) * latency (``network.ring_allreduce_time``).

At N = 1 the model's step is a + b mean(E) + the N=1 run's measured exchange
(``StepModel.exchange_s``): on one rank hvdtrack's exchange is the identity, as Horovod's
``DistributedGradientTape`` makes it (``HorovodWorkers.alone``), not a trip through the loop.
Strong-scaling efficiency step(1) / (N step(N)), weak step(1) / step(N). ``validate_against``
puts each term beside what a measured run shows: its exchange (cycle, allreduce and the wait for
slower ranks), the exchange of the rank last to finish its work (cycle and allreduce alone), its
straggler (slowest rank minus the ranks' mean, without the exchange) and the N=1 run's
step-to-step spread (``step_spread``), from which the wait comes.

Public symbols: ``STEP_FIELDS``, ``step_statistics``, ``step_times``, ``epoch_step_time``,
``epoch_times``, ``epoch_time``, ``epoch_work``, ``efficiency``, ``DEFAULT_NS``,
``HOROVOD_CYCLE_S``, ``HOROVOD_FUSION_BYTES``, ``StepModel``, ``Prediction``, ``Validation``,
``cycle_wait``, ``straggler_wait``, ``step_spread``, ``predict_scaling``, ``baseline_inputs``,
``validate_against``. The links: ``hvdtrack.scaling.network``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from hvdtrack.errors import DataError
from hvdtrack.runs.timing import EpochTiming, Run, StepTiming
from hvdtrack.scaling.network import PRESETS, NetworkModel, ring_allreduce_time
from hvdtrack.scaling.straggler import (
    independent_straggler,
    planned_shares,
    planned_straggler,
    training_graphs,
)

STEP_FIELDS = ("data_s", "compute_s", "exchange_s", "total_s")


def step_statistics(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``{"mean", "std", "min", "max", "median", "count"}`` of times; ``std`` with ddof=1 (0.0
    for one value). DataError when empty (all steps warm-up)."""
    x = pd.Series(np.asarray(values, dtype=np.float64).ravel())
    if x.empty:
        raise DataError("no timing values to summarise (are all steps marked warm-up? lower "
                        "scaling.timing_warmup_steps or run more steps)")  # fmt: skip
    stats = x.agg(["mean", "std", "min", "max", "median"]).fillna(0.0)
    return {**{k: float(v) for k, v in stats.items()}, "count": int(x.size)}


def step_times(run: Run, field: str = "total_s") -> np.ndarray:
    """The slowest rank's ``field`` (one of ``STEP_FIELDS``) of each non-warm-up step, by
    (epoch, step); DataError naming the run when there is none."""
    if field not in STEP_FIELDS:
        raise ValueError(f"field must be one of {', '.join(STEP_FIELDS)}, got {field!r}")
    return _timed_steps(run)[field].to_numpy(dtype=np.float64)


def epoch_step_time(run: Run, warmup_epochs: int = 1) -> float:
    """Per whole epoch the sum of its steps' slowest-rank times (warm-up included), median over
    the epochs ``epoch_time`` uses: the gap to ``epoch_time`` is what lies outside the steps."""
    whole = sorted(set(_whole_epochs(run)["epoch"]))
    if not whole:
        raise DataError(f"{run.path}: no whole epoch in timing.jsonl")
    sums = _slowest_steps(run).groupby("epoch")["total_s"].sum()
    return float(np.median([sums.get(e, 0.0) for e in _after_warmup(whole, warmup_epochs)]))


def epoch_times(run: Run) -> np.ndarray:
    """Time of each whole epoch (the slowest rank's); an epoch resumed mid-way, with fewer than
    ``steps_per_epoch`` steps, is left out."""
    return _whole_epochs(run).groupby("epoch")["time_s"].max().to_numpy(dtype=np.float64)


def epoch_time(run: Run, warmup_epochs: int = 1) -> float:
    """The median of ``epoch_times`` after ``warmup_epochs`` (all of them in a shorter run)."""
    times = epoch_times(run)
    if times.size == 0:
        raise DataError(f"{run.path}: no epoch timings in timing.jsonl; did the run finish one?")
    return float(np.median(_after_warmup(times, warmup_epochs)))


def epoch_work(run: Run, warmup_epochs: int = 1) -> dict[str, float]:
    """``{"graphs", "edges", "steps"}`` of one epoch (median over the timed epochs), graphs and
    edges summed over ranks, steps per rank (``epoch_time`` refuses a run without epochs)."""
    work = {"graphs": "sum", "edges": "sum", "steps": "max"}
    per_epoch = _frame(run.epochs, EpochTiming).groupby("epoch").agg(work).astype(np.float64)
    return {k: float(v) for k, v in _after_warmup(per_epoch, warmup_epochs).median().items()}


def efficiency(mode: str, t1: float, tn: float, n: int) -> float:
    """Strong scaling: t1 / (N tN), 1 when N workers are N times faster; weak: t1 / tN."""
    for name, value in (("t1", t1), ("tN", tn), ("N", n)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    return t1 / tn / (n if mode == "strong" else 1)


DEFAULT_NS = (8, 16, 32, 64, 128, 256, 512, 1024)
# Horovod 0.28.1's defaults (since 0.21.0, horovod/horovod#2468; `horovodrun --help` says so):
# HOROVOD_CYCLE_TIME 1 ms, HOROVOD_FUSION_THRESHOLD 128 MiB.
HOROVOD_CYCLE_S = 1e-3
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StepModel:
    """One worker's step as the N=1 run measured it: the model's inputs (``baseline_inputs``).

    Attributes:
      fixed_s: a, the per-step cost that does not shrink with the batch (optimizer update,
        dispatch, data wait).
      per_edge_s: b, seconds per edge of the batch.
      edges: [S] edges of each of the S non-warm-up steps of the N=1 run (its whole batch).
      residuals_s: [S] each step's time without exchange minus a + b * edges (the spread the
        edges do not explain).
      gradient_bytes: bytes of all gradients (one allreduce's worth per step).
      cycle_s: Horovod's cycle (HOROVOD_CYCLE_TIME); 0 for strategies without one.
      fusion_bytes: Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD).
      exchange_s: the N=1 run's median exchange, part of the model's N=1 step (0.0 when not
        measured).
      notes: where an input was not measured or recorded, what was taken instead.
      graph_edges, graphs_per_step, sort_window: the training graphs' edges, an N=1 step's
        graphs and the plans' sort window (``straggler.training_graphs``; () when unknown).
    """

    fixed_s: float
    per_edge_s: float
    edges: tuple[float, ...]
    residuals_s: tuple[float, ...]
    gradient_bytes: int
    cycle_s: float = HOROVOD_CYCLE_S
    fusion_bytes: int = HOROVOD_FUSION_BYTES
    exchange_s: float = 0.0
    notes: tuple[str, ...] = ()
    graph_edges: tuple[float, ...] = ()
    graphs_per_step: int = 1
    sort_window: int = 1

    @property
    def step_s(self) -> float:
        """The modelled single-worker step without exchange, a + b * mean(edges)."""
        return self.fixed_s + self.per_edge_s * float(np.mean(self.edges))


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The modelled step of N workers and its terms, in seconds: ``compute_s`` b E / N (strong)
    or b E (weak), ``fixed_s`` a, ``straggler_s`` the wait for the slowest rank, ``cycle_s``
    Horovod's loop (the cycle's wait; at N=1 the run's measured exchange, any strategy),
    ``allreduce_s`` the ring t(N); ``step_s`` their sum; ``efficiency``."""

    n: int
    compute_s: float
    fixed_s: float
    straggler_s: float
    cycle_s: float
    allreduce_s: float
    step_s: float
    efficiency: float


@dataclasses.dataclass(frozen=True)
class Validation:
    """A measured run of N workers against the model over ``network``: step times (median,
    slowest rank), efficiencies on step times, the relative error of the predicted efficiency,
    the predicted terms (``Prediction``'s) and what the run measured of them: the median
    exchange (cycle, allreduce and the wait for slower ranks), ``measured_straggler_s``, the
    median over steps of the slowest rank's time without exchange minus the ranks' mean, and
    ``measured_last_exchange_s``, the median over steps of the exchange of the rank that
    finished its work last (which waits for no other rank: the measured counterpart of cycle +
    allreduce). ``step_spread_s``: the N=1 run's step-to-step spread that the straggler term
    draws from (``step_spread``), which sets how long ranks wait for each other."""

    n: int
    network: str
    predicted_step_s: float
    measured_step_s: float
    predicted_efficiency: float
    measured_efficiency: float
    relative_error: float
    predicted_compute_s: float
    predicted_fixed_s: float
    predicted_straggler_s: float
    predicted_cycle_s: float
    predicted_allreduce_s: float
    measured_exchange_s: float
    measured_straggler_s: float
    measured_last_exchange_s: float
    step_spread_s: float

    def describe(self) -> str:
        names = ("compute", "fixed", "straggler", "cycle", "allreduce")
        terms = " + ".join(f"{n} {getattr(self, f'predicted_{n}_s') * 1e3:.2f}" for n in names)
        return (
            f"N={self.n} ({self.network}): predicted efficiency {self.predicted_efficiency:.3f}, "
            f"measured {self.measured_efficiency:.3f}, error {self.relative_error:+.1%} "
            f"(step {self.predicted_step_s * 1e3:.2f} ms predicted = {terms} ms; "
            f"{self.measured_step_s * 1e3:.2f} ms measured, of which exchange "
            f"{self.measured_exchange_s * 1e3:.2f} ms (on the rank last to finish its work "
            f"{self.measured_last_exchange_s * 1e3:.2f}), straggler "
            f"{self.measured_straggler_s * 1e3:.2f} ms; the N=1 run's step-to-step spread "
            f"{self.step_spread_s * 1e3:.2f} ms)"
        )


def cycle_wait(
    gradient_bytes: float,
    cycle_s: float = HOROVOD_CYCLE_S,
    fusion_bytes: int = HOROVOD_FUSION_BYTES,
    n: int = 1,
) -> float:
    """Seconds the last of ``n`` ranks' gradients wait for Horovod's loops: half a cycle per
    fused round (ceil(gradient_bytes / fusion_bytes)) for its own, then once the lag of the
    latest loop, whose start ends the ranks' agreement (``RunLoopOnce``: each loop keeps its own
    phase). The other loops' starts uniform over the cycle after the first's, the last rank any
    of the n: cycle (n-1)/(2n) on average. n=1: one rank, or loops in phase."""
    if fusion_bytes <= 0 or n < 1:
        raise ValueError(f"fusion_bytes must be > 0 and n >= 1, got {fusion_bytes} and {n}")
    return (math.ceil(gradient_bytes / fusion_bytes) + (n - 1) / n) * cycle_s / 2


def straggler_wait(model: StepModel, n: int, mode: str) -> float:
    """Seconds the slowest of ``n`` ranks adds to the mean rank's step: E[max] - mean of the
    ranks' work b * e + r, r drawn per rank from the residuals' successive differences /
    sqrt(2) (their spread without the machine's drift, which all ranks share), centred, times
    1/n in strong scaling. e: the ranks' edges in epoch plans where they can be drawn
    (``straggler.planned_shares``), else
    independent draws: weak, e = E_k, an N=1 step's edges; strong, a rank's G/n graphs have
    the mean share and sqrt(1/n) of the spread, e = mean(E)/n + (E_k - mean(E))/sqrt(n)."""
    edges = np.asarray(model.edges)
    noise = _step_noise(model)
    noise = (noise - noise.mean()) / (n if mode == "strong" else 1)
    graphs = (model.graph_edges, model.graphs_per_step, model.sort_window)
    shares = planned_shares(*graphs, n, mode) if n > 1 else None
    if shares is not None:
        return planned_straggler(model.per_edge_s * shares, noise)
    if mode == "strong":
        edges = edges.mean() / n + (edges - edges.mean()) / math.sqrt(n)
    return independent_straggler(model.per_edge_s * edges, noise, n)


def predict_scaling(
    model: StepModel,
    network: NetworkModel,
    mode: str,
    ns: Sequence[int] = DEFAULT_NS,
    ceiling: float = 1.0,
) -> list[Prediction]:
    """One ``Prediction`` per N in ``ns`` for ``mode`` "strong" or "weak"; efficiencies against
    the model's own N=1 step, a + b mean(E) + the N=1 run's exchange. ``ceiling`` (0, 1]: t_alone /
    t_concurrent of ranks sharing a host as deployed (``bench distributed``'s "ceiling"): the
    per-rank compute, fixed cost and straggler are divided by it."""
    if not 0 < ceiling:
        raise ValueError(f"ceiling must be > 0 (t_alone / t_concurrent), got {ceiling}")
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    out, sizes = [], (model.gradient_bytes, model.cycle_s, model.fusion_bytes)
    for n in ns:
        slow = 1.0 if n == 1 else 1.0 / ceiling
        edges = float(np.mean(model.edges)) / (n if mode == "strong" else 1)
        compute, fixed = slow * model.per_edge_s * edges, slow * model.fixed_s
        straggler = slow * straggler_wait(model, n, mode) if n > 1 else 0.0
        allreduce = ring_allreduce_time(model.gradient_bytes, n, network)
        cycle = cycle_wait(*sizes, n) if n > 1 else model.exchange_s
        step = compute + fixed + straggler + cycle + allreduce
        modelled = efficiency(mode, model.step_s + model.exchange_s, step, n)
        out.append(Prediction(n, compute, fixed, straggler, cycle, allreduce, step, modelled))
    return out


def baseline_inputs(run: Run, also: Sequence[Run] = ()) -> StepModel:
    """The ``StepModel`` of a single-worker run, from its non-warm-up steps: least squares of
    the step without exchange (``total_s - exchange_s``) on the step's edges; gradient bytes
    from run.json (else 4 x num_params), Horovod's cycle from the recorded config
    (``distributed.horovod_cycle_time_ms``, else Horovod's default; none for other strategies)
    and fusion buffer Horovod's default (runs do not record it). The notes say what was taken
    for what. DataError without timed steps or size information.

    ``also``: more single-worker runs of the same model with other batches (a weak sweep's N=1
    beside a strong one's), whose steps join the fit: steps of one batch size span a narrow
    range of edges, over which the fixed cost a is not determined (its standard error is in the
    notes); the residuals stay those of ``run``'s own steps."""
    edges, work, exchange = _step_work(run)
    for other in (r for r in also if r.num_workers != 1):
        raise DataError(f"{other.path}: N={other.num_workers}; only single-worker runs can join "
                        "the fit of the step's cost")  # fmt: skip
    pairs = [(edges, work)] + [_step_work(other)[:2] for other in also]
    fixed, per_edge, notes = _fit_line(*(np.concatenate(p) for p in zip(*pairs)))
    if also:
        paths = ", ".join(str(r.path) for r in (run, *also))
        notes.insert(0, f"fixed and per-edge cost fitted on the steps of {len(also) + 1} "
                        f"single-worker runs ({paths})")  # fmt: skip
    if run.info.get("gradient_bytes"):
        gradient_bytes = int(run.info["gradient_bytes"])
    elif run.info.get("num_params"):
        gradient_bytes = 4 * int(run.info["num_params"])
        notes.append("gradient bytes taken as 4 x num_params (float32)")
    else:
        raise DataError(
            f"{run.path}/run.json has neither 'gradient_bytes' nor 'num_params': "
            "cannot size the allreduce"
        )
    distributed = (run.info.get("config") or {}).get("distributed") or {}
    cycle_ms = distributed.get("horovod_cycle_time_ms")
    if run.info.get("strategy") not in (None, "horovod"):
        cycle_s = 0.0
        notes.append(f"no Horovod cycle: the runs used strategy '{run.info['strategy']}'")
    elif cycle_ms is None:
        cycle_s = HOROVOD_CYCLE_S
        notes.append(
            f"Horovod cycle: not in run.json, Horovod's default {HOROVOD_CYCLE_S * 1e3:g} ms"
        )
    else:
        cycle_s = float(cycle_ms) * 1e-3
    notes.append(
        f"fusion buffer: Horovod's default {HOROVOD_FUSION_BYTES // 2**20} MiB "
        "(runs do not record HOROVOD_FUSION_THRESHOLD)"
    )
    residuals = tuple(work - (fixed + per_edge * edges))
    graph_edges, window = training_graphs(run, notes)
    graphs = max(1, round(float(_timed_steps(run)["graphs"].median())))
    return StepModel(fixed, per_edge, tuple(edges), residuals, gradient_bytes, cycle_s,
                     HOROVOD_FUSION_BYTES, exchange, tuple(notes), graph_edges, graphs, window)  # fmt: skip


def step_spread(model: StepModel) -> float:
    """The N=1 run's step-to-step spread: the standard deviation of a step's time without
    exchange around the fit on its edges, estimated from the residuals' successive differences
    / sqrt(2) (without the machine's slower drift): ``straggler_wait``'s draws before it scales
    them to a rank's share (1/N in strong scaling). Two ranks whose steps each vary by s wait
    for each other about 2 s / sqrt(pi) a step (E|r1 - r2|, r normal)."""
    return float(np.std(_step_noise(model)))


def validate_against(
    runs: Sequence[Run],
    mode: str,
    network: NetworkModel = PRESETS["shared-memory"],
    ceilings: Mapping[int, float] | None = None,
    also: Sequence[Run] = (),
) -> list[Validation]:
    """One ``Validation`` per run with N > 1 of a sweep (by N), predicted from its N=1 run (which
    ``runs`` must hold) over ``network``, the link the measured runs used. ``ceilings``: the
    ceiling (see ``predict_scaling``) by ranks per host; a run's ranks per host is run.json's
    ``local_size`` (1 when absent); a count not in ``ceilings`` gets 1.0. ``also``: more
    single-worker runs for the fit of the step's cost (``baseline_inputs``)."""
    baseline, *others = sorted(runs, key=lambda r: r.num_workers)
    model = baseline_inputs(baseline, also)
    t1 = float(np.median(step_times(baseline)))
    out = []
    for run in others:
        n = run.num_workers
        ceiling = (ceilings or {}).get(int(run.info.get("local_size") or 1), 1.0)
        (pred,) = predict_scaling(model, network, mode, ns=(n,), ceiling=ceiling)
        tn = float(np.median(step_times(run)))
        measured = efficiency(mode, t1, tn, n)
        exchange = float(np.median(step_times(run, "exchange_s")))
        terms = (pred.compute_s, pred.fixed_s, pred.straggler_s, pred.cycle_s, pred.allreduce_s)
        error = (pred.efficiency - measured) / measured
        fields = (pred.step_s, tn, pred.efficiency, measured, error, *terms, exchange)
        waits = (_measured_straggler(run), _last_rank_exchange(run), step_spread(model))
        out.append(Validation(n, network.name, *fields, *waits))
    return out


# ------------------------------------------------------------------------------ internals
def _step_work(run: Run) -> tuple[np.ndarray, np.ndarray, float]:
    """(edges, seconds without exchange) of the run's non-warm-up steps (slowest rank), and
    their median exchange."""
    steps = _timed_steps(run)
    edges = steps["edges"].to_numpy(dtype=np.float64)
    work = (steps["total_s"] - steps["exchange_s"]).to_numpy(dtype=np.float64)
    return edges, work, float(steps["exchange_s"].median())


def _frame(records: Sequence[object], kind: type) -> pd.DataFrame:
    columns = [f.name for f in dataclasses.fields(kind)]
    return pd.DataFrame([vars(r) for r in records], columns=columns)


def _slowest_steps(run: Run) -> pd.DataFrame:
    """One row per (epoch, step), in order: the slowest rank's times, the ranks' graphs and
    edges summed, warm if any rank was."""
    steps = _frame(run.steps, StepTiming).astype({"warmup": bool})
    return steps.groupby(["epoch", "step"]).agg(
        {**dict.fromkeys(STEP_FIELDS, "max"), "graphs": "sum", "edges": "sum", "warmup": "any"}
    )


def _timed_steps(run: Run) -> pd.DataFrame:
    """``_slowest_steps`` but the warm-up ones; DataError naming the run when none is left."""
    steps = _slowest_steps(run)
    steps = steps[~steps["warmup"]]
    if steps.empty:
        raise DataError(
            f"{run.path}: no non-warm-up steps in timing.jsonl (N={run.num_workers}); run more "
            "steps than scaling.timing_warmup_steps"
        )
    return steps


def _whole_epochs(run: Run) -> pd.DataFrame:
    epochs = _frame(run.epochs, EpochTiming)
    full = run.info.get("steps_per_epoch")
    return epochs if full is None else epochs[epochs["steps"] == full]


def _after_warmup(values, warmup_epochs: int):
    """``values`` without the first ``warmup_epochs`` entries, unless that leaves none."""
    return values[warmup_epochs:] if len(values) > warmup_epochs else values


def _fit_line(edges: np.ndarray, work: np.ndarray) -> tuple[float, float, list[str]]:
    """(a, b, notes) of work ~ a + b * edges by least squares, both >= 0: through the origin
    when the fit gives a negative term, all of it per edge when the edges do not vary."""
    if np.ptp(edges) == 0 or edges.size < 2:
        note = (
            "the N=1 run's steps all have the same edges: the fixed per-step cost cannot be told "
            "from the per-edge cost, so all compute is taken as shrinking with the batch"
        )
        return 0.0, float(work.mean() / edges.mean()), [note]
    (per_edge, fixed), cov = np.polyfit(edges, work, 1, cov="unscaled")
    residual = work - (fixed + per_edge * edges)
    dof = edges.size - 2
    error = float(np.sqrt(cov[1, 1] * residual @ residual / dof)) if dof > 0 else math.inf
    notes = []
    if dof > 0 and error > 0.1 * work.mean():
        notes.append(
            f"the fixed cost a = {fixed * 1e3:.3g} ms has a standard error of {error * 1e3:.3g} "
            f"ms over these steps' {edges.min():,.0f}-{edges.max():,.0f} edges: not determined "
            "by them, and the prediction's fixed and compute terms trade places with it; fit "
            "on runs of two batch sizes (scaling predict --fit-also)"
        )
    if fixed >= 0 and per_edge >= 0:
        return float(fixed), float(per_edge), notes
    notes.append(
        f"the fit of step time on edges gave a = {fixed * 1e3:.3g} ms, b = {per_edge:.3g} s/edge;"
        " a negative term is noise: fitted through the origin instead (no fixed cost)"
    )
    return 0.0, float(np.dot(edges, work) / np.dot(edges, edges)), notes


def _step_noise(model: StepModel) -> np.ndarray:
    """The residuals' successive differences / sqrt(2) (one zero without two residuals)."""
    residuals = np.asarray(model.residuals_s)
    return np.diff(residuals) / math.sqrt(2) if residuals.size > 1 else np.zeros(1)


def _ranks_steps(run: Run) -> pd.DataFrame:
    """Every rank's record of the steps no rank marked warm-up, "work" its time without
    exchange."""
    steps = _frame(run.steps, StepTiming).astype({"warmup": bool})
    steps["work"] = steps["total_s"] - steps["exchange_s"]
    return steps[~steps.groupby(["epoch", "step"])["warmup"].transform("any")]


def _last_rank_exchange(run: Run) -> float:
    """Median over non-warm-up steps (NaN without any) of the exchange of the rank whose time
    without exchange was the longest (on a tie, the rank whose record comes first)."""
    steps = _ranks_steps(run)
    last = steps.groupby(["epoch", "step"])["work"].idxmax()
    return float(steps.loc[last, "exchange_s"].median())


def _measured_straggler(run: Run) -> float:
    """Median over non-warm-up steps (NaN without any) of the slowest rank's time without
    exchange minus the ranks' mean."""
    work = _ranks_steps(run).groupby(["epoch", "step"])["work"]
    return float((work.max() - work.mean()).median())
