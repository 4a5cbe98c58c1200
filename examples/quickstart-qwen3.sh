#!/usr/bin/env bash
# The quickstart on the Qwen3 world (examples/world-qwen3): a speculators 0.9 EAGLE-3 draft with a
# Qwen3 decoder layer, converted with --from auto, validated against vLLM (which attaches it as
# Eagle3Qwen3ForCausalLM with no speculative flags), then served.
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD=examples/world-qwen3 DRAFT=eagle3-speculators FROM=auto OUT=${OUT:-out/eagle3-qwen3-example} PORT=${PORT:-8766} \
    exec bash examples/quickstart.sh
