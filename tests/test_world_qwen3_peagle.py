"""The Qwen3 world's P-EAGLE draft (``examples/world-qwen3/peagle-speculators``, issue 25): the world's EAGLE-3
draft plus ``mask_hidden`` and a mask token, trained for parallel drafting by ``make_world_qwen3.py --peagle``
with specfmt's P-EAGLE module, saved as speculators 0.9 saves a P-EAGLE draft.

* the layout is speculators' own (speculators loads it as ``PEagleDraftModel`` and saves the same bytes);
* the reference run (parallel drafting, k = 3) reproduces world.json and is clearly above a random draft of the
  same shape; the mask token matters; drafting it sequentially is recorded, not failed on (a serving mode);
* vLLM 0.32 (CPU) serves it in parallel (``vllm serve OUT``: ``PeagleQwen3ForCausalLM``, which its registry builds as ``Eagle3Qwen3ForCausalLM``, method ``eagle3``,
  ``parallel_drafting``), tokens equal to the verifier alone, per position within 0.1 of the reference; served
  in the explicit form without ``"parallel_drafting": true`` it runs sequentially and its figures leave the
  reference's tolerance and look like the reference's sequential reading -- the misreading is caught.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, assert_figures
from specfmt.validation.run import validate_run
from speculators_env import spec_env  # noqa: F401  (fixture)
from world_qwen3 import K, MANIFEST, MAX_TOKENS, WORLD, convert_draft, random_like, reference, saves_again, tensor_names

DRAFT = WORLD / "peagle-speculators"
EAGLE3 = WORLD / "eagle3-speculators"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_draft(DRAFT, tmp_path_factory.mktemp("peagleworld") / "draft")


@pytest.fixture(scope="module")
def random_draft(converted, tmp_path_factory):
    """The converted draft with every tensor but the verifier's embedding and the vocabulary map random
    (specfmt's module initialisation, seeded): what 'above a random draft' is measured against."""
    return random_like(converted, tmp_path_factory.mktemp("peaglerandom") / "draft", "peagle", keep=("embed_tokens.weight", "d2t", "t2d"))


def test_it_is_the_eagle3_draft_in_speculators_peagle_layout():
    assert sorted(p.name for p in DRAFT.iterdir()) == ["config.json", "config.py", "model.safetensors"]
    assert (DRAFT / "config.py").read_bytes() == (REPO / "examples" / "vendor" / "speculators-0.9.0-peagle-config.py").read_bytes()
    cfg, e3 = json.loads((DRAFT / "config.json").read_text()), json.loads((EAGLE3 / "config.json").read_text())
    assert (DRAFT / "config.json").read_text() == json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    changed = {k for k in cfg if cfg[k] != e3.get(k)}
    assert changed == {"architectures", "auto_map", "embed_requires_grad", "mask_token_id", "speculators_config", "speculators_model_type"}
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleDraftModel"] and cfg["mask_token_id"] == 2
    assert cfg["speculators_config"] == {**e3["speculators_config"], "algorithm": "peagle"}
    assert tensor_names(DRAFT / "model.safetensors") == tensor_names(EAGLE3 / "model.safetensors") | {"mask_hidden"}
    assert sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file()) < 15e6  # issue #18


def test_speculators_loads_it_as_its_peagle_draft_and_saves_the_same_bytes(spec_env, tmp_path):  # noqa: F811
    shown = saves_again(spec_env, DRAFT, tmp_path / "again", "m.config.speculators_model_type", "m.config.mask_token_id")
    assert shown[-3:] == ["PEagleDraftModel", "peagle", "2"]


def test_reference_figures_are_the_worlds_and_clearly_above_a_random_draft(converted, random_draft):
    """Parallel drafting (k = 3) on the 16 held-out prompts reproduces world.json; a random draft of the same shape is
    accepted almost never; the mask token matters; drafting sequentially is recorded but is not a rival reading."""
    res = reference(converted)
    st = {c.name: c.status for c in res.report.checks}
    assert res.report.ok and st["variants"] == "pass", res.report.to_json()
    got = {**res.reference, "k": res.k, "prompts": len(res.prompts.ids), "tokens": len(res.prompts.ids) * res.max_tokens}
    assert_figures(got, MANIFEST["peagle"]["heldout"], "qwen3 world, P-EAGLE")
    rnd = reference(random_draft).reference
    assert got["mean_acceptance_length"] >= 1.5 and rnd["mean_acceptance_length"] <= 1.1
    by_cause = {v["cause"]: v for v in res.variants}
    assert by_cause["mask token id"]["mean_acceptance_length"] < got["mean_acceptance_length"] - 0.1
    sequential = by_cause["parallel drafting"]["mean_acceptance_length"]
    assert sequential > got["mean_acceptance_length"] + 0.15  # started from an EAGLE-3 draft: better sequentially, only slower
    summary = next(c.summary for c in res.report.checks if c.name == "variants")
    assert "served without parallel drafting (sequential EAGLE-3)" in summary and "not compared" in summary


@pytest.mark.vllm
def test_vllm_serves_it_in_parallel_and_catches_it_served_sequentially(converted, random_draft):
    """One engine host for everything: ``validate --run`` (the draft as ``vllm serve OUT`` starts it, and the verifier
    alone), then a random draft of the same shape, then the draft in the explicit form without ``parallel_drafting``."""
    from specfmt.validation import vllm_run

    with vllm_run.engines() as host:  # the suite's shared host when one is open: count this test's engines
        before = host.engines
        res = validate_run(converted, prompts=str(WORLD / "prompts.jsonl"), max_tokens=MAX_TOKENS, num_speculative_tokens=K,
                           min_acceptance_length=1.5, write=False)
        ids = res.prompts.ids
        rnd = vllm_run.generate(str(random_draft), ids, max_tokens=MAX_TOKENS)
        seq = vllm_run.generate(str(WORLD / "verifier"), ids, max_tokens=MAX_TOKENS,
                                speculative_config={"model": str(converted), "method": "eagle3", "num_speculative_tokens": K})
        assert host.engines - before == 4
    print(f"\nP-EAGLE figures: reference {res.reference['mean_acceptance_length']} {res.reference['acceptance_rate_per_position']}; "
          f"vLLM {res.vllm['mean_acceptance_length']} {res.vllm['acceptance_rate_per_position']}; random draft in vLLM "
          f"{rnd.mean_acceptance_length:.4f} {rnd.accepted_per_position}/{rnd.num_drafts}; without parallel drafting in vLLM "
          f"{seq.mean_acceptance_length:.4f} {seq.accepted_per_position}/{seq.num_drafts}")
    st = {c.name: c.status for c in res.report.checks}
    assert res.report.ok, res.report.to_json()
    assert all(st[n] == "pass" for n in ("reference", "variants", "vllm", "vllm_exact", "vllm_weights", "agreement", "acceptance")), st
    ref, vl = res.reference, res.vllm
    assert vl["method"] == "eagle3" and vl["draft_class"] == "Eagle3Qwen3ForCausalLM" and vl["form"] == "auto" and vl["parallel_drafting"] is True
    gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
    assert len(gaps) == K and max(gaps) <= 0.1
    assert rnd.parallel_drafting is True and rnd.mean_acceptance_length <= 1.1 < vl["mean_acceptance_length"] - 0.4
    # served without parallel drafting: sequential, greedy output still the verifier's, figures off the reference's
    assert seq.parallel_drafting is False and seq.speculative_method == "eagle3" and seq.token_ids == rnd.token_ids
    seq_rates = [a / seq.num_drafts for a in seq.accepted_per_position]
    assert max(abs(a - b) for a, b in zip(seq_rates, ref["acceptance_rate_per_position"])) > 0.1
    sequential = next(v for v in res.variants if v["cause"] == "parallel drafting")["mean_acceptance_length"]
    assert abs(seq.mean_acceptance_length - sequential) < 0.1  # what the agreement check names as the look-alike
    recorded = MANIFEST["peagle_validate_run"]
    assert ref["mean_acceptance_length"] == recorded["reference"]["mean_acceptance_length"]
    assert abs(vl["mean_acceptance_length"] - recorded["vllm"]["mean_acceptance_length"]) <= 0.1
