#!/usr/bin/env bash
# GPU checks, ready for whoever has a CUDA device, each ending in RESULT lines, under 7 minutes:
# 1. the tests marked `gpu` (about 1.5 min): the stacked executor's CUDA graphs, the graphed
#    executor's and the threads executor's streams, call by call against the in-process executor,
#    greedy = Hugging Face across a length bucket, the same sampled draw, bf16 AR = EESD = PPSD;
# 2. tools/research/stacked_bench.py on a random Llama of the default model's exact shape in bf16 (about
#    3 min): ms per token of eager AR, HF generate(), graphed AR, stacked AR, graphed and stacked
#    PPSD at forced acceptance 0, 0.5, 0.75 and 1 (timing only: the tokens are not the model's);
#    the stacked slot's time and the host's time a slot; every ratio against the fastest AR of
#    this one run; JSON in docs/bench/engine/;
# 3. the same on the real default model with its shipped head (acceptance measured, not forced),
#    when its files are on the machine (about 1.5 min).
#
#   bash tools/device_check.sh [OUT_DIR]           # logs land in OUT_DIR (default runs/device-check)
#   bash tools/device_check.sh --dry-run [OUT_DIR] # no GPU: a tiny shape on the CPU, end to end
#
# Needs python3 with torch (CUDA), transformers, tokenizers, pytest and tqdm; gradio is not needed.
# Its numbers go in docs/benchmarks.md, naming the device.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=""
if [ "${1:-}" = "--dry-run" ]; then dry="--dry-run"; shift; fi
out=${1:-runs/device-check}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

if [ -z "$dry" ]; then
    "$py" -c "import torch, sys; ok = torch.cuda.is_available(); \
print('RESULT device:', torch.cuda.get_device_name(0) if ok else 'no CUDA device', '| torch', torch.__version__); \
sys.exit(0 if ok else 1)" || exit 1
    slug=$("$py" -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name(0).lower()).strip('-'))")
    json="docs/bench/engine/${slug}-stacked.json"
else
    echo "RESULT dry run on the CPU: a tiny shape, nothing measured worth keeping"
    json="$out/stacked-dry-run.json"
fi

timeout 100 "$py" -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_stacked.py tests/test_graphed.py \
    tests/test_threads.py >"$out/gpu-tests.log" 2>&1
echo "RESULT gpu tests (exit $?): $(tail -n 1 "$out/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$out/gpu-tests.log" | head -n 8 | sed 's/^/RESULT   /'

timeout 280 "$py" tools/research/stacked_bench.py $dry --repeats 3 --real --json "$json" >"$out/stacked.log" 2>&1
echo "RESULT stacked bench (exit $?), JSON in $json:"
grep RESULT "$out/stacked.log" | sed 's/^RESULT/RESULT  /' || tail -n 5 "$out/stacked.log"
