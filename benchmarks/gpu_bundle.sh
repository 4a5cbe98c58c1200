#!/usr/bin/env bash
# Bundle specfmt and every dependency it lacks on a GPU machine -- all but torch -- as wheels, for a
# machine with a GPU and torch but no vLLM and no package index. There, both commands run with --no-vllm:
#
#   here (with PyPI):   bash benchmarks/gpu_bundle.sh [OUT=dist/gpu-bundle]   # PYVER=3.11 PLATFORM=manylinux2014_x86_64
#   copy OUT over, then on the GPU machine (torch with CUDA already installed):
#     pip install --no-index --find-links OUT specfmt
#     specfmt validate DRAFT --run --no-vllm --device cuda            # bf16 by default on the GPU
#     specfmt train eagle3 --verifier V --data D -o OUT --device cuda
#
# WITH_SPECULATORS=1 adds speculators 0.9.0 and what it imports (tests/speculators_env.py PACKAGES), so that the GPU machine
# can run the trainer benchmark against it (issue 38): bf16 training tokens/s and peak memory of both trainers on a
# real-size verifier (random weights, Llama-3.2-1B's shapes):
#     pip install --no-index --find-links OUT specfmt speculators==0.9.0 hs-connectors==0.9.0 datasets==5.1.0 ...
#     (or: pip install --no-index --find-links OUT --target SPEC_ENV --no-deps OUT/*speculators* ... as tests/speculators_env.py builds it)
#     python benchmarks/gpu_train_bench.py --size 1b --steps 60 --batch-size 4 --seq-len 2048    # writes gpu_train_bench.results.json
#
# How: pip resolves specfmt's requirements for the target's Python and platform (`pip install --dry-run
# --report`), the result minus torch and its CUDA/triton packages is downloaded as binary wheels for that
# target (`pip download --no-deps --only-binary=:all:`), and specfmt itself is built as a wheel (`pip wheel`).
# The wheels that are not pure Python (safetensors, tokenizers, pyyaml, ...) come for PLATFORM and PYVER.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist/gpu-bundle}
PY=${PYTHON:-python3}
PYVER=${PYVER:-$($PY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PLATFORM=${PLATFORM:-manylinux2014_x86_64}
mkdir -p "$OUT"
REPORT=$(mktemp)

# 1. specfmt as a wheel (pure Python)
$PY -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$OUT" .

# 2. what it needs on the target, as pinned versions (pip's own resolver, for the target's Python and platform),
#    the newest that fit; PIN_HERE=1 holds them to the versions installed here (the ones the tests ran with),
#    where PyPI has binary wheels of those for the target
CONSTRAINTS=$(mktemp)
trap 'rm -f "$REPORT" "$CONSTRAINTS"' EXIT
if [ "${PIN_HERE:-0}" = 1 ]; then
  $PY -m pip freeze --disable-pip-version-check | grep '==' | grep -viE '^(torch|triton|nvidia-|vllm)' | sed 's/+.*//' > "$CONSTRAINTS" || true
fi
$PY -m pip install --quiet --disable-pip-version-check --dry-run --ignore-installed --only-binary=:all: \
    --python-version "$PYVER" --platform "$PLATFORM" --target "$(mktemp -d)" --report "$REPORT" -c "$CONSTRAINTS" .
mapfile -t PINS < <($PY - "$REPORT" <<'EOF'
import json, sys
# torch and what only torch needs are on the GPU machine already
skip = ("torch", "triton", "nvidia-", "cuda-", "specfmt", "setuptools", "sympy", "mpmath", "networkx")
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    name = meta["name"].lower()
    if not name.startswith(skip):
        print(f"{name}=={meta['version']}")
EOF
)

# 3. those wheels, for the target
$PY -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --platform "$PLATFORM" -d "$OUT" "${PINS[@]}"
# 4. WITH_SPECULATORS=1: speculators 0.9.0 and its imports, pinned as its test env pins them
if [ "${WITH_SPECULATORS:-0}" = 1 ]; then
  mapfile -t SPEC < <($PY -c 'import sys; sys.path.insert(0, "tests"); from speculators_env import PACKAGES; print("\n".join(PACKAGES))')
  $PY -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$PYVER" --platform "$PLATFORM" -d "$OUT" "${SPEC[@]}"
fi
echo "wrote $(ls "$OUT" | wc -l) wheels to $OUT (Python $PYVER, $PLATFORM; torch not included):"
ls "$OUT"
