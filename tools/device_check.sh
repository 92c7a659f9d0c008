#!/usr/bin/env bash
# GPU checks, ready for whoever has a CUDA device, each ending in RESULT lines, under 5 minutes:
# 1. the tests marked `gpu`: the graphed executor's CUDA graphs and the threads executor's
#    streams, call by call against the in-process executor, greedy = Hugging Face across a length
#    bucket, the same sampled draw, bf16 AR = EESD = PPSD;
# 2. tools/engine_bench.py on a random Llama of the default model's exact shape in bf16: ms per
#    token of eager AR, HF generate(), graphed AR and graphed PPSD; both stage times alone, the
#    overlap factor (t1 + t2) / slot, the slot's span on the GPU and the host's share, host waits
#    per slot, each stage alone at other E; then the same with every draft accepted (layers >= E
#    zeroed), the upper-bound control.
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

timeout 60 "$py" -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_graphed.py tests/test_threads.py \
    >"$out/gpu-tests.log" 2>&1
echo "RESULT gpu tests (exit $?): $(tail -n 1 "$out/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$out/gpu-tests.log" | head -n 8 | sed 's/^/RESULT   /'

timeout 150 "$py" tools/engine_bench.py --device cuda --repeats 3 --sweep-exit-layers 12 15 21 --json "$out/engine-bf16.json" >"$out/engine.log" 2>&1
echo "RESULT engine bench (exit $?), random SmolLM2-shaped Llama, bf16:"
grep RESULT "$out/engine.log" | sed 's/^RESULT/RESULT  /' || tail -n 5 "$out/engine.log"

timeout 90 "$py" tools/engine_bench.py --device cuda --repeats 3 --perfect-exit \
    --json "$out/engine-bf16-perfect.json" >"$out/engine-perfect.log" 2>&1
echo "RESULT engine bench (exit $?), every draft accepted:"
grep RESULT "$out/engine-perfect.log" | sed 's/^RESULT/RESULT  /' || tail -n 5 "$out/engine-perfect.log"
