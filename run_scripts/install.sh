#!/usr/bin/env bash
# One idempotent install of hvdtrack's stack: Debian packages, .venv, pinned Python packages,
# Horovod built from source against the installed TensorFlow (MPI + Gloo), and a check that
# `horovodrun --check-build` lists TensorFlow, MPI and Gloo.
#
#   bash run_scripts/install.sh            # CPU (tensorflow-cpu)
#   HVDTRACK_TF_EXTRA=gpu bash run_scripts/install.sh   # GPU nodes (tensorflow[and-cuda], NCCL)
#
# Environment:
#   HVDTRACK_VENV         where the virtual environment lives (default: <repo>/.venv)
#   HVDTRACK_TF_EXTRA     setup.cfg extra that brings TensorFlow: cpu (default), gpu, or none
#                         (none: TensorFlow is already installed, e.g. an NGC base image)
#   HVDTRACK_WHEEL_CACHE  where built Horovod wheels are kept, keyed by Horovod, TF and Python
#                         versions (default: ~/.cache/hvdtrack/wheels)
#   HVDTRACK_SYSTEM_PYTHON=1  install into the current interpreter instead of a venv (images)
#   HVDTRACK_SKIP_APT=1   do not call apt-get (the packages must be there already)
#   HOROVOD_GPU_OPERATIONS=NCCL etc. are passed through to the Horovod build.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HVDTRACK_VENV:-$repo/.venv}"
tf_extra="${HVDTRACK_TF_EXTRA:-cpu}"
wheel_cache="${HVDTRACK_WHEEL_CACHE:-$HOME/.cache/hvdtrack/wheels}"
python_bin="${PYTHON:-python3}"
python_bin="$(command -v "$python_bin" || echo "$python_bin")"

say() { printf '[install] %s\n' "$*"; }
die() {
    printf '[install] ERROR: %s\n' "$1" >&2
    [ $# -gt 1 ] && printf '[install] what to do: %s\n' "$2" >&2
    exit 1
}

# ---------------------------------------------------------------- fast path: already installed
if [ "${HVDTRACK_SYSTEM_PYTHON:-0}" = 1 ]; then
    py="$python_bin"
    stamp="${HVDTRACK_STAMP:-/usr/local/share/hvdtrack-install.stamp}"
else
    py="$venv/bin/python"
    stamp="$venv/.hvdtrack-install.stamp"
fi
fingerprint="$(cat "$repo/setup.cfg" "$repo/run_scripts/install.sh" | sha256sum | cut -c1-16)-$tf_extra-${HOROVOD_GPU_OPERATIONS:-cpu}"
# Where pip puts console scripts for this interpreter (differs from dirname(python) on Debian).
scripts_dir() { "$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null; }
check_build() {
    local out
    out="$("$(scripts_dir)/horovodrun" --check-build 2>&1)" || return 1
    for fw in TensorFlow MPI Gloo; do
        grep -q "\[X\] $fw" <<<"$out" || return 1
    done
    printf '%s\n' "$out"
}
# The same three questions `horovodrun --check-build` asks, in one interpreter (it takes ~25 s).
quick_check() {
    "$py" -c 'import horovod.tensorflow as h, sys; sys.exit(not (h.mpi_built() and h.gloo_built()))' \
        >/dev/null 2>&1
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ] && quick_check; then
    say "up to date ($py; Horovod with TensorFlow, MPI and Gloo)"
    exit 0
fi

# ---------------------------------------------------------------- preconditions
command -v "$python_bin" >/dev/null || die "no '$python_bin' on PATH" \
    "install Python 3.11 (Debian 12: apt-get install python3 python3-venv python3-dev) or set PYTHON=/path/to/python3.11"
pyver="$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$pyver" in
    3.11) ;;
    *) die "Python $pyver found ($python_bin); hvdtrack supports Python 3.11, the one CI tests (setup.cfg python_requires)" \
           "install a supported Python and run again with PYTHON=/path/to/python3.11" ;;
esac

apt_packages=(build-essential g++ cmake libopenmpi-dev openmpi-bin git)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# For tests only: an sshd per test host (run_scripts/test_hosts.sh, which needs root anyway) and
# a one-node SLURM cluster (run_scripts/slurm_cluster.sh: slurm-wlm and munge).
# Installed when root may call apt-get; images and HVDTRACK_SKIP_APT=1 go without.
if [ "$(id -u)" = 0 ] && [ "${HVDTRACK_SKIP_APT:-0}" != 1 ]; then
    for p in openssh-server slurm-wlm munge; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "${HVDTRACK_SKIP_APT:-0}" = 1 ]; then
        die "Debian packages missing: ${missing[*]} (and HVDTRACK_SKIP_APT=1)" \
            "install them (apt-get install ${missing[*]}) or unset HVDTRACK_SKIP_APT"
    fi
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "Debian packages missing: ${missing[*]}; not root and no sudo" \
            "ask an administrator to run: apt-get install ${missing[*]}"
        sudo="sudo"
    fi
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >/dev/null || die "apt-get update failed: no network to the Debian mirror?" \
        "check the network or proxy settings, or install ${missing[*]} by hand and set HVDTRACK_SKIP_APT=1"
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed" "run it by hand to see the error"
fi
command -v g++ >/dev/null || die "no C++ compiler (g++) on PATH; Horovod is built from source" \
    "apt-get install g++ (or build-essential)"
command -v mpicxx >/dev/null || die "no MPI compiler wrapper (mpicxx); Horovod's MPI controller needs it" \
    "apt-get install libopenmpi-dev openmpi-bin"
# Gloo's bundled CMakeLists are rejected by CMake >= 4.
cmake_major="$(cmake --version 2>/dev/null | sed -n 's/cmake version \([0-9]*\).*/\1/p')"
[ -n "$cmake_major" ] || die "no cmake on PATH" "apt-get install cmake"

# ---------------------------------------------------------------- virtual environment
if [ "${HVDTRACK_SYSTEM_PYTHON:-0}" != 1 ]; then
    if [ ! -x "$py" ]; then
        say "creating $venv"
        "$python_bin" -m venv "$venv" || die "could not create a virtual environment at $venv" \
            "apt-get install python3-venv (Debian's Python), or check write permission"
    fi
fi
pip=("$py" -m pip --disable-pip-version-check)
export PIP_NO_INPUT=1

say "checking the package registry"
probe="$(mktemp -d)"
if ! "${pip[@]}" download --quiet --no-deps -d "$probe" "six==1.16.0" >"$probe/log" 2>&1; then
    tail -n 5 "$probe/log" >&2
    rm -rf "$probe"
    die "cannot reach the Python package registry (pip download failed)" \
        "check the network, proxy (HTTPS_PROXY) or pip configuration (PIP_INDEX_URL), then run again"
fi
rm -rf "$probe"

say "installing build tools"
"${pip[@]}" install --quiet --upgrade "pip>=24" "setuptools>=69,<76" wheel "cmake>=3.20,<4" packaging

extras="dev"
[ "$tf_extra" != none ] && extras="$tf_extra,dev"
say "installing hvdtrack[$extras] (pinned TensorFlow, Sonnet, graph_nets, mpi4py, ...)"
"${pip[@]}" install --quiet -e "$repo[$extras]" || die "pip install -e .[$extras] failed" \
    "read the pip output above; a compiler error in mpi4py means libopenmpi-dev is missing"

# ---------------------------------------------------------------- Horovod from source
hvd_pin="$("$py" - "$repo/setup.cfg" <<'PYEOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
print(cfg["options.extras_require"]["horovod"].strip())
PYEOF
)"
hvd_version="${hvd_pin#horovod==}"
tf_version="$("$py" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" ||
    die "TensorFlow does not import in $py" "check the pip output above (HVDTRACK_TF_EXTRA=$tf_extra)"
cache_dir="$wheel_cache/horovod-$hvd_version-tf$tf_version-py$pyver${HOROVOD_GPU_OPERATIONS:+-${HOROVOD_GPU_OPERATIONS,,}}"
installed_hvd="$("$py" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)"
if [ "$installed_hvd" != "$hvd_version" ] || ! check_build >/dev/null; then
    if ! ls "$cache_dir"/horovod-*.whl >/dev/null 2>&1; then
        say "building Horovod $hvd_version against TensorFlow $tf_version (a few minutes; log: $cache_dir.log)"
        mkdir -p "$cache_dir"
        export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
        export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
        export MAKEFLAGS="-j$(nproc)"
        if ! PATH="$(scripts_dir):$PATH" "${pip[@]}" wheel --no-deps --no-build-isolation \
                --no-cache-dir -w "$cache_dir.tmp" "horovod==$hvd_version" >"$cache_dir.log" 2>&1; then
            echo "----- last 40 lines of $cache_dir.log -----" >&2
            tail -n 40 "$cache_dir.log" >&2
            rm -rf "$cache_dir" "$cache_dir.tmp"
            die "building Horovod $hvd_version failed" "read the log above; stack notes: docs/stack-notes.md"
        fi
        mv "$cache_dir.tmp"/horovod-*.whl "$cache_dir"/ && rm -rf "$cache_dir.tmp"
    else
        say "using cached Horovod wheel from $cache_dir"
    fi
    "${pip[@]}" install --quiet --no-deps --force-reinstall "$cache_dir"/horovod-*.whl
    # Horovod's own run-time dependencies (the wheel was installed without them).
    "${pip[@]}" install --quiet cloudpickle psutil pyyaml packaging cffi
fi

if ! out="$(check_build)"; then
    "$(scripts_dir)/horovodrun" --check-build >&2 || true
    [ -f "$cache_dir.log" ] && tail -n 40 "$cache_dir.log" >&2
    die "horovodrun --check-build does not list TensorFlow, MPI and Gloo" \
        "remove $cache_dir and run again to rebuild Horovod; the build log tail is above"
fi
printf '%s\n' "$out" | sed -n '/Available Frameworks/,/Available Tensor Operations/p' | sed 's/^/[install]   /'
say "building the kernel library (hvdtrack/model/layer_norm.cc, segment_sum.cc)"
kernel="$("$py" -c 'from hvdtrack.model.kernels import build_kernel; print(build_kernel())')" \
    || die "building the kernel library (hvdtrack/model/*.cc) failed" "the compiler's output is above"
say "  $kernel"
echo "$fingerprint" >"$stamp"
say "done: $py"
