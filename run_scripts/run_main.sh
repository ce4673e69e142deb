#!/usr/bin/env bash
# The README's main command: install (idempotent), prepare the default synthetic dataset, train
# it with `horovodrun -np 2`, write the run's scaling report, evaluate the test split (edge and
# track metrics, TrackML score, plots), and say where everything is.
#   bash run_scripts/run_main.sh                       # configs/default.yaml, 2 ranks
#   CONFIG=configs/tiny.yaml NP=1 bash run_scripts/run_main.sh key=value ...   # overrides go to train
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
config="${CONFIG:-configs/default.yaml}"
np="${NP:-2}"
controller="${CONTROLLER:-gloo}"
bash run_scripts/install.sh
venv="${HVDTRACK_VENV:-$repo/.venv}"
py="$venv/bin/python"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "[main] preparing the dataset of $config"
"$py" -m hvdtrack.prepare --config "$config"

run_dir="$("$py" -m hvdtrack.train --config "$config" "$@" --print-config |
    "$py" -c 'import json, sys; print(json.load(sys.stdin)["train"]["run_dir"])')"
echo "[main] training with horovodrun -np $np --$controller (run directory $run_dir)"
"$venv/bin/horovodrun" -np "$np" -H "localhost:$np" "--$controller" \
    "$py" -m hvdtrack.train --config "$config" distributed.strategy=horovod "$@"

echo "[main] report of the run"
"$py" -m hvdtrack.scaling summary "$run_dir"

echo "[main] evaluation of the test split"
"$py" -m hvdtrack.evaluate --run "$run_dir" --split test

cat <<MSG
[main] done.
  TensorBoard logs : $run_dir/tensorboard   (tensorboard --logdir $run_dir/tensorboard)
  checkpoints      : $run_dir/checkpoints  (best by validation loss: $run_dir/best)
  timing records   : $run_dir/run.json, $run_dir/timing.jsonl
  run report       : $run_dir/report/summary.md  (epoch/step times, throughput, cost, energy)
  evaluation       : $run_dir/evaluate-test/  (metrics.json, plots, TrackML submissions)
  reconstruction   : $py -m hvdtrack.reconstruct --run $run_dir EVENT_DIR --out DIR
                     (tracks on TrackML-format events, truth not needed; --score with truth)
  export           : $py -m hvdtrack.export --run $run_dir --out DIR  (TensorFlow SavedModel)
  scaling studies  : python -m hvdtrack.scaling run --mode strong --np 1,2 --config $config
  dataset report   : $("$py" -m hvdtrack.train --config "$config" "$@" --print-config |
    "$py" -c 'import json, sys; print(json.load(sys.stdin)["data"]["dataset_dir"])')/report.md
MSG
