#!/usr/bin/env bash
# The scaling study committed under docs/scaling/: strong and weak sweeps with 1 and 2 workers on
# this machine (one thread per worker), Horovod's overhead against a run without it, the reports
# (Markdown, CSV, JSON, PNG) and the prediction to 1024 workers.
#   bash run_scripts/scaling_study_local.sh [CONFIG]      (default configs/default.yaml)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
config="${1:-configs/default.yaml}"
py="${HVDTRACK_VENV:-$repo/.venv}/bin/python"
out="${OUT:-runs/scaling-study}"
docs="docs/scaling"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(train.epochs=4 train.max_steps_per_epoch=20 train.validate_every_epochs=1000
        distributed.threads_per_worker=1 train.progress_bar=false train.resume=false)

# Strong scaling (global batch 2 graphs) and Horovod overhead (local run vs horovodrun -np 1),
# the six runs trained $rounds times in turn; the strong reports below are of the last round's
# runs, whose np1 with half the global batch (fit/weak-np1) joins their fit: the strong N=1's
# steps (2 graphs) alone span too few edges to tell its fixed cost from its per-edge cost.
rounds="${ROUNDS:-3}"
"$py" -m hvdtrack.bench distributed --config "$config" --out "$out/strong" --epochs 4 \
    --global-batch 2 --max-steps 20 --rounds "$rounds" --json "$out/distributed-bench.json" \
    | tee "$out/bench.txt"
strong="$out/strong/round-$rounds/sweep"
half="$out/strong/round-$rounds/fit/weak-np1"
# Weak scaling: 1 graph per worker per step.
"$py" -m hvdtrack.scaling run --mode weak --np 1,2 --config "$config" --batch 1 \
    --out "$out/weak" --skip-prepare "${common[@]}"

mkdir -p "$docs"
# The machine's ceiling for 2 ranks, measured in the last round of the bench above (beside the
# strong runs reported here; the weak sweep trains after the bench), enters the reports' and the
# prediction's checks against the measured N = 2, with a run of the other batch size in the fit.
ceiling="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["ceiling"])' \
    "$out/strong/round-$rounds/ceiling.json")"
"$py" -m hvdtrack.scaling report "$strong/strong-np1" "$strong/strong-np2" \
    --mode strong --ceiling "2=$ceiling" --fit-also "$half" --out "$docs/strong"
"$py" -m hvdtrack.scaling report "$out"/weak/weak-np1 "$out"/weak/weak-np2 --mode weak \
    --ceiling "2=$ceiling" --fit-also "$strong/strong-np1" --out "$docs/weak"
"$py" -m hvdtrack.scaling predict "$strong/strong-np1" "$strong/strong-np2" \
    --mode strong --ceiling "2=$ceiling" --fit-also "$half" \
    | tee "$docs/prediction-strong.txt"
cp "$out/distributed-bench.json" "$docs/distributed-bench.json"
cp "$out/bench.txt" "$docs/distributed-bench.txt"
echo "[study] reports in $docs"
