"""`specfmt validate --run` without vLLM: the EAGLE-3 reference, training-time test, prompts,
misreading variants, and every deliberately broken checkpoint caught with the right cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import WORLD, tree_digest
from specfmt.cli import app
from specfmt.converters import Options
from specfmt.convert import convert
from specfmt.errors import InputError
from specfmt.algorithms.eagle3 import draft_module as Eagle3Draft, eagle3_proposer
from specfmt.algorithms.eagle3 import eagle3_ttt_loss, ttt_mask
from specfmt.validation.run import VALIDATION_FILE, load_prompts, validate_run, variants, vllm_weight_mismatches
from specfmt.validation.vllm_run import VLLMRun

#: a short run: 8 held-out prompts x 24 tokens
FEW = 8
TOKENS = 24


def tiny_cfg(**kw):
    cfg = {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5,
                                     "rope_theta": 10000.0},
        "draft_vocab_size": 30, "eagle_aux_hidden_state_layer_ids": [0, 1, 2], "norm_before_residual": False,
    }
    cfg.update(kw)
    return cfg


def random_draft(cfg, seed=0):
    torch.manual_seed(seed)
    d = Eagle3Draft(cfg).double()
    with torch.no_grad():
        for n, p in d.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        if hasattr(d, "d2t"):
            used = torch.randperm(cfg["transformer_layer_config"]["vocab_size"])[: cfg["draft_vocab_size"]].sort().values
            d.d2t.copy_(used - torch.arange(len(used)))
            d.t2d.zero_()
            d.t2d[used] = True
    return d.eval()


# --------------------------------------------------------------------------- training-time test


@pytest.mark.parametrize("variant", [{}, {"norm_before_residual": True, "norm_output": True}, {"fc_norm": True}, {"norm_before_fc": True}])
def test_ttt_step_s_is_the_inference_chain_started_s_positions_earlier(variant):
    """Step s of the unrolled training pass at position t gives the logits the chain drafted from
    base t-s gives at its (s+1)-th draft token: what vLLM will run is what the trainer trains."""
    cfg = tiny_cfg(**variant)
    draft = random_draft(cfg)
    B, T, H = 1, 10, 32
    ids = torch.randint(0, 50, (B, T))
    aux = torch.randn(B, T, 3 * H, dtype=torch.float64)
    embed = torch.randn(50, H, dtype=torch.float64)
    captured = []
    orig = draft.forward

    def spy(*a, **k):
        out = orig(*a, **k)
        captured.append(out[0].detach())
        return out

    draft.forward = spy
    eagle3_ttt_loss(draft, embed, ids, aux, torch.randn(B, T, 50, dtype=torch.float64), ttt_steps=3)
    draft.forward = orig
    # inference: base b reads ids[1..b+1] with the verifier's states up to b, then its own feedback
    for s in range(3):
        for t in range(s, T - 1):
            b = t - s
            hidden = draft.combine(aux[:, : b + 1])
            tok = ids[:, 1: b + 2]
            for j in range(s + 1):
                logits, fb, _ = draft(embed[tok], hidden, torch.arange(tok.shape[1]))
                if j < s:
                    hidden = torch.cat([hidden, fb[:, -1:]], dim=1)
                    tok = torch.cat([tok, ids[:, b + 2 + j: b + 3 + j]], dim=1)
            torch.testing.assert_close(captured[s][:, t], logits[:, -1], rtol=1e-9, atol=1e-9)


def test_ttt_mask_rows_always_see_their_own_key():
    m = ttt_mask(6, 2)
    assert m.shape == (6, 18) and bool(m.any(1).all())
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 6 + 3, 12 + 4]


# --------------------------------------------------------------------------- reference pieces


def test_proposer_maps_draft_ids_through_d2t():
    cfg = tiny_cfg()
    draft = random_draft(cfg)
    from specfmt.algorithms.reference import VerifierStates

    states = VerifierStates([torch.randn(4, 32, dtype=torch.float64) for _ in range(4)], torch.randn(4, 50, dtype=torch.float64))
    embed = torch.randn(50, 32, dtype=torch.float64)
    got = eagle3_proposer(draft, embed)([3, 4, 5, 6, 7], states, 3)
    used = set(draft.t2d.nonzero().flatten().tolist())
    assert len(got) == 3 and set(got) <= used
    i = eagle3_proposer(draft, embed, targets=torch.arange(30))([3, 4, 5, 6, 7], states, 1)[0]  # the raw draft id
    assert got[0] == i + int(draft.d2t[i]) and got[0] != i


def full_pass_eagle3(draft, embed):
    """EAGLE-3 chain drafting written plainly: the whole prefix through the draft for every drafted token (no cache)."""

    def propose(tokens, states, k):
        hidden = draft.combine(torch.cat([states.hidden[j] for j in draft.taps], dim=-1))[None]
        ids, out = list(tokens[1:]), []
        for _ in range(k):
            logits, feedback, _ = draft(embed[torch.tensor(ids)][None], hidden, torch.arange(len(ids)))
            out.append(int(draft.target_ids()[int(logits[0, -1].argmax())]))
            ids.append(out[-1])
            hidden = torch.cat([hidden, feedback[:, -1:]], dim=1)
        return out

    return propose


#: (sequence, tokens kept) per call: chains that move on by 1-4 tokens, a step back (a cut cache), a repeat
CALLS = [(0, 5), (1, 3), (0, 6), (1, 7), (0, 9), (1, 8), (0, 7), (2, 4), (0, 7), (2, 6), (0, 12)]


@pytest.mark.parametrize("layer", ["llama", "sliding window 3", "qwen3", "norm_output"])
def test_eagle3_cached_batched_chains_draft_what_a_full_pass_drafts(layer):
    """The reference proposer keeps a KV cache per sequence and drafts for several at once (issue 19); every call
    must propose what running the whole prefix through the draft proposes, whatever the calls' order and lengths."""
    from specfmt.algorithms.reference import VerifierStates

    tlc = dict(tiny_cfg()["transformer_layer_config"], num_hidden_layers=2)  # layer 1 reads layer 0's output at every position
    if layer == "sliding window 3":
        tlc.update(layer_types=["sliding_attention", "full_attention"], sliding_window=3)
    if layer == "qwen3":
        tlc.update(model_type="qwen3")
    cfg = tiny_cfg(transformer_layer_config=tlc, norm_output=layer == "norm_output")
    draft = random_draft(cfg)
    torch.manual_seed(1)
    embed = torch.randn(50, 32, dtype=torch.float64)
    seqs = [torch.randint(0, 50, (14,)).tolist() for _ in range(3)]
    passes = [VerifierStates([torch.randn(14, 32, dtype=torch.float64) for _ in range(4)], torch.randn(14, 50, dtype=torch.float64)) for _ in seqs]
    chain, plain = eagle3_proposer(draft, embed), full_pass_eagle3(draft, embed)
    for i, n in CALLS:  # one sequence at a time
        assert chain(seqs[i][:n], passes[i].prefix(n - 1), 3) == plain(seqs[i][:n], passes[i].prefix(n - 1), 3), (i, n)
    assert len(chain._caches) == 3 and len(chain._caches[passes[0].source].tokens) == 12  # the calls did run from caches
    chain = eagle3_proposer(draft, embed)
    rounds = [[(0, 4), (1, 5), (2, 3)], [(0, 5), (1, 9), (2, 6)], [(1, 12), (0, 8)], [(2, 7), (0, 10), (1, 13)]]
    for calls in rounds:  # several per call, each with its own new positions
        got = chain.propose_many([(seqs[i][:n], passes[i].prefix(n - 1)) for i, n in calls], 4)
        assert got == [plain(seqs[i][:n], passes[i].prefix(n - 1), 4) for i, n in calls], calls
    # a chain that meets the states of another verifier pass starts over, even with the same tokens
    other = VerifierStates([torch.randn(14, 32, dtype=torch.float64) for _ in range(4)], torch.randn(14, 50, dtype=torch.float64))
    assert chain(seqs[0][:11], other.prefix(10), 3) == plain(seqs[0][:11], other.prefix(10), 3)


def test_variants_cover_taps_norm_order_and_vocab_mapping():
    cfg = tiny_cfg(eagle_aux_hidden_state_layer_ids=[2, 4, 5])
    vs = variants(cfg, 8)
    assert vs[0].cause is None and vs[0].cfg is cfg
    causes = [v.cause for v in vs[1:]]
    assert set(causes) == {"tap ids", "norm order", "vocab mapping"}
    taps = [v.cfg["eagle_aux_hidden_state_layer_ids"] for v in vs if v.cause == "tap ids"]
    assert [2, 4, 5] not in taps and [3, 5, 6] in taps and [1, 3, 4] in taps  # the default equals the written ids: not repeated
    assert variants({**cfg, "speculators_model_type": "medusa"}, 8)[1:] == []


def test_prompts_builtin_jsonl_and_chat(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(WORLD / "verifier")
    assert load_prompts(None, tok).source == "built-in"
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "def f(x):"}) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(InputError, match="no chat template"):
        load_prompts(str(f), tok)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    p = load_prompts(str(f), tok)
    assert p.texts == ["def f(x):", "<user>hi\n<assistant>"] and p.chat_template
    assert p.ids[0] == tok.encode("def f(x):") and p.ids[1] == tok.encode("<user>hi\n<assistant>", add_special_tokens=False)
    assert p.digest.startswith("sha256:") and p.digest != load_prompts(None, tok).digest
    f.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(InputError, match=r"p.jsonl:2"):
        load_prompts(str(f), tok)
    f.write_text('{"text": "a"}\n')
    with pytest.raises(InputError, match="prompt"):
        load_prompts(str(f), tok)


def test_weights_inside_vllm_are_compared_with_the_file():
    tensors = {"layers.0.self_attn.q_proj.weight": torch.ones(4, 8), "layers.0.self_attn.k_proj.weight": torch.ones(2, 8),
               "layers.0.self_attn.v_proj.weight": torch.ones(2, 8), "fc.weight": torch.full((8, 24), 0.5),
               "norm.weight": torch.ones(8), "d2t": torch.arange(5)}
    good = VLLMRun([], [], draft_linear_sums={"model.layers.0.self_attn.qkv_proj": [64.0, 64.0], "model.fc": [96.0, 96.0]},
                   draft_parameters={"model.norm.weight": [[8], 8.0], "model.fc.weight": [[0], 0.0], "draft_id_to_target_id": [[5], 10.0],
                                     "model.embed_tokens.weight": [[50, 8], 3.0]},
                   draft_shares={"embed_tokens": True})
    assert vllm_weight_mismatches(good, tensors) == []
    bad = VLLMRun([], [], draft_linear_sums={"model.layers.0.self_attn.qkv_proj": [64.0, 64.0], "model.fc": [0.0, 0.0],
                                             "model.layers.0.mlp.down_proj": [1.0, 9.0]},
                  draft_parameters={"model.norm.weight": [[8], 8.0], "model.layers.0.post_attention_layernorm.weight": [[8], 8.0]},
                  draft_shares={})
    found = vllm_weight_mismatches(bad, tensors)
    assert any(f.startswith("fc.weight: vLLM holds sum 0") for f in found)
    assert "layers.0.mlp.down_proj.weight: not in the file; vLLM keeps its initial value" in found
    assert "layers.0.post_attention_layernorm.weight: not in the file; vLLM keeps its initial value" in found
    assert len(found) == 3


# --------------------------------------------------------------------------- the shipped example, broken


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


@pytest.fixture(scope="module")
def few_prompts(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("prompts") / "few.jsonl"
    f.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:FEW]) + "\n")
    return f


def broken(example: Path, tmp_path: Path, *, cfg=None, tensors=None) -> Path:
    dst = tmp_path / "broken"
    dst.mkdir(parents=True)
    c = json.loads((example / "config.json").read_text())
    t = load_file(str(example / "model.safetensors"))
    if cfg:
        cfg(c)
    if tensors:
        tensors(t)
    (dst / "config.json").write_text(json.dumps(c, indent=2))
    save_file(t, str(dst / "model.safetensors"))
    return dst


def run_ref(folder: Path, prompts: Path):
    return validate_run(folder, prompts=str(prompts), max_tokens=TOKENS, use_vllm=False)


def status(res) -> dict[str, str]:
    return {c.name: c.status for c in res.report.checks}


def test_example_reference_run_passes_and_is_written(example, few_prompts):
    before = tree_digest(example)
    res = run_ref(example, few_prompts)
    st = status(res)
    assert res.report.ok, res.report.to_json()
    assert st["reference"] == st["variants"] == "pass" and st["vllm"] == "skip"
    assert res.reference["mean_acceptance_length"] > 1.5  # the shipped draft is trained
    # every misreading is tried; none is clearly better (neighbouring taps of this small verifier are nearly
    # interchangeable, so only a margin separates them; wrong vocabulary readings are never accepted)
    assert len(res.variants) == 6
    assert all(v["mean_acceptance_length"] < res.reference["mean_acceptance_length"] + 0.15 for v in res.variants)
    assert [v["mean_acceptance_length"] for v in res.variants if v["cause"] == "vocab mapping"] == [1.0, 1.0]
    written = json.loads((example / VALIDATION_FILE).read_text())
    assert written["passed"] and written["reference"] == res.reference and written["prompts"]["count"] == FEW
    after = tree_digest(example)
    assert {k: v for k, v in after.items() if k != VALIDATION_FILE} == before


@pytest.mark.parametrize("name,edit,cause,check", [
    ("taps", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]), "tap ids", "variants"),
    ("norm order", lambda c: c.update(norm_before_residual=True), "norm order", "variants"),
])
def test_misdescribed_config_is_caught_with_its_cause(example, few_prompts, tmp_path, name, edit, cause, check):
    res = run_ref(broken(example, tmp_path, cfg=edit), few_prompts)
    assert not res.report.ok and status(res)[check] == "fail"
    assert res.causes[0] == cause, res.causes
    c = next(c for c in res.report.checks if c.name == check)
    assert all(d.startswith(cause) for d in c.details)


def test_qwen3_label_on_a_draft_trained_without_q_k_norms_is_caught(example, few_prompts, tmp_path):
    """The shipped Llama-layer draft relabelled as Qwen3 layers, its q/k norm weights 1 (what a converter
    that filled the norms in would write): as written the norms rescale every attention score; the
    "q/k norms dropped" reading is the draft as it was trained, and clearly better (issue #18)."""
    def qwen3(c):
        c["transformer_layer_config"].update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])

    def norms(t):
        d = 32  # the example verifier's head_dim
        t["layers.0.self_attn.q_norm.weight"] = torch.ones(d, dtype=t["norm.weight"].dtype)
        t["layers.0.self_attn.k_norm.weight"] = torch.ones(d, dtype=t["norm.weight"].dtype)

    res = run_ref(broken(example, tmp_path, cfg=qwen3, tensors=norms), few_prompts)
    st = status(res)
    assert st["tensors"] == st["reference"] == "pass" and st["variants"] == "fail", res.report.to_json()
    assert res.causes[0] == "q/k norms", res.causes
    dropped = next(v for v in res.variants if v["cause"] == "q/k norms")
    # read without its norms, the relabelled draft is the shipped one again
    assert dropped["mean_acceptance_length"] == run_ref(example, few_prompts).reference["mean_acceptance_length"]


def test_d2t_written_as_absolute_ids_is_caught_as_vocab_mapping(example, few_prompts, tmp_path):
    def absolute(t):
        t["d2t"] = torch.arange(t["d2t"].numel()) + t["d2t"]

    res = run_ref(broken(example, tmp_path, tensors=absolute), few_prompts)
    st = status(res)
    assert st["vocab_map"] == "fail" and not res.report.ok
    assert res.causes == ["vocab mapping"]


def test_missing_tensor_is_caught_as_unloaded(example, few_prompts, tmp_path):
    res = run_ref(broken(example, tmp_path, tensors=lambda t: t.pop("layers.0.post_attention_layernorm.weight")), few_prompts)
    st = status(res)
    assert st["tensors"] == "fail" and st["reference"] == "fail"
    assert res.causes == ["unloaded tensors"]


@pytest.mark.parametrize("key,cause", [("norm_before_residual", "norm order"), ("eagle_aux_hidden_state_layer_ids", "tap ids")])
def test_keys_vllm_would_guess_are_caught_before_running(example, tmp_path, key, cause):
    res = validate_run(broken(example, tmp_path, cfg=lambda c: c.pop(key)), use_vllm=False)
    st = status(res)
    assert st["schema"] == "fail" and st["reference"] == "skip"
    assert res.causes == [cause]


def test_disagreement_with_vllm_names_the_reading_vllm_behaves_like(example, few_prompts, monkeypatch):
    """vLLM's figures equal the reference's under another norm order: the agreement check says so."""
    from specfmt.validation import run as vr

    flipped = run_ref(broken(example, example.parent / "flip-src", cfg=lambda c: c.update(norm_before_residual=True)), few_prompts)
    fig = flipped.reference

    def fake_generate(model, prompts, **kw):
        alone = "speculators_config" not in json.loads((Path(model) / "config.json").read_text())
        base = VLLMRun([[1] * TOKENS for _ in prompts], [""] * len(prompts), vllm_version="test", dtype="bfloat16")
        if alone:
            return base
        base.speculative_method, base.num_drafts, base.num_speculative_tokens = "eagle3", fig["num_drafts"], 3
        base.num_draft_tokens, base.num_accepted_tokens = fig["num_draft_tokens"], fig["num_accepted_tokens"]
        base.accepted_per_position = fig["accepted_per_position"]
        return base

    monkeypatch.setattr("specfmt.validation.vllm_run.generate", fake_generate)
    res = vr.validate_run(example, prompts=str(few_prompts), max_tokens=TOKENS, write=False)
    st = status(res)
    assert st["agreement"] == "fail" and st["vllm_exact"] == "pass"
    c = next(c for c in res.report.checks if c.name == "agreement")
    assert any("norm_before_residual true (norm order)" in d for d in c.details)
    assert "norm order" in res.causes


def test_cli_run_reports_side_by_side_and_honours_the_threshold(example, few_prompts):
    args = ["validate", str(example), "--run", "--no-vllm", "--prompts", str(few_prompts), "--max-tokens", str(TOKENS)]
    r = CliRunner().invoke(app, args, terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "mean acceptance length" in r.output and "reference (float32)" in r.output and "all checks passed" in r.output
    r = CliRunner().invoke(app, args + ["--min-acceptance-length", "3.5", "--json"], terminal_width=200)
    assert r.exit_code == 1
    data = json.loads(r.output)
    acc = next(c for c in data["checks"] if c["name"] == "acceptance")
    assert acc["status"] == "fail" and "< 3.5" in acc["summary"]
    r = CliRunner().invoke(app, args + ["--num-speculative-tokens", "2", "--json"], terminal_width=200)
    data = json.loads(r.output)
    assert data["num_speculative_tokens"] == 2 and len(data["reference"]["acceptance_rate_per_position"]) == 2


def test_cli_rejects_run_options_without_run(example):
    r = CliRunner().invoke(app, ["validate", str(example), "--min-acceptance-length", "2"])
    assert r.exit_code == 2 and "need --run" in r.output


# --------------------------------------------------------------------------- EAGLE-1 and Medusa


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_eagle1_and_medusa_reference_runs(kind, tmp_path, few_prompts):
    from builders import write_eagle1
    from builders_medusa import write_v01

    if kind == "eagle":
        src = write_eagle1(tmp_path / "src", hidden=128, vocab=2048, inter=384, heads=4, kv_heads=2, dtype=torch.float32, seed=3)
    else:
        src = write_v01(tmp_path / "src", hidden=128, vocab=2048, dtype=torch.float32)
    out = tmp_path / "out"
    convert(kind, str(src), out, str(WORLD / "verifier"), opts=Options(speculative_tokens=3) if kind == "medusa" else None)
    res = validate_run(out, prompts=str(few_prompts), max_tokens=TOKENS, use_vllm=False, num_speculative_tokens=2)
    st = status(res)
    assert st["reference"] == "pass" and st["variants"] == "pass", res.report.to_json()
    ref = res.reference
    assert len(ref["acceptance_rate_per_position"]) == 2 and ref["num_draft_tokens"] == 2 * ref["num_drafts"]
    assert res.variants == []  # no misreadings are tried for these algorithms


def test_run_without_a_reachable_verifier_fails(example, tmp_path):
    res = validate_run(example, verifier=str(tmp_path / "gone"), use_vllm=False, write=False)
    st = status(res)
    assert st["reference"] == "fail" and not res.report.ok
