"""The real-config corpus (issue 18): published draft configs, weights of the published shapes.

Each record of ``tests/data/real_configs`` holds a config.json as published (with its source URL
and how close the text is to the Hub file), the checkpoint's tensor names, shapes, dtypes and
file format, the verifier's sizes, and the expected outcome. :mod:`real_configs` builds it as
zero-filled sparse files. Every record goes through ``inspect``, ``--from auto`` (or the ``--from``
the files cannot decide, EAGLE-1 vs HASS), the conversion plan with all its checks, and for a
conversion ``validate`` on the planned output; the outcome -- tap ids, norm order, head counts,
dtypes, draft vocabulary, or the refusal's reason -- is asserted. A record whose tap ids do not
say their convention (``expect.tap_ids``: SpecForge/ModelOpt ``eagle_config`` ids) is refused without
``--tap-ids``, naming both readings, and converted with it. Two records also run the whole
``specfmt convert`` and ``specfmt validate`` commands (the others would only re-hash gigabytes of
zeros: the full corpus is measured by ``benchmarks/real_configs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import real_configs as rc
from conftest import run_cli
from sparse_weights import write_safetensors
from specfmt.convert import open_plan, with_provenance
from specfmt.converters import Options
from specfmt.detect import detect
from specfmt.errors import SpecfmtError
from specfmt.validation.static import validate_static

#: records converted with the full commands in CI (the smallest two of different layouts)
FULL = ["specforge--configs--qwen3-30B-A3B-eagle3.1", "specforge--configs--gpt-oss-120B-eagle3"]


def test_corpus_has_30_records_each_with_its_source():
    assert len(rc.RECORDS) >= 30
    for slug in rc.RECORDS:
        rec = rc.load(slug)
        assert rec["source_url"] and rec["evidence"] and rec["config"] and rec["weights"]["tensors"], slug
        assert rec["expect"]["outcome"] in ("converted", "refused"), slug


def write_planned(opened, out: Path) -> None:
    """The planned output as a folder: the config with its provenance block, the planned tensors
    (sparse zeros; the vocabulary map copied from the source), as ``convert`` would write them."""
    plan, reader = opened.plan, opened.reader
    out.mkdir()
    config = with_provenance(plan, opened.src, {f: "0" * 64 for f in ["config.json", *reader.files]})
    (out / "config.json").write_text(json.dumps(config))
    shapes = plan.output_shapes()
    data = {m.dst: reader.read_bytes(m.src) for m in plan.written if m.dst in ("d2t", "t2d")}
    write_safetensors(out / "model.safetensors", {n: (list(s), dt) for n, (s, dt) in shapes.items()}, data)


@pytest.mark.parametrize("slug", rc.RECORDS)
def test_record(slug, tmp_path):
    rec = rc.load(slug)
    exp = rec["expect"]
    src, ver = rc.build(slug, tmp_path)
    d = detect(src)
    assert f"{d.format}/{d.layout}" == exp["inspect"]
    if exp["outcome"] == "refused":
        with pytest.raises(SpecfmtError) as e:
            with open_plan(exp["from"], str(src), str(ver)):
                pass
        assert e.value.one_line().startswith(exp["reason"])
        if d.served:  # a format no converter reads is named, with how vLLM serves it
            assert d.served in e.value.one_line()
        return
    if exp.get("tap_ids"):  # ids of a convention the file does not fix: the user names it
        ids = (rec["config"].get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        with pytest.raises(SpecfmtError) as e:
            with open_plan(exp["from"], str(src), str(ver)):
                pass
        line = e.value.one_line()
        assert f"{ids}:" in line and f"vLLM ids {[i + 1 for i in ids]}" in line and f"layer inputs ({ids})" in line and "--tap-ids layer-output" in line
    if exp.get("mask_token_flag") is not None:  # a mask token the config does not record: the user states it
        with pytest.raises(SpecfmtError) as e:
            with open_plan(exp["from"], str(src), str(ver), opts=Options(tap_ids=exp.get("tap_ids"))):
                pass
        assert e.value.one_line().startswith("mask_token_id is None: vLLM reads it as pard_token") and "--mask-token-id" in e.value.one_line()
    with open_plan(exp["from"], str(src), str(ver), opts=Options(tap_ids=exp.get("tap_ids"), mask_token_id=exp.get("mask_token_flag"))) as opened:
        plan = opened.plan
        cfg = plan.config
        tlc = cfg.get("transformer_layer_config") or cfg
        assert cfg["speculators_model_type"] == exp["algorithm"]
        assert (cfg.get("dtype") or tlc.get("dtype")) == exp["dtype"]
        assert sorted({dt for _, dt in plan.output_shapes().values()}) == exp["written_dtypes"]
        if exp["algorithm"] == "peagle":
            assert cfg["mask_token_id"] == exp["mask_token_flag"] and tlc["num_hidden_layers"] == exp["num_hidden_layers"]
        if exp["algorithm"] in ("eagle3", "peagle"):
            assert cfg["eagle_aux_hidden_state_layer_ids"] == exp["taps"]
            assert cfg["draft_vocab_size"] == exp["draft_vocab_size"]
            assert {k: cfg.get(k, False) for k in exp["norms"]} == exp["norms"]
        if exp["algorithm"] in ("eagle", "eagle3", "peagle"):
            assert [tlc["num_attention_heads"], tlc["num_key_value_heads"], tlc["head_dim"]] == exp["heads"]
        if exp["algorithm"] == "eagle":
            assert tlc["attention_bias"] is exp["attention_bias"]
            bias = [m for m in plan.moves if m.src == "fc.bias"]
            # the built fc.bias is zero: dropped, never folded
            assert all(m.action == "drop" and "zeros" in m.reason for m in bias) and not plan.derived
        if exp["algorithm"] == "dflash":
            assert [cfg["aux_hidden_state_layer_ids"], cfg["mask_token_id"], cfg["block_size"]] == [exp["taps"], exp["mask_token_id"], exp["block_size"]]
            assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == exp["block_size"] - 1 and cfg["sliding_window_non_causal"] is True
        if exp["algorithm"] == "dspark":  # SpecForge's DSpark: DFlash's backbone reading, every slot proposing, the heads' fields
            assert [cfg["aux_hidden_state_layer_ids"], cfg["mask_token_id"], cfg["block_size"]] == [exp["taps"], exp["mask_token_id"], exp["block_size"]]
            assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == exp["block_size"] and cfg["sample_from_anchor"] is True
            assert [cfg["markov_rank"], cfg["markov_head_type"], cfg["draft_vocab_size"]] == [exp["markov_rank"], "vanilla", rec["verifier"]["vocab_size"]]
            assert [cfg["enable_confidence_head"], cfg["confidence_head_with_markov"]] == exp["confidence_head"]
            assert set(plan.output_shapes()) == set(rec["weights"]["tensors"])  # every tensor kept, none added
        if exp["algorithm"] == "medusa":
            assert [cfg["num_heads"], cfg["num_hidden_layers"], cfg["medusa_fc_bias"]] == exp["medusa"]
        write_planned(opened, tmp_path / "out")
    rep = validate_static(tmp_path / "out", str(ver))
    assert rep.ok, [(c.name, c.summary) for c in rep.checks if c.status == "fail"]


@pytest.mark.parametrize("slug", FULL)
def test_record_full_commands(slug, tmp_path):
    """``specfmt inspect``, ``convert --from auto`` and ``validate`` as a user runs them, on published shapes."""
    src, ver = rc.build(slug, tmp_path)
    exp = rc.load(slug)["expect"]
    r = run_cli("inspect", src)
    assert r.returncode == 0 and exp["inspect"].split("/")[0] in r.stdout
    tap_ids = ["--tap-ids", exp["tap_ids"]] if exp.get("tap_ids") else []
    r = run_cli("convert", "--from", "auto", src, "-o", tmp_path / "out", "--verifier", ver, *tap_ids)
    assert r.returncode == 0, r.stderr
    if exp.get("taps"):
        assert json.loads((tmp_path / "out" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == exp["taps"]
    r = run_cli("validate", tmp_path / "out", "--verifier", ver)
    assert r.returncode == 0, r.stdout + r.stderr
