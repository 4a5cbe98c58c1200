"""specfmt's SGLang exports, proven by SGLang 0.5.23's own code (``tests/sglang_env.py``; driver:
``tests/sglang_driver.py``, run once for every case).

For the world's EAGLE-3 draft and each variant SGLang runs (EAGLE-3.1's norms, a full vocabulary, the
verifier's embedding carried, a draft narrower than its verifier), SGLang's model registry builds the class the
export names, its own ``load_weights`` reads the export through SGLang's own safetensors iterator, and the EAGLE
worker's ``set_embed`` gives it the verifier's embedding. Recorded on both sides: every SGLang parameter is
filled (all were NaN before), and by which file tensors; every file tensor was consumed (a loader was called for
it, or ``d2t`` became ``hot_token_id``). Then every parameter SGLang holds equals the specfmt draft's tensor
element by element (q/k/v and gate/up compared fused, as SGLang holds them).

**The forward.** SGLang's own forward of the draft runs on CPU with its ``torch_native`` attention backend
(``tests/sglang_driver.py``: a hand-built ``ForwardBatch`` of one extend over a KV cache of plain tensors), in
float64 on random token ids and tap states, and is compared with specfmt's reference fed the same inputs: the
logits and the state fed back agree within 1e-4 as SGLang computes (its RMSNorm and rotary tables are float32
whatever the dtype) and within 1e-9 once those two are float64 too, while the reference with
``norm_before_residual`` flipped is off by far more.

The serve line ``specfmt serve-command --engine sglang`` prints is parsed by SGLang's own parser
(``prepare_server_args``): the algorithm is ``EAGLE3`` (``SpeculativeAlgorithm.is_eagle3``; ``EAGLE`` is not,
the accept-length-1.0 trap), the draft and the verifier are the export's, the steps k, 1, k + 1. The tap ids
written are run through the verifier class's own ``set_eagle3_layers_to_capture`` and give the draft's taps,
and every rule of :data:`specfmt.algorithms.sglang.TAP_RULES` is checked against the class SGLang's registry
returns for that architecture.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from sglang_drafts import QWEN3_VERIFIER, VERIFIER, dflash_variant, eagle1_variant, variant, verifier_embedding, world_dflash, world_eagle1, world_eagle3
from sglang_driver import DRIVER
from sglang_env import STUB, sgl_env  # noqa: F401  (fixture)
from specfmt.algorithms.dflash import SGLANG_DFLASH_CAPTURE
from specfmt.algorithms.eagle import SGLANG_BEFORE_NORM, SGLANG_FINAL_NORMED
from specfmt.algorithms.sglang import TAP_RULES
from specfmt.export import export
from specfmt.serving import sglang_serve_command

#: the variants of the world's EAGLE-3 draft (``sglang_drafts.variant`` keywords); each is exported and loaded
VARIANTS = {
    "norm_before_fc": {"norm_before_fc": True, "seed": 1},
    "fc_norm+norm_output": {"fc_norm": True, "norm_output": True, "seed": 2},
    "full_vocab": {"draft_vocab_size": 2048, "seed": 3},
    "narrower": {"target_hidden_size": 128, "seed": 4, "tlc": {"hidden_size": 64, "intermediate_size": 192, "num_attention_heads": 2,
                                                                 "num_key_value_heads": 1, "head_dim": 32},
                 "tensors": {"embed_tokens.weight": torch.randn(2048, 64, generator=torch.Generator().manual_seed(6)).half()}},
}
#: ``[N, ids]`` probes of each verifier class's tap rule (first id 1 or not, largest id N or not)
TAP_PROBES = [[8, [1, 3, 4]], [8, [2, 4, 5]], [8, [0, 3, 7]], [8, [1, 4, 8]], [94, [1, 46, 90]], [94, [2, 47, 91]]]


#: per kind of draft: SGLang's class, ``--speculative-algorithm``, the parameters SGLang's worker fills from the verifier
#: (not from the file), and the ``SpeculativeAlgorithm`` test that must hold
KINDS = {
    "eagle3": ("LlamaForCausalLMEagle3", "EAGLE3", {"model.embed_tokens.weight"}, "is_eagle3"),
    "eagle": ("LlamaForCausalLMEagle", "EAGLE", {"model.embed_tokens.weight", "lm_head.weight"}, "is_eagle"),
    "dflash": ("DFlashDraftModel", "DFLASH", set(), "is_dflash"),
    "dflash2": ("DFlash2DraftModel", "DFLASH", set(), "is_dflash"),
    "dspark": ("DSparkDraftModel", "DSPARK", set(), "is_dspark"),
}
#: the DFLASH family's kinds
BLOCK = ("dflash", "dflash2", "dspark")


def _case(name: str, kind: str, draft: Path, root: Path, **more) -> dict:
    exported = root / f"{name}-sglang"
    if not exported.exists():
        export(str(draft), exported)
    cfg = json.loads((exported / "config.json").read_text())
    argv = list(sglang_serve_command(cfg, str(exported)).argv)
    mine = json.loads((draft / "config.json").read_text())
    taps = mine.get("eagle_aux_hidden_state_layer_ids", mine.get("aux_hidden_state_layer_ids"))
    block = kind in BLOCK
    return {"name": name, "kind": kind, "draft": str(draft), "export": str(exported), "argv": argv[3:], "line": argv, "taps": taps,
            "k": cfg["specfmt_export"]["speculative_tokens"], "verifier_arch": "Qwen3ForCausalLM" if block else "LlamaForCausalLM",
            "verifier_layers": 8, "verifier": str(QWEN3_VERIFIER if block else VERIFIER), **more}


#: the DFLASH family's drafts for the Qwen3 world (``sglang_drafts.dflash_variant`` keywords, the world's DFlash draft as base)
BLOCK_VARIANTS = {
    "dflash-two_layers": ("dflash", {"tlc": {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}, "seed": 1}),
    "dflash2": ("dflash2", {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 8, "seed": 2}),
    "dspark": ("dspark", {"k": 4, "sample_from_anchor": True, "markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": True,
                          "confidence_head_with_markov": True, "seed": 3}),
    "dspark-bonus": ("dspark", {"sample_from_anchor": False, "markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": False,
                                "confidence_head_with_markov": False, "seed": 4}),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("sglang")
    world = world_eagle3(root / "world")
    drafts = {"world": world, **{n: variant(world, root / n, **kw) for n, kw in VARIANTS.items()}}
    drafts["own_embedding"] = variant(world, root / "own_embedding", dtype="float32", tlc={"dtype": "float32"},
                                      tensors={"embed_tokens.weight": verifier_embedding()}, seed=5)
    out = {name: _case(name, "eagle3", draft, root) for name, draft in drafts.items()}
    eagle1 = world_eagle1(root / "eagle1")
    eagle1_drafts = {"eagle1": eagle1, "eagle1-hass": world_eagle1(root / "eagle1-hass", fc_bias=True),
                     "eagle1-two_layers": eagle1_variant(eagle1, root / "eagle1-two", num_hidden_layers=2, seed=1),
                     "eagle1-own_embedding": eagle1_variant(eagle1, root / "eagle1-own", dtype="float32", seed=2,
                                                            tensors={"embed_tokens.weight": verifier_embedding()})}
    out.update({name: _case(name, "eagle", draft, root) for name, draft in eagle1_drafts.items()})
    dflash = world_dflash(root / "dflash")
    out["dflash"] = _case("dflash", "dflash", dflash, root)
    for name, (kind, kw) in BLOCK_VARIANTS.items():
        out[name] = _case(name, kind, dflash_variant(dflash, root / name, kind, **kw), root,
                          ragged_verify_mode="cap-accept" if kw.get("enable_confidence_head") else "static")
    # the same DSpark export in SGLang's default ragged-verify mode (static), which builds no confidence head
    out["dspark-static"] = {**_case("dspark", "dspark", root / "dspark", root), "name": "dspark-static", "ragged_verify_mode": "static",
                            "load_only": True}
    return out


@pytest.fixture(scope="module")
def report(sgl_env, cases, tmp_path_factory) -> dict:  # noqa: F811
    tmp = tmp_path_factory.mktemp("sglang-run")
    spec = {"cases": list(cases.values()), "verifier": str(VERIFIER), "port": 29500 + (hash(str(tmp)) % 400), "tap_probes": TAP_PROBES}
    (tmp / "cases.json").write_text(json.dumps(spec))
    r = sgl_env.run("-c", STUB + DRIVER, tmp / "cases.json", tmp / "report.json")
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((tmp / "report.json").read_text())


EAGLE3_CASES = ["world", *VARIANTS, "own_embedding"]
EAGLE1_CASES = ["eagle1", "eagle1-hass", "eagle1-two_layers", "eagle1-own_embedding"]
BLOCK_CASES = ["dflash", *BLOCK_VARIANTS, "dspark-static"]
CASES = [*EAGLE3_CASES, *EAGLE1_CASES, *BLOCK_CASES]
#: what SGLang's default ragged-verify mode (static) does not build, so skips: DSpark's confidence head, which never changes a token
NOT_BUILT = {"dspark-static": ["confidence_head.proj.bias", "confidence_head.proj.weight"]}


@pytest.mark.parametrize("name", CASES)
def test_sglangs_registry_builds_the_class_and_load_weights_fills_every_parameter(report, cases, name):
    r, (cls, _, from_verifier, _) = report["cases"][name], KINDS[cases[name]["kind"]]
    assert r["class"] == cls
    assert r["unfilled"] == []
    from_file = {p for p, srcs in r["loaded_from"].items() if srcs}
    assert set(r["parameters"]) - from_file <= from_verifier  # the verifier's (the EAGLE worker's set_embed / set_embed_and_head)


@pytest.mark.parametrize("name", CASES)
def test_no_exported_tensor_is_skipped(report, cases, name):
    r = report["cases"][name]
    assert r["yielded"] and r["skipped"] == NOT_BUILT.get(name, [])
    assert r["hot_token_id"] is (None if name == "full_vocab" or cases[name]["kind"] != "eagle3" else True)


def test_sglangs_default_mode_builds_no_confidence_head_and_the_cap_accept_mode_loads_it(report):
    """DSpark's confidence head (acceptance estimates for SGLang's ragged verify; it never changes a drafted token) is built
    only outside the default SGLANG_RAGGED_VERIFY_MODE, static; in cap-accept its every parameter is filled from the export."""
    assert not any(p.startswith("confidence_head.") for p in report["cases"]["dspark-static"]["parameters"])
    loaded = report["cases"]["dspark"]["loaded_from"]
    assert loaded["confidence_head.proj.weight"] == ["confidence_head.proj.weight"] and loaded["confidence_head.proj.bias"] == ["confidence_head.proj.bias"]


def test_the_hass_draft_is_served_with_its_folded_biases_and_a_zero_fc_bias(report):
    """A HASS draft's fc.bias, folded into layer 0's q/k/v/o biases by convert, loads into SGLang's biased Llama layers; the
    export's zero fc.bias fills SGLang's fc bias (compared above with zeros, element by element)."""
    loaded = report["cases"]["eagle1-hass"]["loaded_from"]
    assert loaded["model.fc.bias"] == ["fc.bias"] and loaded["model.layers.0.self_attn.o_proj.bias"] == ["layers.0.self_attn.o_proj.bias"]
    assert sorted(loaded["model.layers.0.self_attn.qkv_proj.bias"]) == [f"layers.0.self_attn.{p}_proj.bias" for p in "kqv"]


@pytest.mark.parametrize("name", CASES)
def test_every_tensor_sglang_holds_equals_the_specfmt_drafts(report, name):
    held = report["cases"][name]["held"]
    assert held and all(v == 0.0 for v in held.values()), {k: v for k, v in held.items() if v != 0.0}


@pytest.mark.parametrize("name", [n for n in CASES if n != "dspark-static"])  # the same draft as dspark, loaded only
def test_sglangs_forward_equals_the_reference_in_float64(report, name):
    f = report["cases"][name]["forward"]
    assert max(f["float64"]) < 1e-9, f
    assert max(f["as_sglang_computes"]) < 1e-4, f  # SGLang's float32 RMSNorm and rotary tables
    assert min(f["misread"]) > 1e-3, f  # the comparison sees a misreading


@pytest.mark.parametrize("name", [*EAGLE3_CASES, *BLOCK_CASES])
def test_the_verifier_class_captures_the_drafts_taps_from_the_ids_written(report, cases, name):
    """EAGLE-3: set_eagle3_layers_to_capture on eagle_config's ids; the DFLASH family: set_dflash_layers_to_capture on
    dflash_config.target_layer_ids, each of the verifier class SGLang's registry builds."""
    assert report["cases"][name]["captured"] == cases[name]["taps"]


@pytest.mark.parametrize("name", [n for n in BLOCK_CASES if n != "dspark-static"])
def test_the_block_drafts_forward_proposals_and_heads_equal_the_reference(report, cases, name):
    """DFlash2's selector walk and DSpark's sequential Markov draft, through SGLang's own modules on SGLang's block hidden
    states, propose the reference's tokens; DSpark's base logits, Markov bias and confidence logits equal the reference's."""
    f, kind = report["cases"][name]["forward"], cases[name]["kind"]
    if kind == "dflash2":
        assert f["selector"]["sglang"] == f["selector"]["ours"] and len(f["selector"]["ours"]) == cases[name]["k"], f["selector"]
    if kind == "dspark":
        m = f["markov"]
        assert m["sglang"] == m["ours"] and len(m["ours"]) == cases[name]["k"], m
        assert max(m["base"], m["bias"], m.get("confidence", 0.0)) < 1e-9, m
        assert ("confidence" in m) is (name == "dspark")


@pytest.mark.parametrize("name", [n for n in BLOCK_CASES if n != "dspark-static"])
def test_sglangs_parser_and_resolution_read_the_block_serve_line(report, cases, name):
    """The line as printed through SGLang's argparse parser and prepare_server_args; then SGLang's own resolution of the
    algorithm (_handle_dflash / _handle_dspark), which for DSpark reads the export's gamma and stops unless the line's
    --speculative-num-draft-tokens is gamma + 1: the line passes, and one draft token fewer is refused."""
    r, c = report["cases"][name], cases[name]
    _, algorithm, _, test = KINDS[c["kind"]]
    assert (r["algorithm"], r["enum"], r[test]) == (algorithm, algorithm, True) and Path(r["draft_path"]) == Path(c["export"])
    assert r["raw"]["speculative_num_draft_tokens"] == c["k"] + 1 and Path(r["model_path"]) == QWEN3_VERIFIER.resolve()
    assert r["hook"] == "ok", r["hook"]
    if c["kind"] == "dspark":
        assert "gamma + 1" in r["hook_one_fewer"], r["hook_one_fewer"]


def test_each_dflash_tap_rule_is_what_the_verifier_class_sglang_builds_does(report):
    """Every class of SGLANG_DFLASH_CAPTURE captures id + 1 whatever the ids (the probes include PR #25454's first-id-1 case);
    Qwen2ForCausalLM has no set_dflash_layers_to_capture (the export refuses it, reason verifier)."""
    rows = report["dflash_capture"]
    assert set(rows) == {*SGLANG_DFLASH_CAPTURE, "Qwen2ForCausalLM"} and rows["Qwen2ForCausalLM"] is False
    for arch in SGLANG_DFLASH_CAPTURE:
        assert len(rows[arch]) == len(TAP_PROBES) and all(got == [i + 1 for i in ids] for _, ids, got in rows[arch]), (arch, rows[arch])


@pytest.mark.parametrize("name", [*EAGLE3_CASES, *EAGLE1_CASES])
def test_sglangs_parser_reads_the_serve_line_with_the_algorithm_the_export_and_its_steps(report, cases, name):
    r, c = report["cases"][name], cases[name]
    _, algorithm, _, test = KINDS[c["kind"]]
    assert (r["algorithm"], r["enum"], r[test], r["is_eagle3"]) == (algorithm, algorithm, True, algorithm == "EAGLE3")
    assert Path(r["draft_path"]) == Path(c["export"]) and Path(r["model_path"]) == VERIFIER.resolve()
    assert r["steps"] == [c["k"], 1, c["k"] + 1]
    raw = r["raw"]  # the line exactly as printed, through SGLang's argparse parser
    assert (raw["speculative_algorithm"], raw["speculative_draft_model_path"], raw["speculative_num_steps"]) == (algorithm, c["export"], c["k"])
    assert shlex.join(c["line"]).startswith("python3 -m sglang.launch_server ")


def test_sglangs_eagle_worker_feeds_an_eagle1_draft_the_verifiers_final_normed_state(report):
    """SGLang's LlamaForCausalLM (the world verifier, its own load_weights and forward on CPU) hands its logits processor the
    last hidden state after the final norm, which the processor stores for the EAGLE worker, and no
    hidden_states_before_norm (which it would prefer): the state specfmt's EAGLE-1 reference reads. Both run in float64 but
    for the rotary tables (transformers computes them in float32), hence 1e-5, against 1.8 for the state before the norm."""
    world = report["verifier_state"]["world"]
    assert world["after_norm"] < 1e-5 and world["before_norm"] > 1e-1 and "hidden_states_before_norm" not in world["kwargs"], world


def test_the_verifier_classes_read_for_eagle1_are_sglangs_and_pass_the_state_they_are_said_to(report):
    """Each architecture of SGLANG_FINAL_NORMED resolves in SGLang's registry to a class in the file named, whose module never
    passes hidden_states_before_norm; each of SGLANG_BEFORE_NORM does pass it (the export refuses those)."""
    state = report["verifier_state"]
    assert state["class_file"] == {a: f for a, f in {**SGLANG_FINAL_NORMED, **SGLANG_BEFORE_NORM}.items()}
    assert state["source"] == {**{a: False for a in SGLANG_FINAL_NORMED}, **{a: True for a in SGLANG_BEFORE_NORM}}


def test_eagle_is_not_eagle3_in_sglang(report):
    """The accept-length-1.0 trap (SGLang PR #21272): the line must say EAGLE3."""
    assert report["parser"]["EAGLE"] is False


@pytest.mark.parametrize("arch", list(TAP_RULES))
def test_each_tap_rule_is_what_the_verifier_class_sglang_builds_does(report, arch):
    rows = report["tap_rules"][arch]
    assert len(rows) == len(TAP_PROBES) and all(theirs == ours for _, _, theirs, ours in rows), rows
