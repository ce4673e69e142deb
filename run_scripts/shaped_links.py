"""Times Horovod's gradient allreduce over shaped links and compares it with the ring model.

    .venv/bin/python run_scripts/shaped_links.py            # N = 2, 4, 8; bare, 1 and 10 Gbit/s
    .venv/bin/python run_scripts/shaped_links.py --ns 2,4 --rates none,1gbit --repeats 20
    .venv/bin/python run_scripts/shaped_links.py --rates none,10mbit,100mbit  # the exchange dominates
    .venv/bin/python run_scripts/shaped_links.py --gradient-bytes 16777216 --json out.json

As root: starts max(N) hosts with run_scripts/test_hosts.sh (network namespaces, an sshd each) and,
for each rate, shapes every host's outgoing link (the namespace end of its veth) with tbf ("none":
the bare veth), measures the link's one-way latency (half the median round trip of 1-byte TCP
messages from h1 to h2, Python at both ends), its goodput (what one TCP stream delivers from h1 to
h2, as iperf or osu_bw would measure a real link: the gradient's bytes, answered by one byte, median
of 5 after one) and its bidirectional goodput (h1 and h2 sending those bytes to each other at once,
as osu_bibw would), then for each N runs ``horovodrun -np N -H h1..hN --gloo`` over the hosts: every
rank allreduces a float32 tensor of the default model's gradient bytes (``model_gradient_bytes``:
what a default run's run.json records as ``gradient_bytes``, 484,356), or ``--gradient-bytes``,
``--warmup`` times untimed, then ``--repeats`` times, each after a barrier. An iteration takes its
slowest rank's time; the table shows the median, beside the model's ring allreduce
(``hvdtrack.scaling.network.ring_allreduce_time`` at that bandwidth and the measured latency), the
ring plus Horovod's cycle wait (``maths.cycle_wait``), and the ring at the measured goodput (TCP/IP
framing and the acknowledgements sharing the link take 4% of a shaped rate), and the ring at the
link's bidirectional goodput (both hosts sending the bytes to each other at once, as osu_bibw
measures a link and as a ring uses it), with their errors. With "none" among the rates, a second
table compares what shaping adds to the bare link's time with the ring's transfer term. The hosts
are stopped at the end, whatever happens (SIGINT and SIGTERM included).

The model has no term for the software floor (eager dispatch, Gloo, the TCP stack, ranks sharing
cores): the bare-veth rows measure it. On a machine with few cores every rank is a TensorFlow
process, so 8 ranks on 2 cores time the CPU's sharing as much as the link.

No added delay unless ``--delay-ms``: that needs tc's netem, which a kernel without
CONFIG_NET_SCH_NETEM refuses (tc's message is shown). ``--queue-ms`` is tbf's queue (its
latency, default 100 ms at the rate; 5 ms made the 10 Mbit/s allreduce slower, not faster, at
N = 4 and 8). ``--cycle-ms`` sets HOROVOD_CYCLE_TIME (Horovod 0.28.1's default: 1 ms).

``--phase``: when an allreduce starts within Horovod's cycle. ``barrier`` (the default): right
after the barrier, which itself ends as a cycle ends, so the allreduce waits about a whole cycle
before Horovod's loop takes it. ``random``: every rank then pauses the same time, uniform in
[0, cycle) and drawn from the iteration's number, so the allreduce starts at a random point of
the cycle, as a training step's gradients do when its compute ends (the model's "ring + cycle"
counts half a cycle, ``maths.cycle_wait`` with loops in phase, as idle ones stay; in training
the last rank also waits for the latest loop, ``run_scripts/horovod_cycles.py``). A long cycle
(``--cycle-ms 20``, the configs') on the bare link checks that term. ``--tensors model``:
instead of one tensor of the gradient's bytes, the default model's 28 variables with the step's
loss and weight sums and its requests (``step_tensors``), in one grouped allreduce in a compiled
function, as the training step exchanges them; the model's figures then take the variables'
bytes (``--gradient-bytes`` is refused).

Runs only when no test hosts are up (they belong to someone else then) and holds the test
sessions' lock (``/tmp/hvdtrack-hosts.lock``) throughout, so test sessions wait for it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "run_scripts/test_hosts.sh"
HOSTS_DIR = Path(os.environ.get("HVDTRACK_HOSTS_DIR", "/tmp/hvdtrack-hosts"))
LOCK = HOSTS_DIR.with_name(HOSTS_DIR.name + ".lock")  # the one tests/hosts.py uses
INTERFACE = "hvdt0"  # inside every host's namespace (test_hosts.sh)
TENSORS = {"one": "one tensor", "model": "as the step (the model's tensors, grouped, compiled)"}
PHASES = {"barrier": "after a barrier", "random": "at a random point of the cycle"}  # --phase
RATES_GBIT = {
    "none": math.inf,
    "10mbit": 0.01,
    "100mbit": 0.1,
    "1gbit": 1.0,
    "10gbit": 10.0,
}  # none: bare veth


def step_tensors(tf) -> list:
    """Tensors of the training step's exchange bytes (``--tensors model``, the default exact
    sums; ``TrainStep`` has passed the gradients as one vector since 2026-12-03, the same bytes
    in 4 tensors): the packaged default model's variables, created as
    ``TrainState`` creates them, then the loss and weight sums (scalars) and the requests
    vector (``step.REQUESTS``: stop, checkpoint)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from hvdtrack.config import load_config, resolve_config_path
    from hvdtrack.inputs.pipeline import placeholder_graph
    from hvdtrack.model.classifier import SegmentClassifier
    from hvdtrack.train.step import REQUESTS

    model = SegmentClassifier(load_config(resolve_config_path(None)).model)
    model(placeholder_graph())
    variables = [tf.ones(v.shape, v.dtype) for v in model.trainable_variables]
    return variables + [tf.ones([]), tf.ones([]), tf.ones([len(REQUESTS)])]


def model_gradient_bytes() -> int:
    """The packaged default model's gradient bytes (its variables'), as run.json records them;
    no run needed."""
    import tensorflow as tf

    return sum(t.shape.num_elements() * t.dtype.size for t in step_tensors(tf)[:-3])


def worker(
    out_dir: str, num_bytes: int, warmup: int, repeats: int, pause_s: float, tensors: str
) -> None:
    """One rank: times ``repeats`` allreduces after ``warmup``, each after a barrier and a pause
    uniform in [0, pause_s), the same on every rank (``--phase random``; 0: none), of one
    float32 tensor of ``num_bytes`` (``tensors`` "one", eager) or of ``step_tensors`` in one
    grouped allreduce in a compiled function, as ``HorovodWorkers.reduce_gradients`` makes it
    in the step ("model"). Writes OUT_DIR/rank{r}.json: the seconds of each timed allreduce,
    the pauses, the number of tensors and the first element of the last sum."""
    import random

    import horovod.tensorflow as hvd
    import tensorflow as tf

    if tensors not in TENSORS:
        raise SystemExit(f"--worker: tensors must be one of {', '.join(TENSORS)}, got {tensors!r}")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    if tensors == "model":
        parts = step_tensors(tf)
        grouped = tf.function(lambda *g: hvd.grouped_allreduce(list(g), op=hvd.Sum))

        def allreduce():
            return grouped(*parts)[0]

    else:
        parts = [tf.ones([num_bytes // 4], tf.float32)]

        def allreduce():
            return hvd.allreduce(parts[0], op=hvd.Sum, name="gradient")

    token = tf.zeros([1])
    seconds, pauses = [], []
    for i in range(warmup + repeats):
        hvd.allreduce(token, op=hvd.Sum, name="barrier").numpy()  # every rank starts together
        pause = random.Random(i).uniform(0, pause_s) if pause_s > 0 else 0.0
        if pause:
            time.sleep(pause)  # the same on every rank
        begin = time.perf_counter()
        total = allreduce().numpy()
        if i >= warmup:
            seconds.append(time.perf_counter() - begin)
            pauses.append(pause)
    rank = hvd.rank()
    out = {"rank": rank, "seconds": seconds, "pauses": pauses, "tensors": len(parts)}
    out["sum"] = float(total.reshape(-1)[0])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))


def hosts_script(*args: str) -> str:
    env = {**os.environ, "HVDTRACK_HOSTS_DIR": str(HOSTS_DIR)}
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"test_hosts.sh {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def tc(namespace: str, *args: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"tc {' '.join(args)} in {namespace}: {done.stderr.decode().strip()}")


def shape(
    num_hosts: int, rate_gbit: float, delay_ms: float, burst_us: float, queue_ms: float
) -> None:
    """Every host's egress: tbf at ``rate_gbit`` (burst: ``burst_us`` at that rate, at least 2
    MTUs, so a 0.5 MB tensor is shaped rather than sent as one burst; a queue of ``queue_ms``
    at that rate, tbf's latency); netem ``delay_ms`` below it when > 0. An infinite rate: no
    qdisc (the bare veth)."""
    burst = max(int(rate_gbit * 1e9 / 8 * burst_us * 1e-6), 3000) if rate_gbit < math.inf else 0
    for i in range(1, num_hosts + 1):
        ns = f"hvdtrack-h{i}"
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", INTERFACE, "root"],
                       capture_output=True)  # fmt: skip
        if not burst:
            continue
        tc(ns, "qdisc", "add", "dev", INTERFACE, "root", "handle", "1:", "tbf",
           "rate", f"{rate_gbit:g}gbit", "burst", str(burst), "latency", f"{queue_ms:g}ms")  # fmt: skip
        if delay_ms > 0:
            tc(ns, "qdisc", "add", "dev", INTERFACE, "parent", "1:1", "handle", "10:",
               "netem", "delay", f"{delay_ms:g}ms", "limit", "100000")  # fmt: skip


PING_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)):
    c.sendall(b)
"""
PING_CLIENT = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], 5999))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
print(statistics.median(rtts[10:]))
"""


BULK_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); size = int(sys.argv[2])
while True:
    got = 0
    while got < size and (b := c.recv(1 << 20)):
        got += len(b)
    if got < size:
        break
    c.sendall(b"k")
"""
BULK_CLIENT = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], 5999)); payload = bytes(int(sys.argv[2])); times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(payload); c.recv(1); times.append(time.perf_counter() - t)
print(statistics.median(times[1:]))
"""

# Both ends at once, as osu_bibw measures a link: on a "g" from h1, each sends the bytes to the
# other while receiving the other's; the client times one exchange from its "g" until it has
# sent its bytes and received h2's.
BIDI_SERVER = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); size = int(sys.argv[2]); payload = bytes(size)
while c.recv(1):
    sender = threading.Thread(target=c.sendall, args=(payload,)); sender.start(); got = 0
    while got < size and (b := c.recv(min(1 << 20, size - got))):  # not the next "g"
        got += len(b)
    sender.join()
    if got < size:
        break
"""
BIDI_CLIENT = """
import socket, statistics, sys, threading, time
c = socket.create_connection((sys.argv[1], 5999)); size = int(sys.argv[2]); payload = bytes(size)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b"g")
    sender = threading.Thread(target=c.sendall, args=(payload,)); sender.start(); got = 0
    while got < size and (b := c.recv(min(1 << 20, size - got))):
        got += len(b)
    sender.join(); times.append(time.perf_counter() - t)
print(statistics.median(times[1:]))
"""


def between_h1_and_h2(addresses: list[str], server: str, client: str, *args: str) -> float:
    """Runs ``server`` on h2 and ``client`` on h1 (Python programs given h2's address and
    ``args``) and returns the number the client prints."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", "hvdtrack-h2", sys.executable, "-c", server, addresses[1], *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        server.stdout.readline()  # "ready"
        done = subprocess.run(
            ["ip", "netns", "exec", "hvdtrack-h1", sys.executable, "-c", client,
             addresses[1], *args],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    finally:
        server.wait(timeout=30)
    return float(done.stdout)


def link_latency_s(addresses: list[str], round_trips: int = 300) -> float:
    """Half the median round trip of 1-byte TCP messages from h1 to h2 (after 10)."""
    return between_h1_and_h2(addresses, PING_SERVER, PING_CLIENT, str(round_trips)) / 2


def link_goodput_gbit(addresses: list[str], num_bytes: int, latency_s: float) -> float:
    """What one TCP stream delivers from h1 to h2, as a bandwidth test (iperf, osu_bw) would
    measure a real link: ``num_bytes`` sent, answered by one byte, 6 times on one connection;
    the bytes over the median time less a round trip (the first time dropped: slow start)."""
    seconds = between_h1_and_h2(addresses, BULK_SERVER, BULK_CLIENT, str(num_bytes), "6")
    return num_bytes * 8 / (seconds - 2 * latency_s) / 1e9


def link_bidi_goodput_gbit(addresses: list[str], num_bytes: int, latency_s: float) -> float:
    """What each direction delivers while h1 and h2 send ``num_bytes`` to each other at once,
    as osu_bibw would measure a real link: the way a ring uses it, each host sending to one
    neighbour while receiving from the other (its egress carries its data and the
    acknowledgements of what it receives). Median of 5 after one, less a round trip."""
    seconds = between_h1_and_h2(addresses, BIDI_SERVER, BIDI_CLIENT, str(num_bytes), "6")
    return num_bytes * 8 / (seconds - 2 * latency_s) / 1e9


def time_allreduce(n: int, addresses: list[str], args: argparse.Namespace) -> list[float]:
    """Per timed iteration, the slowest rank's seconds."""
    env = {
        **os.environ,
        "PATH": f"{HOSTS_DIR / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
        + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOROVOD_CYCLE_TIME": f"{args.cycle_ms:g}",
    }
    with tempfile.TemporaryDirectory(prefix="shaped-links-") as out:
        hosts = ",".join(f"{a}:1" for a in addresses[:n])
        command = [str(Path(sys.executable).parent / "horovodrun"), "-np", str(n), "-H", hosts]
        command += ["--gloo", "--network-interface", INTERFACE, sys.executable, __file__]
        command += worker_args(out, args)
        job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if job.returncode != 0:
            raise SystemExit(
                f"horovodrun over {n} hosts failed:\n{job.stdout[-3000:]}{job.stderr[-3000:]}"
            )
        ranks = [json.loads(p.read_text())["seconds"] for p in sorted(Path(out).glob("rank*.json"))]
    if len(ranks) != n:
        raise SystemExit(f"{len(ranks)} of {n} ranks wrote their timings")
    return [max(column) for column in zip(*ranks)]


def worker_args(out_dir: str, args: argparse.Namespace) -> list[str]:
    """The script's arguments for one rank (``worker``'s, after ``--worker``) from the
    command line's: the pause is a whole cycle with ``--phase random``, else none."""
    pause_ms = args.cycle_ms if args.phase == "random" else 0
    sizes = [str(args.gradient_bytes), str(args.warmup), str(args.repeats)]
    return ["--worker", out_dir, *sizes, f"{pause_ms * 1e-3:g}", args.tensors]


@contextlib.contextmanager
def own_hosts(count: int):
    """The test hosts, started here and stopped at the end (signals included)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"{LOCK} is held: a test session is using the hosts; try later"
            ) from None
        if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(
            "hvdtrack-h"
        ):
            raise SystemExit("test hosts are up already (someone else's): not touching them")

        def stop(signum, frame):
            raise SystemExit(f"stopped by signal {signum}")

        old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(hosts_script("start", str(count)).strip(), flush=True)
            yield hosts_script("env")
        finally:
            print(hosts_script("stop").strip(), flush=True)
            for s, handler in old.items():
                signal.signal(s, handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ns", default="2,4,8", help="host counts (one rank each)")
    parser.add_argument("--rates", default="none,1gbit,10gbit", help=f"of {', '.join(RATES_GBIT)}")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added one-way delay (netem)")
    parser.add_argument(
        "--queue-ms", type=float, default=100.0, help="tbf's queue (latency), ms at the rate"
    )
    parser.add_argument("--burst-us", type=float, default=50.0, help="tbf burst, us at the rate")
    parser.add_argument("--gradient-bytes", type=int, help="default: the default model's")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--cycle-ms", type=float, default=1.0, help="HOROVOD_CYCLE_TIME")
    parser.add_argument(
        "--phase",
        choices=tuple(PHASES),
        default="barrier",
        help="an allreduce starts right after a barrier, or at a random point of the cycle",
    )
    parser.add_argument(
        "--sysctl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in every host's namespace, e.g. net.ipv4.tcp_slow_start_after_idle=0",
    )
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--tensors",
        choices=tuple(TENSORS),
        default="one",
        help="one tensor of --gradient-bytes (eager), or the default model's, as the step",
    )
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out, num_bytes, warmup, repeats, pause_s, tensors = args.worker
        worker(out, int(num_bytes), int(warmup), int(repeats), float(pause_s), tensors)
        return

    sys.path.insert(0, str(REPO))
    from hvdtrack.scaling import maths, network

    if args.tensors == "model" and args.gradient_bytes is not None:
        parser.error("--gradient-bytes: --tensors model sends the default model's own")
    args.gradient_bytes = args.gradient_bytes or model_gradient_bytes()
    ns = [int(n) for n in args.ns.split(",")]
    rates = [(r, RATES_GBIT[r]) for r in args.rates.split(",")]
    rows = []
    print(
        f"allreduce of {args.gradient_bytes:,} bytes (float32), HOROVOD_CYCLE_TIME "
        f"{args.cycle_ms:g} ms, started {PHASES[args.phase]}, {TENSORS[args.tensors]}, "
        f"median of {args.repeats} after {args.warmup} warm-up; "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    header = f"{'N':>3} {'bandwidth':>9} {'latency':>8} {'measured ms':>11} {'ring ms':>8} "
    header += f"{'err':>7} {'ring+cycle ms':>13} {'err':>7} {'goodput':>9} {'ring@gp ms':>10} "
    header += f"{'err':>7} {'bibw':>9} {'ring@bibw':>10} {'err':>7}"
    with own_hosts(max(ns)) as env_lines:
        addresses = next(
            line.split("=", 1)[1].strip("'").split()
            for line in env_lines.splitlines()
            if line.startswith("HVDTRACK_HOSTS_ADDRESSES=")
        )
        for setting in args.sysctl:
            key, _, value = setting.partition("=")
            for i in range(1, max(ns) + 1):
                path = Path("/proc/sys", *key.split("."))
                subprocess.run(
                    ["ip", "netns", "exec", f"hvdtrack-h{i}", "sh", "-c", f"echo {value} > {path}"],
                    check=True,
                )
        print(header, flush=True)
        for rate_name, gbit in rates:
            shape(max(ns), gbit, args.delay_ms, args.burst_us, args.queue_ms)
            latency_s = link_latency_s(addresses)
            latency_us = latency_s * 1e6
            net = network.NetworkModel(rate_name, gbit, latency_us)
            goodput = link_goodput_gbit(addresses, args.gradient_bytes, latency_s)
            measured_net = network.NetworkModel(rate_name, goodput, latency_us)
            bidi = link_bidi_goodput_gbit(addresses, args.gradient_bytes, latency_s)
            bidi_net = network.NetworkModel(rate_name, bidi, latency_us)
            for n in ns:
                times = time_allreduce(n, addresses, args)
                measured = statistics.median(times)
                ring = network.ring_allreduce_time(args.gradient_bytes, n, net)
                cycle = maths.cycle_wait(args.gradient_bytes, args.cycle_ms * 1e-3)
                ring_gp = network.ring_allreduce_time(args.gradient_bytes, n, measured_net)
                ring_bidi = network.ring_allreduce_time(args.gradient_bytes, n, bidi_net)
                row = {
                    "n": n,
                    "bandwidth_gbps": gbit,
                    "latency_us": latency_us,
                    "measured_ms": measured * 1e3,
                    "measured_min_ms": min(times) * 1e3,
                    "measured_max_ms": max(times) * 1e3,
                    "ring_ms": ring * 1e3,
                    "ring_cycle_ms": (ring + cycle) * 1e3,
                    "goodput_gbps": goodput,
                    "ring_goodput_ms": ring_gp * 1e3,
                    "bidi_goodput_gbps": bidi,
                    "ring_bidi_ms": ring_bidi * 1e3,
                }
                rows.append(row)
                print(
                    f"{n:>3} {rate_name:>9} {latency_us:>6.1f}us {measured * 1e3:>11.2f} "
                    f"{ring * 1e3:>8.2f} {(ring - measured) / measured:>+7.1%} "
                    f"{(ring + cycle) * 1e3:>13.2f} {(ring + cycle - measured) / measured:>+7.1%} "
                    f"{goodput * 1e3:>6.1f}Mb {ring_gp * 1e3:>10.2f} "
                    f"{(ring_gp - measured) / measured:>+7.1%} {bidi * 1e3:>6.1f}Mb "
                    f"{ring_bidi * 1e3:>10.2f} {(ring_bidi - measured) / measured:>+7.1%}",
                    flush=True,
                )
    floors = {r["n"]: r for r in rows if r["bandwidth_gbps"] == math.inf}
    shaped = [r for r in rows if r["n"] in floors and r["bandwidth_gbps"] < math.inf]
    if shaped:
        print("\nwhat shaping adds (measured minus the bare veth at the same N; model: the ring's")
        print("transfer term 2(N-1)/N B / bandwidth, the software floor being the same in both):")
        print("at the nominal rate, the link's measured goodput and its bidirectional goodput:")
        print(
            f"{'N':>3} {'bandwidth':>9} {'added ms':>9} {'model ms':>9} {'err':>7} {'@gp ms':>9} "
            f"{'err':>7} {'@bibw ms':>9} {'err':>7}"
        )
        for r in shaped:
            added = r["measured_ms"] - floors[r["n"]]["measured_ms"]
            model = r["ring_ms"] - floors[r["n"]]["ring_ms"]
            model_gp = r["ring_goodput_ms"] - floors[r["n"]]["ring_ms"]
            model_bidi = r["ring_bidi_ms"] - floors[r["n"]]["ring_ms"]
            r |= {"added_ms": added, "added_model_ms": model, "added_goodput_model_ms": model_gp,
                  "added_bidi_model_ms": model_bidi}  # fmt: skip
            errs = [
                f"{(m - added) / added:>+7.1%}" if added > 0 else "    n/a"
                for m in (model, model_gp, model_bidi)
            ]
            print(
                f"{r['n']:>3} {r['bandwidth_gbps']:>7g}Gb {added:>9.2f} {model:>9.2f} {errs[0]} "
                f"{model_gp:>9.2f} {errs[1]} {model_bidi:>9.2f} {errs[2]}"
            )
    if args.json:
        for r in rows:  # strict JSON: the bare link's bandwidth as null
            r["bandwidth_gbps"] = None if r["bandwidth_gbps"] == math.inf else r["bandwidth_gbps"]
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
