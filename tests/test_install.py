"""run_scripts/install.sh stops on a broken precondition with a message saying which and what to do."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.launch import REPO

SCRIPT = str(REPO / "run_scripts/install.sh")
# The real interpreter behind the venv (not a pyenv shim, which needs more than a bare PATH).
PYTHON = os.path.realpath(sys.executable)


def install(tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HVDTRACK_"))}
    full.update(HVDTRACK_VENV=str(tmp_path / "venv"), HVDTRACK_SKIP_APT="1", **env)
    return subprocess.run(["bash", SCRIPT], env=full, capture_output=True, text=True, timeout=300)


def test_missing_python(tmp_path):
    result = install(tmp_path, PYTHON=str(tmp_path / "no-python3"))
    assert result.returncode == 1
    assert f"no '{tmp_path / 'no-python3'}' on PATH" in result.stderr
    assert "what to do: install Python 3.11" in result.stderr


def test_wrong_python_version(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 3.8\n")
    fake.chmod(0o755)
    result = install(tmp_path, PYTHON=str(fake))
    assert result.returncode == 1
    assert "Python 3.8 found" in result.stderr and "supports Python 3.11" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_no_compiler(tmp_path):
    # A PATH with everything the script needs except a C++ compiler.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "dpkg-query",
        "grep",
        "sed",
        "sha256sum",
        "cut",
        "cat",
        "dirname",
        "id",
        "mktemp",
        "rm",
        "tail",
    ):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    result = install(tmp_path, PATH=str(bin_dir), PYTHON=PYTHON)
    assert result.returncode == 1
    assert "no C++ compiler (g++) on PATH" in result.stderr
    assert "apt-get install g++" in result.stderr


@pytest.mark.slow
def test_no_registry(tmp_path):
    # Port 9 on loopback refuses at once: pip cannot reach its index.
    result = install(
        tmp_path,
        PYTHON=PYTHON,
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_RETRIES="0",
        PIP_TIMEOUT="3",
    )
    assert result.returncode == 1
    assert "cannot reach the Python package registry" in result.stderr
    assert "PIP_INDEX_URL" in result.stderr
