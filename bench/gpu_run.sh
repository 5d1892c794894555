#!/usr/bin/env bash
# The prepared GPU check of issue 13: bench/gpu.py, then the CUDA tests, each under its own
# time limit so that one slow part cannot eat the other's share, all output under $OUT
# (bench/gpu.py rewrites $OUT/gpu.json after every record, so a cut-short run keeps its
# figures). Total <= ~9.5 min. Run from the repository root on the GPU machine:
#     bash bench/gpu_run.sh            # uses python3 (the device image holds torch there)
set -u
OUT=${OUT:-/tmp/dlmkit-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
# DFlash drafts for a frozen target: a one-step tiny AR model (on the CPU, ~20 s) serves.
TARGET=/tmp/dlmkit-gpu-ar
timeout 120 "$PY" -m dlmkit.cli train --set strategy.name=ar --set train.steps=1 \
    --set data.num_train=16 --set data.num_validation=4 --set train.global_batch_size=4 \
    --set train.device=cpu --set train.progress=false --output-dir "$TARGET" --overwrite \
    > "$OUT/ar_target.log" 2>&1 || echo "AR target failed: dflash will be skipped" >> "$OUT/env.txt"
timeout "${GPU_BENCH_S:-390}" "$PY" bench/gpu.py --json "$OUT/gpu.json" \
    --set "dflash:strategy.target=$TARGET/final" > /dev/null 2> "$OUT/gpu.log"
echo "bench/gpu.py exit $? (124 = time limit)" >> "$OUT/env.txt"
timeout "${CUDA_TESTS_S:-170}" "$PY" -m pytest -q -m cuda tests/cuda -p no:cacheprovider \
    > "$OUT/cuda_tests.log" 2>&1
echo "pytest -m cuda exit $? (124 = time limit)" >> "$OUT/env.txt"
cat "$OUT/env.txt"; tail -n 80 "$OUT/gpu.log"; tail -n 30 "$OUT/cuda_tests.log"
