"""``--from dspark`` on SpecForge's native DSpark layout (issue 25): ``DSparkDraftModel(DFlashDraftModel)``.

The source is built in the shape of the corpus records (``tests/data/real_configs/native-dspark-specforge-*``: a Qwen3
config with ``block_size``, ``num_target_layers`` and ``dflash_config`` holding the heads' fields; tensors DFlash's plus
``markov_head.markov_w1`` / ``markov_w2`` [V, r] and ``confidence_head.proj``) for the Qwen3 example verifier (H 128,
V 2048, N 8). The conversion keeps every tensor, reads the backbone as DFlash's research layout does (taps + 1) and writes
``sample_from_anchor`` true with k = B: SpecForge trains slot j of a block on the token at anchor + j + 1
(``specforge/algorithms/common/dflash_family_model.py`` ``OnlineDSparkModel``). SpecForge's own ``DSparkDraftModel``
(SpecForge 0.2.0 from PyPI, in the test env it shares with SGLang, ``tests/sglang_env.py``; or a checkout
named by ``SPECFORGE_SRC``, a6b6b02 checked first) loads the source strictly and its float64 block -- backbone, sequential Markov drafting, confidence -- equals our reference on the converted output;
each misreading of :meth:`specfmt.algorithms.dspark.DSpark.readings` (SpecForge's own ``spec_generate`` reading, one slot
later, among them) does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specfmt.algorithms import get
from specfmt.convert import convert
from specfmt.converters import Options
from specfmt.detect import detect
from specfmt.errors import SpecfmtError
from specfmt.validation.static import validate_static
from speculators_env import FLOAT64
from test_dflash_convert import H, MASK, N, VERIFIER, zlab

V, R, B, IDS = 2048, 16, 4, [1, 3, 5]
DC = {"attention_mode": "gqa", "confidence_head_alpha": 1.0, "confidence_head_with_markov": True, "enable_confidence_head": True,
      "markov_head_type": "vanilla", "markov_rank": R, "projector_type": "dspark"}


def native(folder: Path, heads: dict | None = None, drop: tuple[str, ...] = (), **dc_more) -> dict:
    """A SpecForge DSpark checkpoint (random bfloat16 weights): :func:`test_dflash_convert.zlab`'s DFlash draft, the heads'
    tensors (``heads`` replaces or adds some, ``drop`` removes some) and the heads' fields in ``dflash_config``
    (``dc_more``; None removes a key)."""
    g = torch.Generator().manual_seed(1)
    r = lambda *s: (0.05 * torch.randn(*s, generator=g)).to(torch.bfloat16)  # noqa: E731
    dc = {k: v for k, v in {**DC, **dc_more}.items() if v is not None}
    width = H + (dc.get("markov_rank", R) if dc.get("confidence_head_with_markov") else 0)
    t = {"markov_head.markov_w1.weight": r(V, R), "markov_head.markov_w2.weight": r(V, R), "confidence_head.proj.weight": r(1, width),
         "confidence_head.proj.bias": r(1)}
    t = {k: v for k, v in {**t, **(heads or {})}.items() if k not in drop}
    tensors = zlab(folder, ids=IDS, block=B, extra=t, architectures=["DSparkDraftModel"], auto_map={"AutoModel": "dspark.DSparkDraftModel"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dflash_config"].update(dc)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return tensors


def test_inspect_names_it_and_the_conversion_keeps_every_tensor_and_writes_every_slot_proposing(tmp_path):
    tensors = native(tmp_path / "src")
    d = detect(tmp_path / "src")
    assert (d.format, d.layout, d.candidates) == ("dspark", "specforge", ["dspark"]) and not d.served
    res = convert("auto", str(tmp_path / "src"), tmp_path / "out", VERIFIER)
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(out) == sorted(tensors) and all(torch.equal(out[n], tensors[n]) for n in tensors)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["architectures"] == ["DSparkSpeculator"]
    assert [cfg["aux_hidden_state_layer_ids"], cfg["mask_token_id"], cfg["block_size"], cfg["draft_vocab_size"]] == [[i + 1 for i in IDS], MASK, B, V]
    assert cfg["sample_from_anchor"] is True and cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == B
    assert {k: cfg[k] for k in ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")} == \
        {"markov_rank": R, "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True}
    assert not {"attention_mode", "confidence_head_alpha", "projector_type", "dflash_config"} & set(cfg)
    notes = " ".join(res.plan.notes)
    assert "anchor + j + 1" in notes and "vLLM's DSpark reader builds full-attention layers non-causal" in notes
    assert "vLLM builds all layers causal" not in notes  # DFlash's note is not DSpark's reader
    rep = validate_static(tmp_path / "out", VERIFIER)
    assert rep.ok, [(c.name, c.summary) for c in rep.checks if c.status == "fail"]


def _cfg(tmp_path: Path, name: str, opts: Options | None = None, **kw) -> dict:
    native(tmp_path / name, **kw)
    return convert("dspark", str(tmp_path / name), tmp_path / f"{name}-out", VERIFIER, opts=opts).config


def test_absent_head_fields_take_specforges_defaults_and_each_field_changes_the_output(tmp_path):
    """SpecForge's defaults (``_init_draft_head``): ``enable_confidence_head`` = ``confidence_head_alpha`` > 0,
    ``confidence_head_with_markov`` false -- not speculators' (true, true)."""
    plain = _cfg(tmp_path, "plain", confidence_head_with_markov=None, enable_confidence_head=None)
    assert plain["enable_confidence_head"] is True and plain["confidence_head_with_markov"] is False  # proj [1, H]
    off = _cfg(tmp_path, "off", confidence_head_alpha=0.0, enable_confidence_head=None, drop=("confidence_head.proj.weight", "confidence_head.proj.bias"))
    assert off["enable_confidence_head"] is False
    assert _cfg(tmp_path, "k", opts=Options(speculative_tokens=B))["block_size"] == B


@pytest.mark.parametrize("kw, opts, message", [
    ({"projector_type": "domino"}, None, "dflash_config.projector_type='domino': SpecForge's DSparkDraftModel requires 'dspark'"),
    ({"attention_mode": "mha"}, None, "dflash_config.attention_mode 'mha' with 4 query and 2 key/value heads"),
    ({"attention_mode": "mla"}, None, "dflash_config.attention_mode 'mla' is neither gqa nor mha"),
    ({"confidence_head_alpha": "high"}, None, "dflash_config.confidence_head_alpha is 'high'"),
    ({"markov_head_type": "gated"}, None, "dflash_config.markov_head_type is 'gated': vLLM 0.30-0.33 builds the vanilla head alone"),
    ({"markov_rank": None}, None, "dflash_config.markov_rank is None: SpecForge builds no Markov head"),
    ({"pure_draft_prefix_len": 2}, None, "dflash_config.pure_draft_prefix_len=2"),  # DFlash's reading of the rest
    ({"window": 3}, None, "dflash_config has fields this converter does not know: ['window']"),
    ({}, Options(speculative_tokens=B - 1), f"--speculative-tokens {B - 1}, but a block of {B} proposes {B}"),
    ({"drop": ("markov_head.markov_w2.weight",)}, None, f"markov_head.markov_w2.weight is missing, but this config needs [{V}, {R}]"),
    ({"markov_rank": 8}, None, f"markov_head.markov_w1.weight is [{V}, {R}], but this config needs [{V}, 8]"),
    ({"confidence_head_with_markov": False, "heads": {"confidence_head.proj.weight": torch.zeros(1, H + R, dtype=torch.bfloat16)}}, None, f"confidence_head.proj.weight is [1, {H + R}], but this config needs [1, {H}]"),
])
def test_what_changes_the_forward_unmodelled_is_refused_in_one_line(tmp_path, kw, opts, message):
    native(tmp_path / "src", **kw)
    with pytest.raises(SpecfmtError) as e:
        convert("dspark", str(tmp_path / "src"), tmp_path / "out", VERIFIER, opts=opts)
    assert message in e.value.one_line() and "\n" not in e.value.one_line(), e.value.one_line()
    assert not (tmp_path / "out").exists()


def test_confidence_tensors_of_a_disabled_head_are_not_written_silently(tmp_path):
    """``enable_confidence_head`` false with ``confidence_head.*`` present: the output would hold tensors no reader loads."""
    native(tmp_path / "src", enable_confidence_head=False)
    with pytest.raises(SpecfmtError) as e:
        convert("dspark", str(tmp_path / "src"), tmp_path / "out", VERIFIER)
    assert "confidence_head.proj" in e.value.one_line()


# --------------------------------------------------------------------------- SpecForge's own model

SPECFORGE = FLOAT64 + r"""
import json, sys, types, torch
from safetensors.torch import load_file
src, draft, inputs, out = sys.argv[1:5]
sys.path.insert(0, src)
for name in ("specforge", "specforge.modeling", "specforge.modeling.draft"):  # the package __init__s pull in training deps
    m = types.ModuleType(name); m.__path__ = [src + "/" + name.replace(".", "/")]; sys.modules[name] = m
from transformers.models.qwen3 import Qwen3Config
from specforge.modeling.draft.dspark import DSparkDraftModel
cfg = Qwen3Config(**json.loads(open(draft + "/config.json").read()))
cfg._attn_implementation = "sdpa"
model = DSparkDraftModel(cfg).double().eval()
model.load_state_dict({k: v.double() for k, v in load_file(draft + "/model.safetensors").items()}, strict=True)
float64_like_transformers(model, cfg)  # transformers' rotary tables and RMSNorm are float32 whatever the dtype (FLOAT64)
x = torch.load(inputs)
T, Bk = x["target_hidden"].shape[0], x["noise"].shape[0]
with torch.no_grad():
    h = model(position_ids=torch.arange(T + Bk)[None], noise_embedding=x["embed"][x["noise"]][None], target_hidden=x["target_hidden"][None])
    base = h @ x["head"].T
    ids, logits = model.markov_head.sample_block_tokens(base, first_prev_token_ids=x["noise"][:1], hidden_states=h)
    prev = torch.cat([x["noise"][:1][None], ids[:, :-1]], 1)
    conf = model.predict_confidence(h, prev_token_ids=prev)
torch.save({"ids": ids[0], "logits": logits[0], "conf": conf[0]}, out)
"""


@pytest.fixture(scope="module")
def run_specforge():
    """``run_specforge(*args)``: :data:`SPECFORGE` run with ``args`` after the folder holding the ``specforge`` package --
    ``SPECFORGE_SRC`` (a checkout) when set, else SpecForge 0.2.0 from PyPI in its test env (built on first use,
    ``tests/sglang_env.py``). Never a skip: SpecForge installs and imports on the CPU."""
    src = os.environ.get("SPECFORGE_SRC")
    if src:
        assert (Path(src) / "specforge" / "modeling" / "draft" / "dspark.py").is_file(), f"SPECFORGE_SRC={src} holds no specforge/modeling/draft/dspark.py"
        return lambda *args: subprocess.run([sys.executable, "-c", SPECFORGE, src, *map(str, args)], capture_output=True, text=True, timeout=300)
    from sglang_env import sglang_env

    env = sglang_env()  # holds SpecForge 0.2.0 beside SGLang, its trainer's engine
    return lambda *args: env.run("-c", SPECFORGE, env.root, *args)


def test_specforges_dspark_draft_model_equals_the_reference_on_the_converted_output_and_each_misreading_does_not(run_specforge, tmp_path):
    from specfmt.algorithms.reference import VerifierStates

    native(tmp_path / "src")
    convert("dspark", str(tmp_path / "src"), tmp_path / "out", VERIFIER)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    tensors = {k: v.double() for k, v in load_file(str(tmp_path / "out" / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(3)
    embed, head = (s * torch.randn(V, H, generator=g, dtype=torch.float64) for s in (0.5, 0.3))  # the verifier's embedding and lm_head
    tokens = [5, 9, 11, 3, 40, 7, 21]
    T = len(tokens) - 1
    states = VerifierStates([torch.randn(T, H, generator=g, dtype=torch.float64) for _ in range(N + 1)], torch.zeros(T, V, dtype=torch.float64))
    torch.save({"target_hidden": torch.cat([states.hidden[i + 1][:T] for i in IDS], -1), "noise": torch.tensor([tokens[-1]] + [MASK] * (B - 1)),
                "embed": embed, "head": head}, tmp_path / "inputs.pt")
    r = run_specforge(tmp_path / "src", tmp_path / "inputs.pt", tmp_path / "theirs.pt")
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = torch.load(tmp_path / "theirs.pt")
    algo = get("dspark")
    readings = algo.readings(cfg, N)
    ids, logits, conf = algo.proposer(readings[0], tensors, embed, head).drafted(tokens, states, B)
    assert (logits - theirs["logits"]).abs().max() < 1e-6 and ids.tolist() == theirs["ids"].tolist()
    assert (conf - theirs["conf"]).abs().max() < 1e-6  # SpecForge returns it .float(): float32 rounding, ~6e-8
    for reading in readings[1:]:  # taps ± 1, mask token, causal block, anchor sampling (SpecForge's spec_generate), no Markov head
        other = algo.proposer(reading, tensors, embed, head).block_logits(tokens, states, B)
        assert other.shape != theirs["logits"].shape or (other - theirs["logits"]).abs().max() > 1e-3, reading.label


def _releases() -> list[str]:
    from test_dspark import RELEASES

    return list(RELEASES)


@pytest.mark.parametrize("release", _releases())
def test_each_release_reads_the_converted_specforge_draft_as_its_training_meant(tmp_path, release):
    """vLLM 0.30-0.33's own ``update_dspark`` on the output: Qwen3DSparkModel, SpecForge's ids back as ``target_layer_ids``,
    every slot proposing (``dspark_bonus_anchor`` false), the heads' fields at the top level where ``qwen3_dspark.py`` reads them."""
    from test_dspark import release_algos

    cfg = _cfg(tmp_path, "src")
    out: dict = {}
    release_algos(release).update_dspark(cfg, out)
    assert out["architectures"] == ["Qwen3DSparkModel"] and out["target_layer_ids"] == IDS
    assert out["sample_from_anchor"] is True and out["dspark_bonus_anchor"] is False
    assert [out["markov_rank"], out["markov_head_type"], out["mask_token_id"], out["block_size"]] == [R, "vanilla", MASK, B]
    assert out["enable_confidence_head"] is True and out["confidence_head_with_markov"] is True
