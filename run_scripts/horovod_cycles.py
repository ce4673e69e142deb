"""The wait in each training step's gradient exchange, read from a Horovod timeline.

    HOROVOD_TIMELINE=tl.json HOROVOD_TIMELINE_MARK_CYCLES=1 horovodrun -np 2 \\
        python -m hvdtrack.train --config configs/default.yaml train.run_dir=runs/tl ...
    .venv/bin/python run_scripts/horovod_cycles.py tl.json runs/tl [--steps]

Horovod's coordinator (rank 0) writes the timeline: for every tensor its negotiation (from the
first rank's request to the last's), then the allreduce and its copies in and out of the fusion
buffer, and with HOROVOD_TIMELINE_MARK_CYCLES=1 the start of each cycle of rank 0's background
loop. Each rank's loop sleeps until its own last start + the cycle (``RunLoopOnce``), and the
ranks agree on what is ready in a collective of every cycle, which ends when the rank whose loop
starts latest joins it: the loops keep their phases, and the agreement comes some time after
rank 0's cycle starts. The script reads, for each step's exchange (the grouped allreduce of the
``gradients_*`` tensors, the k-th one for the k-th step of the run's ``timing.jsonl``):

- **lag**: from the start of rank 0's cycle to the agreement, the lag of the latest loop behind
  rank 0's (near 0 when rank 0's loop is the latest);
- **allreduce**: from the agreement to the last copy out of the fusion buffer;
- from ``timing.jsonl``: the rank that finished its work last (the one that waits for no other)
  and its exchange, and that exchange without the allreduce: the wait for the loops and the
  exchange's own work;
- at N = 2 and cycles of ``SPLIT_CYCLE_MS`` or more, whether the last rank waited for the
  other's loop: rank 0 when the lag is ``LATEST_MS`` or more (the other loop is behind), rank 1
  when it is less (rank 0's is).

It prints these per rank finishing last (steps any rank marked warm-up left out), beside the
model's cycle wait (``hvdtrack.scaling.maths.cycle_wait``): half a cycle for the last rank's own
loop, and at N ranks the latest loop's lag, cycle (N-1)/(2N) on average. A timeline of a run
that was resumed, or of more than one run, does not pair with its steps: refused. Horovod may
shut down before writing the last exchanges (up to ``UNWRITTEN``): those steps are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hvdtrack.errors import DataError  # noqa: E402
from hvdtrack.runs.timing import Run, read_run  # noqa: E402
from hvdtrack.scaling.maths import cycle_wait  # noqa: E402

GRADIENTS = "gradients_"  # the step's grouped allreduce (HorovodWorkers.reduce_gradients)
SAME_EXCHANGE_US = 1000  # negotiations of one exchange end in one cycle, microseconds apart
PARTIAL_TRIES = 100  # records cut from the end of a timeline before it counts as unreadable
UNWRITTEN = 2  # Horovod may stop before writing the last exchanges' records: those steps go
LATEST_MS = 1.5  # an agreement this soon after rank 0's cycle start: rank 0's loop is the latest
SPLIT_CYCLE_MS = 5 * LATEST_MS  # shorter cycles: lags too near LATEST_MS to tell the loops


def read_timeline(path: Path) -> list[dict]:
    """The events of a Horovod timeline. Horovod leaves the JSON array open while it writes,
    and a job that ends mid-write leaves a partial last record: it is dropped."""
    try:
        text = path.read_text().rstrip().rstrip(",")
    except OSError as err:
        raise DataError(f"{path}: cannot read the timeline ({err.strerror})") from None
    end, first_error, events = len(text), None, None
    for _ in range(PARTIAL_TRIES):  # cut back to a complete record, a '}' at a time
        try:
            events = json.loads(text[:end].rstrip().rstrip(",").rstrip("]") + "]")
            break
        except ValueError as err:
            first_error = first_error or err
            end = text.rfind("}", 0, end - 1) + 1
            if end <= 0:
                break
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise DataError(f"{path}: not a Horovod timeline (a JSON array of events): {first_error}")
    return events


def exchanges(events: list[dict], path: Path) -> tuple[pd.DataFrame, float]:
    """One row per gradient exchange, in order: ``lag_ms`` and ``allreduce_ms``; and the
    median period of rank 0's loop (ms)."""
    try:
        return _exchanges(events, path)
    except (KeyError, TypeError) as err:
        raise DataError(f"{path}: not a Horovod timeline (an event without {err})") from None


def _exchanges(events: list[dict], path: Path) -> tuple[pd.DataFrame, float]:
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})
    }
    cycles = np.array(sorted(e["ts"] for e in events if e.get("name") == "CYCLE_START"))
    if cycles.size < 2:
        raise DataError(f"{path}: no cycle marks - run with HOROVOD_TIMELINE_MARK_CYCLES=1")
    open_spans, spans = {}, []  # per pid the stack of begun spans; (name, pid, begin, end)
    for e in events:
        if e.get("ph") == "B":
            open_spans.setdefault(e["pid"], []).append(e)
        elif e.get("ph") == "E" and open_spans.get(e["pid"]):
            begun = open_spans[e["pid"]].pop()
            spans.append((begun["name"], e["pid"], begun["ts"], e["ts"]))
    ours = [s for s in spans if names.get(s[1], "").startswith(GRADIENTS)]
    agreed = sorted((s[3], s[1]) for s in ours if s[0] == "NEGOTIATE_ALLREDUCE")
    if not agreed:
        raise DataError(
            f"{path}: no allreduce of {GRADIENTS}* tensors, the training step's gradients (an "
            "Adasum run names them otherwise)"
        )
    pending: dict[int, list[float]] = {}  # per pid its agreements not yet followed by a reduce
    for t, pid in reversed(agreed):
        pending.setdefault(pid, []).append(t)  # the earliest last: popped first
    reduced = {}  # (agreement, pid) -> end of the allreduce that followed it
    for name, pid, begin, end in sorted(ours, key=lambda s: s[2]):
        queue, before = pending.get(pid, []), None
        while name == "ALLREDUCE" and queue and queue[-1] <= begin:
            before = queue.pop()
        if before is not None:
            reduced[(before, pid)] = end
    groups: list[list[tuple[float, int]]] = []  # one per exchange: its tensors' agreements
    for t, pid in agreed:
        if groups and t - groups[-1][-1][0] < SAME_EXCHANGE_US:
            groups[-1].append((t, pid))
        else:
            groups.append([(t, pid)])
    rows = []
    for members in groups:
        t = max(m[0] for m in members)
        start = cycles[np.searchsorted(cycles, t, side="right") - 1] if t >= cycles[0] else np.nan
        ends = [reduced[m] for m in members if m in reduced]
        done = max(ends) if ends else np.nan
        rows.append({"lag_ms": (t - start) / 1e3, "allreduce_ms": (done - t) / 1e3})
    period_ms = float(np.median(np.diff(cycles))) / 1e3
    return pd.DataFrame(rows, columns=["lag_ms", "allreduce_ms"]), period_ms


def last_ranks(run: Run) -> pd.DataFrame:
    """Per step of the run, in order: the rank whose work (step without exchange) took longest,
    its exchange (ms) and whether any rank marked the step warm-up."""
    steps = pd.DataFrame([vars(s) for s in run.steps])
    if steps.empty:
        raise DataError(f"{run.path}: no steps in timing.jsonl")
    steps["work"] = steps["total_s"] - steps["exchange_s"]
    steps = steps.sort_values(["epoch", "step", "rank"])
    last = steps.loc[steps.groupby(["epoch", "step"], sort=True)["work"].idxmax()]
    warm = steps.groupby(["epoch", "step"], sort=True)["warmup"].any().to_numpy()
    ranks = int(steps["rank"].nunique())
    return pd.DataFrame(
        {
            "last_rank": last["rank"].to_numpy(),
            "exchange_ms": last["exchange_s"].to_numpy() * 1e3,
            "warmup": warm,
        }
    ).assign(ranks=ranks)


def pair(timeline: Path, run_dir: Path) -> tuple[pd.DataFrame, float, int]:
    """The exchanges beside the steps they belong to (and the run's ``gradient_bytes``, 1 when
    not recorded, in column ``gradient_bytes``); the loop's period (ms); how many of the last
    steps have no record in the timeline. An exchange missing anywhere but at the end would
    shift the pairs: nothing in the two files can show it."""
    found, period = exchanges(read_timeline(timeline), timeline)
    run = read_run(run_dir)
    steps = last_ranks(run)
    if not 0 <= len(steps) - len(found) <= UNWRITTEN:
        raise DataError(
            f"{timeline} holds {len(found)} gradient exchanges, {run_dir} {len(steps)} steps: "
            "the timeline of one fresh run (train.resume=false) pairs with its steps"
        )
    both = pd.concat([steps.iloc[: len(found)].reset_index(drop=True), found], axis=1)
    both["before_ms"] = both["exchange_ms"] - both["allreduce_ms"]
    both["gradient_bytes"] = int(run.info.get("gradient_bytes") or 1)
    if both["ranks"].iloc[0] == 2 and period >= SPLIT_CYCLE_MS:
        both["waits_for_other"] = (both["last_rank"] == 0) == (both["lag_ms"] >= LATEST_MS)
    return both, period, len(steps) - len(found)


def report(both: pd.DataFrame, period_ms: float) -> list[str]:
    """The summary lines (steps any rank marked warm-up left out)."""
    timed = both[~both["warmup"]]
    n = int(both["ranks"].iloc[0])
    sizes = (int(both["gradient_bytes"].iloc[0]), period_ms * 1e-3)
    own, model = (cycle_wait(*sizes, n=k) * 1e3 for k in (1, n))
    lines = [
        f"{len(both)} exchanges, {len(timed)} after warm-up; {n} ranks; rank 0's loop every "
        f"{period_ms:.2f} ms",
        f"agreement after rank 0's cycle start (the latest loop's lag): mean "
        f"{timed['lag_ms'].mean():.2f} ms, median {timed['lag_ms'].median():.2f} ms",
        "rank last to finish | steps | its exchange | allreduce | exchange without it "
        "(ms, medians)",
    ]
    for rank, group in timed.groupby("last_rank"):
        lines.append(
            f"{rank:>19} | {len(group):>5} | {group['exchange_ms'].median():>12.2f} | "
            f"{group['allreduce_ms'].median():>9.2f} | {group['before_ms'].median():>8.2f}"
        )
    lines.append(
        f"{'all':>19} | {len(timed):>5} | {timed['exchange_ms'].median():>12.2f} | "
        f"{timed['allreduce_ms'].median():>9.2f} | {timed['before_ms'].median():>8.2f}"
    )
    if "waits_for_other" in timed:
        for waits, group in timed.groupby("waits_for_other"):
            seen = group[group["last_rank"] == 0]["lag_ms"]  # rank 1's lead is not in the file
            lines.append(
                f"the last rank {'waits for' if waits else 'does not wait for'} the other's "
                f"loop: {len(group)} step(s), its exchange without the allreduce "
                f"{group['before_ms'].mean():.2f} ms on average"
                + (
                    f" (rank 0's wait, the lag: {seen.mean():.2f} ms)"
                    if waits and seen.size
                    else ""
                )
            )
    elif n == 2:
        lines.append(f"no split by the other's loop: it needs a cycle of {SPLIT_CYCLE_MS:g} ms")
    lines.append(
        f"model (maths.cycle_wait): {own:.2f} ms for the last rank's own loop, {model:.2f} ms "
        f"with the latest loop's lag at N={n}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("timeline", type=Path, help="HOROVOD_TIMELINE's file")
    parser.add_argument("run_dir", type=Path, help="the run's train.run_dir")
    parser.add_argument("--steps", action="store_true", help="also print every step")
    args = parser.parse_args(argv)
    try:
        both, period, unwritten = pair(args.timeline, args.run_dir)
    except DataError as err:
        print(f"horovod_cycles: error: {err}", file=sys.stderr)
        return 2
    if args.steps:
        print(both.to_string(float_format="%.2f"))
    if unwritten:
        print(f"the timeline ends before the exchanges of the last {unwritten} step(s): left out")
    print("\n".join(report(both, period)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
