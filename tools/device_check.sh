#!/usr/bin/env bash
# GPU checks, ready for whoever has a CUDA device: the tests marked `gpu` (the threads executor on
# CUDA streams: call by call against the in-process executor, greedy = Hugging Face, the same
# sampled draw) and one short bench-pipeline on CUDA (a random Llama of width 1024, so no weights
# are needed), each ending in one RESULT line. About 5 minutes on one GPU; every step has a timeout.
#
#   bash tools/device_check.sh [OUT_DIR]        # logs and JSON land in OUT_DIR (default runs/device-check)
#
# Needs python3 with torch (CUDA), transformers, tokenizers, pytest and tqdm; gradio is not needed.
# Its numbers go in docs/benchmarks.md, naming the device.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/device-check}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

"$py" -c "import torch, sys; ok = torch.cuda.is_available(); \
print('RESULT device:', torch.cuda.get_device_name(0) if ok else 'no CUDA device', '| torch', torch.__version__); \
sys.exit(0 if ok else 1)" || exit 1

timeout 300 "$py" -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_threads.py >"$out/gpu-tests.log" 2>&1
echo "RESULT gpu tests (exit $?): $(tail -n 1 "$out/gpu-tests.log")"

timeout 300 "$py" -m ppsd bench-pipeline --random-hidden 1024 --device cuda --new-tokens 32 --repeats 3 \
    --warmup 1 --max-prompts 2 --json "$out/bench-pipeline-cuda-h1024.json" >"$out/bench.log" 2>&1
status=$?
"$py" - "$out/bench-pipeline-cuda-h1024.json" "$status" <<'PY'
import json, sys
path, status = sys.argv[1], sys.argv[2]
try:
    report = json.load(open(path))
except (OSError, ValueError) as error:
    print(f"RESULT bench-pipeline (exit {status}): no report ({error}); see bench.log")
    sys.exit(0)
for label, rate in report["tokens_per_second"].items():
    print(f"RESULT bench-pipeline {label}: {rate:.1f} tok/s")
print(f"RESULT bench-pipeline: acceptance {report['ppsd_acceptance_rate']:.3f}, PPSD on the pipeline "
      f"{report['measured_ppsd_speedup_vs_pipeline_ar']:.2f}x its AR, device {report['device']}, exit {status}")
PY
