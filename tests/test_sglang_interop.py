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

from sglang_drafts import VERIFIER, variant, verifier_embedding, world_eagle3
from sglang_driver import DRIVER
from sglang_env import STUB, sgl_env  # noqa: F401  (fixture)
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


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("sglang")
    world = world_eagle3(root / "world")
    drafts = {"world": world, **{n: variant(world, root / n, **kw) for n, kw in VARIANTS.items()}}
    drafts["own_embedding"] = variant(world, root / "own_embedding", dtype="float32", tlc={"dtype": "float32"},
                                      tensors={"embed_tokens.weight": verifier_embedding()}, seed=5)
    out = {}
    for name, draft in drafts.items():
        exported = export(str(draft), root / f"{name}-sglang").out
        cfg = json.loads((exported / "config.json").read_text())
        argv = list(sglang_serve_command(cfg, str(exported)).argv)
        out[name] = {"name": name, "draft": str(draft), "export": str(exported), "argv": argv[3:], "line": argv,
                     "taps": json.loads((draft / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"],
                     "k": cfg["specfmt_export"]["speculative_tokens"], "verifier_arch": "LlamaForCausalLM", "verifier_layers": 8}
    return out


@pytest.fixture(scope="module")
def report(sgl_env, cases, tmp_path_factory) -> dict:  # noqa: F811
    tmp = tmp_path_factory.mktemp("sglang-run")
    spec = {"cases": list(cases.values()), "verifier": str(VERIFIER), "port": 29500 + (hash(str(tmp)) % 400), "tap_probes": TAP_PROBES}
    (tmp / "cases.json").write_text(json.dumps(spec))
    r = sgl_env.run("-c", STUB + DRIVER, tmp / "cases.json", tmp / "report.json")
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((tmp / "report.json").read_text())


CASES = ["world", *VARIANTS, "own_embedding"]


@pytest.mark.parametrize("name", CASES)
def test_sglangs_registry_builds_llama_eagle3_and_load_weights_fills_every_parameter(report, name):
    r = report["cases"][name]
    assert r["class"] == "LlamaForCausalLMEagle3"
    assert r["unfilled"] == []
    from_file = {p for p, srcs in r["loaded_from"].items() if srcs}
    assert set(r["parameters"]) - from_file <= {"model.embed_tokens.weight"}  # from the verifier (set_embed) unless the file has one


@pytest.mark.parametrize("name", CASES)
def test_no_exported_tensor_is_skipped(report, name):
    r = report["cases"][name]
    assert r["yielded"] and r["skipped"] == []
    assert r["hot_token_id"] is (None if name == "full_vocab" else True)


@pytest.mark.parametrize("name", CASES)
def test_every_tensor_sglang_holds_equals_the_specfmt_drafts(report, name):
    held = report["cases"][name]["held"]
    assert held and all(v == 0.0 for v in held.values()), {k: v for k, v in held.items() if v != 0.0}


@pytest.mark.parametrize("name", CASES)
def test_sglangs_forward_equals_the_reference_in_float64(report, name):
    f = report["cases"][name]["forward"]
    assert max(f["float64"]) < 1e-9, f
    assert max(f["as_sglang_computes"]) < 1e-4, f  # SGLang's float32 RMSNorm and rotary tables
    assert min(f["misread"]) > 1e-3, f  # the comparison sees a misreading


@pytest.mark.parametrize("name", CASES)
def test_the_verifier_class_captures_the_drafts_taps_from_the_ids_written(report, cases, name):
    assert report["cases"][name]["captured"] == cases[name]["taps"]


@pytest.mark.parametrize("name", CASES)
def test_sglangs_parser_reads_the_serve_line_as_eagle3_with_the_export_and_its_steps(report, cases, name):
    r, c = report["cases"][name], cases[name]
    assert (r["algorithm"], r["is_eagle3"]) == ("EAGLE3", True)
    assert Path(r["draft_path"]) == Path(c["export"]) and Path(r["model_path"]) == VERIFIER.resolve()
    assert r["steps"] == [c["k"], 1, c["k"] + 1]
    raw = r["raw"]  # the line exactly as printed, through SGLang's argparse parser
    assert (raw["speculative_algorithm"], raw["speculative_draft_model_path"], raw["speculative_num_steps"]) == ("EAGLE3", c["export"], c["k"])
    assert shlex.join(c["line"]).startswith("python3 -m sglang.launch_server ")


def test_eagle_is_not_eagle3_in_sglang(report):
    """The accept-length-1.0 trap (SGLang PR #21272): the line must say EAGLE3."""
    assert report["parser"]["EAGLE"] is False


@pytest.mark.parametrize("arch", list(TAP_RULES))
def test_each_tap_rule_is_what_the_verifier_class_sglang_builds_does(report, arch):
    rows = report["tap_rules"][arch]
    assert len(rows) == len(TAP_PROBES) and all(theirs == ours for _, _, theirs, ours in rows), rows
