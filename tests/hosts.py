"""Test hosts on this machine: network namespaces with an sshd each (run_scripts/test_hosts.sh).

Public symbols:
  Hosts: the running hosts' addresses, names and ssh settings; launch commands across them
    (``horovodrun_command``, ``mpirun_command``, ``discovery_command`` for elastic jobs), ``env``
    for the launcher, ``down``/``up``.
  hosts: a session fixture; the hosts are started once and stopped at the end of the last
    session using them (a shared flock) unless they were up before; skipped only where network
    namespaces cannot be made (not root, no permission).

Everything runs as root: the launcher (pytest, horovodrun, mpirun) stays in the root namespace,
reaching the hosts at 10.250.0.11, .12, ... over a bridge on which it is 10.250.0.1.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launch import BIN, REPO, worker_env

SCRIPT = REPO / "run_scripts/test_hosts.sh"
DIRECTORY = Path(os.environ.get("HVDTRACK_HOSTS_DIR", "/tmp/hvdtrack-hosts"))
# Outside the work dir (stop removes it): a shared lock per session using the hosts.
LOCK = DIRECTORY.with_name(DIRECTORY.name + ".lock")
START_TIMEOUT_S = 120


def _script(*args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, "HVDTRACK_HOSTS_DIR": str(DIRECTORY)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _checked(*args: str, timeout: float = START_TIMEOUT_S) -> str:
    result = _script(*args, timeout=timeout)
    assert result.returncode == 0, (
        f"run_scripts/test_hosts.sh {' '.join(args)}: exit {result.returncode}\n"
        f"{result.stdout}{result.stderr}"
    )
    return result.stdout


@dataclass(frozen=True)
class Hosts:
    """The test hosts as the launcher sees them.

    Attributes:
      names: ``["h1", "h2", ...]``, as ``run_scripts/test_hosts.sh down|up`` takes them.
      addresses: their addresses, in the same order (``-H``/``--host`` take these).
      launcher: the launcher's own address on the link (Horovod's driver, Gloo rendezvous).
      interface: the link's interface name, the same on every host and on the launcher.
      subnet: the link's subnet, for Open MPI's ``*_if_include``.
      directory: the work dir: ``bin/ssh`` (ssh with the hosts' config), ``ssh_config``,
        ``id_ed25519``, per host ``hN/sshd.log``.
    """

    names: list[str]
    addresses: list[str]
    launcher: str
    interface: str
    subnet: str
    directory: Path

    @classmethod
    def read(cls) -> Hosts:
        """The hosts as ``test_hosts.sh env`` reports them."""
        values = {}
        for line in _checked("env", timeout=30).splitlines():
            key, _, value = line.partition("=")
            values[key] = value.strip("'")
        addresses = values["HVDTRACK_HOSTS_ADDRESSES"].split()
        return cls(
            names=[f"h{int(a.rsplit('.', 1)[1]) - 10}" for a in addresses],
            addresses=addresses,
            launcher=values["HVDTRACK_HOSTS_LAUNCHER"],
            interface=values["HVDTRACK_HOSTS_INTERFACE"],
            subnet=values["HVDTRACK_HOSTS_SUBNET"],
            directory=Path(values["HVDTRACK_HOSTS_DIR"]),
        )

    @property
    def ssh(self) -> Path:
        """``ssh -F <the hosts' ssh_config>``: horovodrun and mpirun find it first on PATH."""
        return self.directory / "bin/ssh"

    def address(self, name: str) -> str:
        return self.addresses[self.names.index(name)]

    @staticmethod
    def namespace(name: str) -> str:
        """The network namespace of host ``name`` (``h2`` -> ``hvdtrack-h2``)."""
        return f"hvdtrack-{name}"

    def netns_inode(self, name: str) -> int:
        """Identifies the host's network namespace: equal to ``/proc/<pid>/ns/net``'s inode for
        every process running on it."""
        return os.stat(f"/run/netns/{self.namespace(name)}").st_ino

    def pids(self, name: str) -> list[int]:
        """Processes running on host ``name`` (its sshd included)."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.namespace(name)], capture_output=True, text=True
        ).stdout
        return [int(p) for p in out.split()]

    def host_list(self, slots: int = 1, names: list[str] | None = None) -> str:
        """``10.250.0.11:1,10.250.0.12:1`` for ``horovodrun -H`` / ``mpirun --host``."""
        return ",".join(f"{self.address(n)}:{slots}" for n in (names or self.names))

    def env(self, **extra: str) -> dict[str, str]:
        """The launcher's environment: ``worker_env`` with the hosts' ssh first on PATH.
        horovodrun forwards it to every rank (Gloo: on the ssh command line; MPI: ``-x``)."""
        env = worker_env(**extra)
        env["PATH"] = f"{self.ssh.parent}{os.pathsep}{env['PATH']}"
        return env

    def horovodrun_command(
        self, args: list[str], controller: str = "gloo", names: list[str] | None = None
    ) -> list[str]:
        """``horovodrun -np N -H a:1,b:1 --gloo|--mpi --network-interface hvdt0 python ARGS``,
        one rank per host."""
        names = names or self.names
        cmd = [str(BIN / "horovodrun"), "-np", str(len(names)), "-H", self.host_list(1, names)]
        cmd += [f"--{controller}", "--network-interface", self.interface]
        if controller == "mpi":
            # horovodrun sets btl_tcp_if_include only; mpirun's own (oob) traffic too.
            cmd += ["--mpi-args", f"--mca oob_tcp_if_include {self.subnet}"]
        return [*cmd, sys.executable, *args]

    def mpirun_command(self, args: list[str], names: list[str] | None = None) -> list[str]:
        """Plain ``mpirun --host a:1,b:1 python ARGS`` over the hosts' ssh, traffic on the link."""
        names = names or self.names
        cmd = [shutil.which("mpirun") or "mpirun", "-np", str(len(names))]
        cmd += ["--host", self.host_list(1, names), "--bind-to", "none"]
        cmd += ["--mca", "plm_rsh_agent", str(self.ssh)]
        cmd += ["--mca", "oob_tcp_if_include", self.subnet]
        cmd += ["--mca", "btl_tcp_if_include", self.subnet]
        for name in ("PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL"):
            cmd += ["-x", name]
        return [*cmd, sys.executable, *args]

    def discovery_command(self, slots: int = 1) -> str:
        """For ``horovodrun --host-discovery-script``: prints ``ADDR:SLOTS`` for each host that
        is up now, so ``down``/``up`` remove and add hosts of an elastic job."""
        return f"bash {SCRIPT} discover {slots}"

    def down(self, name: str) -> None:
        """Host ``name`` disappears: its link goes down and everything on it is killed."""
        _checked("down", name, timeout=60)

    def up(self, name: str) -> None:
        """Host ``name`` comes back: link up, sshd answering."""
        _checked("up", name, timeout=60)

    def start(self, count: int) -> Hosts:
        """At least ``count`` hosts up (more can be added to a running set); the new ``Hosts``."""
        _checked("start", str(count))
        return Hosts.read()


def _cannot_make_namespaces() -> str | None:
    """Why test hosts cannot exist here, or None."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, an sshd per host)"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    probe = f"hvdtrack-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _lock(lock_file, mode: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock_file, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            assert time.monotonic() < deadline, f"{LOCK} held by another session for {timeout} s"
            time.sleep(0.2)


@pytest.fixture(scope="session")
def hosts():
    """Two test hosts for the session (``Hosts``); stopped at the end unless they were up
    before (started by hand) or another pytest session still uses them."""
    reason = _cannot_make_namespaces()
    if reason:
        pytest.skip(reason)
    with open(LOCK, "a") as lock_file:
        _lock(lock_file, fcntl.LOCK_EX, START_TIMEOUT_S)  # one session starts them at a time
        already_up = _script("status", timeout=60).returncode == 0  # e.g. started by hand
        _checked("start", "2")
        fcntl.flock(lock_file, fcntl.LOCK_SH)
        try:
            yield Hosts.read()
        finally:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another session holds its shared lock: the last one stops them
            else:
                if not already_up:
                    _checked("stop", timeout=60)
