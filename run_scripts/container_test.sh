#!/usr/bin/env bash
# The CPU image for real: builds docker/Dockerfile with podman, then, inside the image as its
# ordinary user (uid 1001), prepares configs/tiny.yaml into a bind-mounted work dir and trains it
# under `horovodrun -np 2` with Gloo and with MPI, checking run.json and file ownership (root).
#
#   bash run_scripts/container_test.sh            # build (podman reuses cached layers) and run
#   bash run_scripts/container_test.sh --no-cache # rebuild every layer (Horovod's wheel stays cached)
#   bash run_scripts/container_test.sh --clean    # remove the images this script made, then exit
#
# What it prints: the build time, the image size, and the wall time of prepare and each training
# run ("[container_test] build: 379 s ..."). Exits non-zero with one message at the first failure.
#
# The base image: docker/Dockerfile starts FROM python:3.11-slim-bookworm. If podman has no image
# of that name and cannot pull it (no registry is reachable on the machine this was written on),
# the script makes a stand-in: a Debian 12 minbase made by mmdebstrap from the host's apt sources,
# plus Debian's python3 with `python3 -m venv /usr/local` so /usr/local/bin/python3 is there as in
# the official image; tagged localhost/python:3.11-slim-bookworm and labelled as made here.
#
# This host's CA bundle (PIP_CERT, else SSL_CERT_FILE, else Debian's) is mounted into the build's
# RUN steps with a pip.conf pointing at it, so pip works behind a TLS-inspecting proxy; neither
# is stored in the image.
#
# Environment:
#   HVDTRACK_CTEST_IMAGE        image to build (default localhost/hvdtrack:cpu-test)
#   HVDTRACK_CTEST_EPOCHS       epochs of each training run (default 3)
#   HVDTRACK_CTEST_BUILD_S      deadline of the image build (default 3600; Horovod compiles in it)
#   HVDTRACK_CTEST_RUN_S        deadline of each container run (default 600)
#   HVDTRACK_CTEST_KEEP=1       keep the work dir (its path is printed) instead of removing it
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="${HVDTRACK_CTEST_IMAGE:-localhost/hvdtrack:cpu-test}"
epochs="${HVDTRACK_CTEST_EPOCHS:-3}"
build_s="${HVDTRACK_CTEST_BUILD_S:-3600}"
run_s="${HVDTRACK_CTEST_RUN_S:-600}"
base=python:3.11-slim-bookworm     # docker/Dockerfile's FROM
standin="localhost/$base"
minbase=localhost/debian:bookworm-minbase
label=org.hvdtrack.made-by=run_scripts/container_test.sh
user_id=1001                       # docker/Dockerfile's USER
config=/opt/hvdtrack/configs/tiny.yaml

say() { printf '[container_test] %s\n' "$*"; }
die() {
    printf '[container_test] ERROR: %s\n' "$1" >&2
    [ $# -gt 1 ] && printf '[container_test] what to do: %s\n' "$2" >&2
    exit 1
}

no_cache=()
clean=0
for arg in "$@"; do
    case "$arg" in
        --no-cache) no_cache=(--no-cache) ;;
        --clean) clean=1 ;;
        *) die "unknown argument '$arg'" "usage: bash run_scripts/container_test.sh [--no-cache | --clean]" ;;
    esac
done
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "HVDTRACK_CTEST_EPOCHS must be a positive integer, got '$epochs'"
for v in build_s run_s; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "deadline $v must be a positive number of seconds, got '${!v}'"
done

# ---------------------------------------------------------------- preconditions
[ "$(id -u)" = 0 ] || die "needs root: podman as root keeps uid $user_id of the container as uid $user_id on the host, which the ownership check relies on" \
    "run it as root (rootless podman maps container users to sub-uids)"
missing=()
for tool in podman runc mmdebstrap python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || die "not installed: ${missing[*]}" \
    "apt-get install podman buildah runc mmdebstrap uidmap python3"

# One run at a time: two would build and run the same image tag under each other.
lock=/tmp/hvdtrack-container-test.lock
exec 9>>"$lock"
if ! flock --nonblock 9; then
    say "another run holds $lock; waiting for it (at most $build_s s)"
    flock --wait "$build_s" 9 || die "another run_scripts/container_test.sh still holds $lock after $build_s s"
fi

# ---------------------------------------------------------------- what this run makes, and its cleanup
tmp="$(mktemp -d /tmp/hvdtrack-ctest.XXXXXX)"
containers=() # names of the containers started here, removed on exit whatever happened
cleanup() {
    local name
    for name in "${containers[@]}"; do
        podman rm --force --ignore --time 5 "$name" >/dev/null 2>&1 || true
    done
    if [ "${HVDTRACK_CTEST_KEEP:-0}" = 1 ] && [ -d "$tmp/work" ]; then
        rm -rf "${tmp:?}/base.tar" "${tmp:?}/standin" "${tmp:?}/etc"
        say "kept the work dir: $tmp/work"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runtime settings for this script's podman calls only (CONTAINERS_CONF replaces the system
# file for them): runc, because crun fails in this kind of sandbox ("setrlimit RLIMIT_NOFILE:
# Operation not permitted", "cgroups in hybrid mode not supported"); and ulimits that
# runc may set: nofile no higher than this shell's hard limit (podman's default, 1048576, is
# above it here), nproc no higher than kernel.pid_max (above it runc's setrlimit was refused,
# "error setting rlimit type 6", though the hard limit was higher).
mkdir -p "$tmp/etc"
if [ -z "${CONTAINERS_CONF:-}" ]; then
    nofile="$(ulimit -Hn)"
    nproc="$(ulimit -Hu)"
    pid_max="$(cat /proc/sys/kernel/pid_max)"
    [ "$nofile" = unlimited ] && nofile=1048576
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then nproc="$pid_max"; fi
    cat >"$tmp/etc/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
    export CONTAINERS_CONF="$tmp/etc/containers.conf"
fi

if [ "$clean" = 1 ]; then
    for img in "$image" "$standin" "$minbase"; do
        podman image exists "$img" || continue
        if [ "$(podman image inspect --format '{{index .Labels "org.hvdtrack.made-by"}}' "$img")" = "${label#*=}" ]; then
            podman rmi "$img" >/dev/null && say "removed $img"
        else
            say "left $img: not made by this script"
        fi
    done
    exit 0
fi

# ---------------------------------------------------------------- 1. the base image
if podman image exists "$base"; then
    base_id="$(podman image inspect --format '{{.Id}}' "$base")"
    say "base image: $(podman image inspect --format '{{index .RepoTags 0}}' "$base") ${base_id:0:12}"
elif timeout 120 podman pull --quiet "docker.io/library/$base" >"$tmp/pull.log" 2>&1; then
    say "base image: pulled docker.io/library/$base"
else
    say "cannot pull docker.io/library/$base ($(tail -n 1 "$tmp/pull.log" | cut -c1-120)); making a stand-in"
    if ! podman image exists "$minbase"; then
        sources=(http://deb.debian.org/debian)
        [ -f /etc/apt/sources.list.d/debian.sources ] && sources=(/etc/apt/sources.list.d/debian.sources)
        t0=$SECONDS
        timeout 900 mmdebstrap --quiet --variant=minbase --include=ca-certificates \
            bookworm "$tmp/base.tar" "${sources[@]}" >"$tmp/mmdebstrap.log" 2>&1 ||
            { tail -n 20 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap could not make a Debian 12 base (log above)" \
                "check that the Debian mirror in ${sources[*]} is reachable"; }
        timeout 300 podman import --quiet --change "LABEL $label" "$tmp/base.tar" "$minbase" >/dev/null ||
            die "podman import of the mmdebstrap tarball failed"
        rm -f "$tmp/base.tar"
        say "made $minbase in $((SECONDS - t0)) s"
    fi
    mkdir -p "$tmp/standin"
    cat >"$tmp/standin/Containerfile" <<EOF
# Stand-in for the official $base: Debian 12's Python 3.11, reached as /usr/local/bin/python3.
FROM $minbase
LABEL $label
ENV LANG=C.UTF-8
RUN apt-get update \\
    && apt-get install -y --no-install-recommends python3 python3-dev python3-venv \\
    && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /usr/local
CMD ["python3"]
EOF
    t0=$SECONDS
    timeout 900 podman build --quiet --layers=false --format docker -t "$standin" "$tmp/standin" >"$tmp/standin.log" 2>&1 ||
        { tail -n 20 "$tmp/standin.log" >&2; die "building the stand-in $standin failed (log above)"; }
    podman image exists "$base" || die "podman does not resolve '$base' to $standin" \
        "check unqualified-search-registries and short-name-mode in /etc/containers/registries.conf"
    say "made $standin in $((SECONDS - t0)) s"
fi

# ---------------------------------------------------------------- 2. the image
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
[ -f "$ca" ] || die "CA bundle $ca not found" "set PIP_CERT to this host's CA bundle"
printf '[global]\ncert = /run/hvdtrack-build-ca.crt\n' >"$tmp/etc/pip.conf"
say "building $image from docker/Dockerfile (Horovod compiles unless its wheel is cached: minutes)"
previous="$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
t0=$(date +%s.%N)
set +e
timeout --kill-after=30 "$build_s" podman build --format docker "${no_cache[@]}" \
    -f "$repo/docker/Dockerfile" -t "$image" --label "$label" \
    -v "$ca:/run/hvdtrack-build-ca.crt:ro" -v "$tmp/etc/pip.conf:/etc/pip.conf:ro" \
    "$repo" >"$tmp/build.log" 2>&1
status=$?
set -e
build_time=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$t0" "$(date +%s.%N)")
if [ "$status" -ne 0 ]; then
    tail -n 40 "$tmp/build.log" >&2
    [ "$status" -eq 124 ] && die "the build did not finish within $build_s s (HVDTRACK_CTEST_BUILD_S)"
    die "podman build -f docker/Dockerfile failed (exit $status after $build_time s; log tail above)"
fi
if ! grep -q '^\[install\]' "$tmp/build.log"; then
    horovod="install layer cached"
elif grep -q '^\[install\] building Horovod' "$tmp/build.log"; then
    horovod="compiled"
else
    horovod="cached wheel"
fi
# The image this build replaced, now untagged: removed if this script made it.
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$image")" ] &&
    [ "$(podman image inspect --format '{{index .Labels "org.hvdtrack.made-by"}} {{len .RepoTags}}' "$previous" 2>/dev/null)" = "${label#*=} 0" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || say "could not remove the replaced image $previous"
fi
size=$(podman image inspect --format '{{.Size}}' "$image")
say "build: $build_time s (Horovod: $horovod); image $image $(python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e9:.2f}')" "$size") GB"

# ---------------------------------------------------------------- 3. training inside it, as uid 1001
work="$tmp/work"
mkdir -p "$work"
chown "$user_id:$user_id" "$work"
n=0
# in_image SECONDS CMD...: runs CMD in a fresh container of the image, as the image's own user,
# with the work dir at /work (the working directory: the config's relative paths resolve there).
# --network=none: nothing is downloaded at run time; Gloo and Open MPI talk over loopback.
in_image() {
    local deadline="$1" name="hvdtrack-ctest-$$-$((n += 1))"
    shift
    containers+=("$name")
    timeout --kill-after=30 "$deadline" podman run --rm --name "$name" --network=none \
        --shm-size=1g -v "$work:/work" -w /work "$image" "$@"
}
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

in_image 60 id -u >"$tmp/uid" 2>&1 || { cat "$tmp/uid" >&2; die "the image does not start (podman run $image id -u)"; }
uid="$(cat "$tmp/uid")"
[ "$uid" = "$user_id" ] || die "the image runs as uid $uid, not $user_id (docker/Dockerfile's USER)"
say "the image runs as uid $uid"
in_image 60 python -c 'from hvdtrack.model.kernels import fused_kernels; assert fused_kernels()' \
    >"$tmp/kernel" 2>&1 || { cat "$tmp/kernel" >&2; die "the image's user cannot load the kernel library built into it"; }
say "the image's user loads the kernel library ($(in_image 60 printenv HVDTRACK_OPS_CACHE))"

t0=$(date +%s.%N)
in_image "$run_s" python -m hvdtrack.prepare --config "$config" >"$tmp/prepare.log" 2>&1 ||
    { tail -n 30 "$tmp/prepare.log" >&2; die "prepare of $config in the image failed (log tail above)"; }
say "prepare tiny: $(elapsed "$t0") s"

# check_run DIR LAUNCHER: run.json says the run finished, with Horovod on two workers, all epochs.
check_run() {
    python3 - "$work/$1/run.json" "$epochs" "$2" <<'PYEOF'
import json, sys
path, epochs, launcher = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    with open(path) as f:
        info = json.load(f)
except (OSError, ValueError) as exc:
    sys.exit(f"{launcher}: no readable run.json: {exc}")
want = {"status": "finished", "strategy": "horovod", "num_workers": 2, "epochs": epochs}
got = {key: info.get(key) for key in want}
if got != want:
    sys.exit(f"{launcher}: {path} has {got}, expected {want}")
if not info.get("metrics"):
    sys.exit(f"{launcher}: {path} has no final metrics")
PYEOF
}

for launcher in gloo mpi; do
    t0=$(date +%s.%N)
    in_image "$run_s" horovodrun -np 2 "--$launcher" python -m hvdtrack.train --config "$config" \
        distributed.strategy=horovod "train.epochs=$epochs" "train.run_dir=runs/tiny-$launcher" \
        >"$tmp/train-$launcher.log" 2>&1 ||
        { tail -n 40 "$tmp/train-$launcher.log" >&2; die "horovodrun -np 2 --$launcher training in the image failed (log tail above)"; }
    took=$(elapsed "$t0")
    check_run "runs/tiny-$launcher" "$launcher" || die "training under horovodrun --$launcher did not finish as expected"
    say "train tiny, horovodrun -np 2 --$launcher, $epochs epochs: $took s (run.json: finished, 2 workers)"
done

not_owned="$(find "$work" ! -uid "$user_id" -printf '%u %p\n' | head -n 5)"
[ -z "$not_owned" ] || die "files in the work dir not owned by uid $user_id: $not_owned"
say "all $(find "$work" | wc -l) files in the work dir are owned by uid $user_id"
say "passed"
