"""Memory of the training step that ``bench model`` times: a fresh process per size.

    python -m hvdtrack.bench model --memory --nodes 1250 5000 20000 80000 --edges 10000 40000 160000 640000
    python -m hvdtrack.bench model --memory --nodes 5000 20000 80000 125000 --edges 40000 160000 640000 1000000 --plot docs/memory_per_edge.png
    python -m hvdtrack.bench model --memory-budget 4GiB --set model.recompute=true

``--memory`` measures each size in a fresh process (``probe``; the allocator keeps what it once
held): the growth of the resident set over the first step and TensorFlow's allocator peak over a
later one, printed as a table headed by the model's configuration. ``--plot PATH`` measures every
size twice, as configured and with ``model.recompute`` flipped (so both "plain" and "recompute"
appear; plain also turns ``model.offload`` and ``model.keep_edge_term`` off, which need
recompute), prints both tables and draws both in one PNG: KiB per edge (RSS growth solid,
allocator peak dashed) against edges.
With ``--breakdown`` each probe also lists the tensors held at the allocator's peak of a later
step, by shape (``hvdtrack.bench.profile.live_at_peak``): what the figure is made of.
``--memory-budget`` bisects the edge count (nodes = edges / 8) for the largest graph whose step
keeps the process's peak resident set within the budget (its probes run the first step only).
Each probe runs with training's allocator for its model (``hvdtrack.entry.choose_allocator``):
with ``model.recompute`` (memory first, without ``model.keep_edge_term``) the system allocator,
which keeps no figures (allocator peak "-", no ``--breakdown`` tensors) unless
``TF_CPU_ALLOCATOR_USE_BFC=true`` is set. ``--json PATH`` keeps every figure (with ``--plot``:
``{"series": {"plain": {config, records}, "recompute": {...}}}``).

Public symbols: ``parse_bytes``, ``probe``, ``measure_memory``, ``memory_table``,
``largest_graph``, ``training_caveat``, ``memory_per_edge_png``.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Optional, Sequence

from hvdtrack.bench.workload import (
    EDGES_PER_NODE,
    build_step,
    run_config,
    step_fn,
    synthetic_graph,
    time_calls,
    write_figures,
)
from hvdtrack.entry import allocator_in_use
from hvdtrack.errors import ConfigError, HvdtrackError

MODES = ("plain", "recompute")  # the plot's series, by model.recompute false / true


def parse_bytes(text: str) -> int:
    """``"4GiB"`` -> 4294967296; units B, KiB, MiB, GiB, TiB (powers of 1024) and kB, MB, GB, TB."""
    units = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    units.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})
    number = text.strip().rstrip("BbIiKkMmGgTt")
    unit = text.strip()[len(number) :].lower()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size like 4GiB or 512MiB") from None
    if unit not in units or value <= 0:
        raise ValueError(f"{text!r} is not a size like 4GiB or 512MiB")
    return int(value * units[unit])


def probe(args: argparse.Namespace) -> int:
    """One size (``args.nodes[0]``, ``args.edges[0]``) in this fresh process: prints one JSON line
    of memory figures (bytes; seconds)."""
    import tensorflow as tf

    from hvdtrack.utils.memory import device_peak_bytes, peak_rss_bytes, reset_peak, rss_bytes

    trainer = build_step(args)
    graphs, labels = synthetic_graph(args.nodes[0], args.edges[0], args.seed)
    step = step_fn(trainer, graphs, labels)
    before = rss_bytes()
    reset_peak()
    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    first_peak = peak_rss_bytes()
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    first_allocator_peak = device_peak_bytes(device)  # since the start: the first step's
    timing = None
    if args.repeats:  # the allocator's peak of a later step (else: since the start)
        if first_allocator_peak is not None:  # None: an allocator without figures (the system's)
            tf.config.experimental.reset_memory_stats(device)
        timing = time_calls(step, 0, args.repeats)
    record = dict(
        nodes=args.nodes[0],
        edges=args.edges[0],
        rss_before=before,
        rss_growth=first_peak - before,
        peak_rss=max(first_peak, peak_rss_bytes()),
        allocator_peak=device_peak_bytes(device),
        first_allocator_peak=first_allocator_peak,
        first_step_s=first_s,
        step_s=timing.median if timing else first_s,
        keep_edge_term=trainer.config.model.keep_edge_term,
        allocator=allocator_in_use(),
    )
    if args.breakdown:  # after the figures above: the profiled steps do not change them
        from hvdtrack.bench.profile import live_at_peak

        record["live_at_peak"] = live_at_peak(step)
    print(json.dumps(record))
    return 0


def measure_memory(
    args: argparse.Namespace, num_nodes: int, num_edges: int, kill_above: Optional[int] = None
) -> Optional[dict]:
    """Runs ``--probe`` for one size in a fresh process; None when it ran out of memory or its
    resident set passed ``kill_above`` bytes (it is then stopped at once, and only the first
    step runs: the allocator's peak is then that step's)."""
    from hvdtrack.utils.memory import rss_bytes

    repeats = "1" if kill_above is None else "0"
    command = [sys.executable, "-m", "hvdtrack.bench", "model", "--probe", "--repeats", repeats]
    sizes = dict(nodes=num_nodes, edges=num_edges, threads=args.threads, seed=args.seed)
    command += [x for key, value in sizes.items() for x in (f"--{key}", str(value))]
    command += ["--breakdown"] if getattr(args, "breakdown", False) else []
    command += [f"--set={s}" for s in args.overrides]
    # The budget, for model.keep_edge_term: auto (the probe resolves it for its size, as
    # training does for its graphs; ``workload.run_config``).
    budget = getattr(args, "memory_budget", None) if kill_above is None else kill_above
    command += [] if budget is None else ["--memory-budget", str(budget)]
    if args.config:
        command += ["--config", args.config]
    # Output to files, not pipes: a probe blocked on a full pipe would never end.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        while process.poll() is None:
            if kill_above is not None and (rss_bytes(process.pid) or 0) > kill_above:
                process.kill()
                process.wait()
                return None
            time.sleep(0.1)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        if process.returncode < 0 or "OOM" in stderr or "MemoryError" in stderr:
            return None  # killed (the kernel's OOM killer) or out of memory
        raise HvdtrackError(f"memory probe failed: {stderr.strip().splitlines()[-1:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def memory_table(args: argparse.Namespace) -> int:
    """``--memory``: one table per mode (with ``args.plot``: both modes, and the PNG)."""
    from hvdtrack import configtools

    runs = [args]
    if args.plot:
        model = run_config(args).model
        flip = ["model.recompute=false"] if model.recompute else ["model.recompute=true"]
        for key in ("offload", "keep_edge_term"):  # need recompute: plain runs without them
            if getattr(model, key):
                flip.append(f"model.{key}=false")
        runs.append(argparse.Namespace(**{**vars(args), "overrides": args.overrides + flip}))
    series = {}
    for i, run in enumerate(runs):
        config = run_config(run)
        print("\n" if i else "", end="")
        series[MODES[config.model.recompute]] = dict(
            config=configtools.to_mapping(config), records=_table(run, config.model)
        )
    if not args.plot:
        write_figures(args.json, series.popitem()[1])
        return 0
    series = {mode: series[mode] for mode in MODES}
    write_figures(args.json, dict(series=series))
    config = run_config(args)
    records = {mode: s["records"] for mode, s in series.items()}
    png = memory_per_edge_png(records, _title(config.name, config.model))
    from hvdtrack.utils.io import atomic_write

    with atomic_write(args.plot, "wb") as f:
        f.write(png)
    print(f"plot written to {args.plot}")
    return 0


def _table(args: argparse.Namespace, model) -> list[dict]:
    print(f"model: {model}\npeak memory of one training step, a fresh process per size")
    print(f"{'nodes':>8} {'edges':>9} {'RSS growth MiB':>15} {'allocator peak MiB':>19} "
          f"{'peak RSS MiB':>13} {'step s':>7}" + ("  recomputed" if model.recompute else ""))  # fmt: skip
    records = []
    for num_nodes, num_edges in zip(args.nodes, args.edges):
        r = measure_memory(args, num_nodes, num_edges)
        if r is None:
            print(f"{num_nodes:>8} {num_edges:>9}  out of memory", flush=True)
            continue
        print(
            f"{num_nodes:>8} {num_edges:>9} {_mib(r['rss_growth']):>15} "
            f"{_mib(r['allocator_peak']):>19} {_mib(r['peak_rss']):>13} {r['step_s']:>7.2f}"
            + (f"  {_first(r)}" if model.recompute else ""),
            flush=True,
        )
        if "live_at_peak" in r:
            _print_live(r["live_at_peak"])
        records.append(r)
    return records


def _first(record: dict) -> str:
    """How a probe's recomputed step ran: speed first (``model.keep_edge_term`` true, as
    given or resolved from auto for its size) or memory first."""
    return "speed first" if record["keep_edge_term"] is True else "memory first"


def _print_live(live: dict) -> None:
    """``--breakdown``: the tensors held at the allocator's peak, by shape."""
    from hvdtrack.bench.profile import shape_groups

    if not live["tensors"]:
        print(f"{'':>19}no tensors recorded: only the caching allocator records them (this step "
              f"ran with the system allocator; TF_CPU_ALLOCATOR_USE_BFC=true to see them)")  # fmt: skip
        return
    unsplit = live["allocated"] - live["requested"]
    print(f"{'':>19}held at the allocator's peak: {_mib(live['allocated'])} MiB in "
          f"{len(live['tensors'])} tensors ({_mib(unsplit)} MiB given beyond the requests)")  # fmt: skip
    for shape, count, requested, allocated in shape_groups(live["tensors"]):
        print(f"{'':>21}{count:>4} x {shape:<16} {_mib(requested):>7} MiB ({_mib(allocated)} held)")


def _title(name: str, model) -> str:
    layers = f"latents {model.node_encoder[-1]}/{model.edge_encoder[-1]} (node/edge)"
    extras = [x for x, on in [("layer norm", model.layer_norm),
              ("factorized edge update", model.factorized_edge_update)] if on]  # fmt: skip
    details = ", ".join([f"{model.num_message_passing_steps} steps", layers, *extras])
    return f"training step of the {name} model: {details}, {model.precision}"


def memory_per_edge_png(series: dict[str, Sequence[dict]], title: str) -> bytes:
    """One figure, PNG bytes: KiB per edge against edges (log axis), one colour per mode.

    Args:
      series: mode ("plain", "recompute") -> ``measure_memory`` records; each record's RSS
        growth / edges is drawn solid, its allocator peak / edges dashed (None values left out).
      title: the figure's title (names the model).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    colours = {"plain": "C0", "recompute": "C1"}
    for mode, records in series.items():
        for key, style, what in [("rss_growth", "-", "RSS growth"),
                                 ("allocator_peak", "--", "allocator peak")]:  # fmt: skip
            points = [(r["edges"], r[key] / r["edges"] / 2**10) for r in records if r[key]]
            if points:
                x, y = zip(*points)
                ax.plot(x, y, style, color=colours.get(mode), marker="o", label=f"{mode}: {what}")
    ax.set(xscale="log", xlabel="edges of the graph", ylabel="KiB per edge", ylim=(0, None))
    ax.set_title(textwrap.fill(title, 90), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def training_caveat(allocator: str) -> Optional[str]:
    """What a bisection's figure does not say about training under ``allocator`` ("caching" or
    "system", as ``entry.allocator_in_use`` names it), or None."""
    if allocator != "caching":
        return None
    return (
        "note: one step on graphs of one size. Training over graphs of many sizes holds more "
        "with the caching allocator, whose pool keeps blocks of the sizes it served "
        '(docs/performance.md, "`full.yaml`\'s own 8 x 2 sections"); the system allocator '
        "(TF_CPU_ALLOCATOR_USE_BFC=false) stays near this figure, at a slower step"
    )


def largest_graph(args: argparse.Namespace) -> int:
    """``--memory-budget``: bisects edges (nodes = edges / 8) for the largest step whose peak RSS
    fits ``args.memory_budget`` bytes; prints and keeps it."""
    from hvdtrack import configtools

    budget = args.memory_budget
    recompute = run_config(args).model.recompute
    print(f"largest graph whose training step's peak RSS fits {budget / 2**30:.2f} GiB")

    def fits(num_edges: int) -> Optional[dict]:
        r = measure_memory(args, max(1, num_edges // EDGES_PER_NODE), num_edges, budget)
        ok = r is not None and r["peak_rss"] <= budget
        peak = "over budget, stopped" if r is None else f"peak RSS {_mib(r['peak_rss'])} MiB"
        if r is not None and recompute:
            peak += f" ({_first(r)})"
        print(f"  {num_edges:>9} edges: {peak} -> {'fits' if ok else 'too big'}", flush=True)
        return r if ok else None

    low, high, best = 0, 10_000, None
    while (r := fits(high)) is not None:  # double until a size does not fit
        low, best, high = high, r, 2 * high
    while high - low > max(1000, low // 25):  # then bisect to 4%
        middle = (low + high) // 2
        if (r := fits(middle)) is not None:
            low, best = middle, r
        else:
            high = middle
    if best is None:
        raise ConfigError(
            f"--memory-budget: not even 10000 edges fit in {args.memory_budget} bytes"
        )
    how = f", {_first(best)}" if recompute else ""
    print(
        f"largest: {best['edges']} edges, {best['nodes']} nodes (peak RSS {_mib(best['peak_rss'])} "
        f"MiB, step {best['step_s']:.2f} s{how}); {high} edges do not fit"
    )
    if (caveat := training_caveat(best["allocator"])) is not None:
        print(caveat)
    sized = argparse.Namespace(**{**vars(args), "nodes": [best["nodes"]], "edges": [best["edges"]]})
    config = configtools.to_mapping(run_config(sized))
    write_figures(args.json, dict(config=config, records=[best]))
    return 0
