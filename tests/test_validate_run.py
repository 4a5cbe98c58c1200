"""`specfmt validate --run` without vLLM: the EAGLE-3 reference, training-time test, prompts,
misreading variants, and every deliberately broken checkpoint caught with the right cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import NOT_HELD, WORLD, first_world_prompts, tree_digest, world_eagle3
from specfmt.cli import app
from specfmt.converters import Options
from specfmt.convert import convert
from specfmt.errors import InputError
from specfmt.algorithms.eagle3 import draft_module as Eagle3Draft, eagle3_proposer
from specfmt.algorithms.eagle3 import eagle3_ttt_loss, ttt_mask
from specfmt.validation.run import VALIDATION_FILE, load_prompts, validate_run, variants
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


@pytest.mark.parametrize("switch", [None, False, True])
def test_a_qwen3_sliding_layer_keeps_its_window_only_with_use_sliding_window(switch):
    """A Qwen3 draft's ``sliding_attention`` layer has the window transformers' ``Qwen3Config`` keeps: none unless
    ``use_sliding_window`` is true (the class default is false). vLLM's Qwen3 EAGLE-3 layer reads that config's
    ``sliding_window`` (``qwen3_eagle3.py``), so without the switch it attends in full, and so must the reference."""
    from transformers import Qwen3Config

    def logits(tlc_more):
        tlc = dict(tiny_cfg()["transformer_layer_config"], model_type="qwen3", num_hidden_layers=1, **tlc_more)
        draft = random_draft(tiny_cfg(transformer_layer_config=tlc))
        torch.manual_seed(2)
        embeds, hidden = torch.randn(1, 12, 32, dtype=torch.float64), torch.randn(1, 12, 32, dtype=torch.float64)
        with torch.no_grad():
            return draft(embeds, hidden, torch.arange(12))[0]

    sliding = {"layer_types": ["sliding_attention"], "sliding_window": 3, **({} if switch is None else {"use_sliding_window": switch})}
    kept = Qwen3Config(num_hidden_layers=1, **sliding).sliding_window
    assert kept == (3 if switch else None)
    full = logits({"layer_types": ["full_attention"]})
    got = logits(sliding)
    assert torch.equal(got, full) is (kept is None)
    assert not torch.allclose(logits({**sliding, "use_sliding_window": True}), full)  # the window does change the output here


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
    f.write_text('{"text": "a"}\n')  # the one data-file format: a text is a prompt (issue 35)
    assert load_prompts(str(f), tok).texts == ["a"]
    f.write_text('{"txt": "a"}\n')
    with pytest.raises(InputError, match="prompt"):
        load_prompts(str(f), tok)


# --------------------------------------------------------------------------- the shipped example, broken


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return world_eagle3(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def few_prompts(tmp_path_factory) -> Path:
    return first_world_prompts(tmp_path_factory.mktemp("prompts") / "few.jsonl", FEW)


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
    # interchangeable, so only a margin separates them; a wrong vocabulary reading is accepted by chance at most: 1 token
    # in the 182 drafts of each here, 1.0055)
    assert len(res.variants) == 6
    assert all(v["mean_acceptance_length"] < res.reference["mean_acceptance_length"] + 0.15 for v in res.variants)
    assert [v["mean_acceptance_length"] < 1.01 for v in res.variants if v["cause"] == "vocab mapping"] == [True, True]
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
    assert st["tensors"] == "fail" and st["reference"] == "skip"  # a static failure stops the run (issue 35)
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
        held_as_the_file(model, **kw)
        alone = "speculators_config" not in json.loads((Path(model) / "config.json").read_text())
        base = VLLMRun([[1] * TOKENS for _ in prompts], [""] * len(prompts), vllm_version="test", dtype="bfloat16")
        if alone:
            return base
        base.speculative_method, base.num_drafts, base.num_speculative_tokens = "eagle3", fig["num_drafts"], 3
        base.num_draft_tokens, base.num_accepted_tokens = fig["num_draft_tokens"], fig["num_accepted_tokens"]
        base.accepted_per_position = fig["accepted_per_position"]
        return base

    monkeypatch.setattr("specfmt.validation.vllm_run.vllm_available", lambda: True)  # a stand-in for it, installed or not
    monkeypatch.setattr("specfmt.validation.vllm_run.generate", fake_generate)
    res = vr.validate_run(example, prompts=str(few_prompts), max_tokens=TOKENS, write=False)
    st = status(res)
    assert st["agreement"] == "fail" and st["vllm_exact"] == "pass" and st["vllm_weights"] == "pass"
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
    assert st["verifier"] == "fail" and st["reference"] == "skip" and not res.report.ok  # the static check stops the run
    assert res.causes == ["verifier not reachable"]


# --------------------------------------------------------------------------- inputs first, progress, validation.json kept

#: the short runs below: 3 held-out prompts x 8 tokens
SHORT = 8


@pytest.fixture(scope="module")
def three_prompts(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("prompts") / "three.jsonl"
    f.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:3]) + "\n")
    return f


def _copy(src: Path, dst: Path, keep_validation: bool = False) -> Path:
    import shutil

    shutil.copytree(src, dst)
    if not keep_validation:
        (dst / VALIDATION_FILE).unlink(missing_ok=True)
    return dst


def held_as_the_file(model: str, dump_draft: str | None = None, **kw) -> None:
    """A stand-in engine's dump (``generate(..., dump_draft=)``): every tensor of the draft's file, under its own
    name, rounded to bfloat16 as vLLM's CPU build holds it, but those vLLM keeps no copy of (``NOT_HELD``); nothing
    for a model without a draft."""
    folder = Path(model)
    if dump_draft and "speculators_config" in json.loads((folder / "config.json").read_text()):
        tensors = load_file(str(folder / "model.safetensors"))
        save_file({n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in tensors.items() if n not in NOT_HELD}, dump_draft)


def _fake_vllm(monkeypatch) -> None:
    """vLLM replaced: the draft proposes 10 drafts of k=3 with 2 / 1 / 0 accepted per position, tokens equal with and
    without the draft, every weight as the file's."""
    def fake_generate(model, prompts, **kw):
        held_as_the_file(model, **kw)
        base = VLLMRun([[1] * SHORT for _ in prompts], [""] * len(prompts), vllm_version="test", dtype="float32")
        if "speculators_config" in json.loads((Path(model) / "config.json").read_text()):
            base.speculative_method, base.num_drafts, base.num_speculative_tokens = "eagle3", 10, 3
            base.num_draft_tokens, base.num_accepted_tokens, base.accepted_per_position = 30, 3, [2, 1, 0]
        return base

    monkeypatch.setattr("specfmt.validation.vllm_run.vllm_available", lambda: True)
    monkeypatch.setattr("specfmt.validation.vllm_run.generate", fake_generate)


def _run(folder: Path, prompts: Path, **kw):
    return validate_run(folder, prompts=str(prompts), max_tokens=SHORT, **kw)


@pytest.fixture(scope="module")
def measured(example, three_prompts, tmp_path_factory) -> tuple[Path, dict]:
    """The example measured with (a stand-in for) vLLM: its folder, holding validation.json, and that file."""
    draft = _copy(example, tmp_path_factory.mktemp("measured") / "draft")
    with pytest.MonkeyPatch.context() as mp:
        _fake_vllm(mp)
        res = _run(draft, three_prompts, tolerance=1.0)  # the agreement check is not what these tests are about
    assert res.report.ok and res.vllm is not None and res.reference is not None, res.report.to_json()
    return draft, json.loads((draft / VALIDATION_FILE).read_text())


def test_vllm_weights_compares_what_the_engine_holds_element_by_element(measured, example, three_prompts, tmp_path, monkeypatch):
    """validate --run asks the draft's engine (and no other) for its tensors and compares them with the file: k and v
    swapped inside vLLM's qkv_proj fail the run with both named, though every sum is the file's."""
    draft, data = measured
    checks = {c["name"]: c for c in data["checks"]}
    n = len(load_file(str(example / "model.safetensors")))
    assert checks["vllm_weights"]["status"] == "pass"
    assert checks["vllm_weights"]["summary"] == (f"the {n - 1} tensors vLLM holds for the draft equal the file's {n - 1} element by element "
                                                 "(rounded to bfloat16); vLLM keeps no t2d")
    _fake_vllm(monkeypatch)
    fake, asked = __import__("specfmt.validation.vllm_run", fromlist=["generate"]).generate, []
    k, v = (f"layers.0.self_attn.{p}_proj.weight" for p in "kv")

    def swapped(model, prompts, **kw):
        asked.append((Path(model).name, kw.get("dump_draft")))
        run = fake(model, prompts, **kw)
        if kw.get("dump_draft"):
            held = load_file(kw["dump_draft"])
            held[k], held[v] = held[v], held[k]
            save_file(held, kw["dump_draft"])
        return run

    monkeypatch.setattr("specfmt.validation.vllm_run.generate", swapped)
    res = _run(_copy(example, tmp_path / "draft"), three_prompts, tolerance=1.0, write=False)
    assert [a[0] for a in asked] == ["draft", "verifier"] and asked[0][1] and asked[1][1] is None
    c = next(c for c in res.report.checks if c.name == "vllm_weights")
    assert c.status == "fail" and [d.split(":")[0] for d in c.details] == [k, v], c.details
    assert "unloaded tensors" in res.causes and not res.report.ok


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """What the run loaded of the verifier (its tokenizer, its weights): recorded, never done."""
    from specfmt.sources.verifier import Verifier

    calls: list[str] = []
    monkeypatch.setattr(Verifier, "tokenizer", lambda self: calls.append("tokenizer"))
    monkeypatch.setattr(Verifier, "load_model", lambda self, placement=None: calls.append("load_model"))
    return calls


def _prompts_file(text: str | bytes):
    def write(d: Path) -> list[str]:
        f = d / "p.jsonl"
        f.write_bytes(text) if isinstance(text, bytes) else f.write_text(text)
        return ["--prompts", str(f)]

    return write


@pytest.mark.parametrize("case,args,says", [
    ("prompts missing", lambda d: ["--prompts", str(d / "nope.jsonl")], "prompts file"),
    ("prompts not JSON", _prompts_file('{"prompt": "a"}\n{"prompt": \n'), "p.jsonl:2"),
    ("prompts without a prompt", _prompts_file('{"txt": "a"}\n'), "this one has 'txt'"),
    ("prompts empty", _prompts_file("\n"), "no prompts"),
    ("prompts not UTF-8", _prompts_file(b"\xff\xfe\n"), "not UTF-8"),
    ("timeout", lambda d: ["--timeout", "0"], "--timeout 0"),
    ("threshold below 1", lambda d: ["--min-acceptance-length", "0.5"], "at least 1"),
    ("threshold beyond k + 1", lambda d: ["--min-acceptance-length", "4.5"], "cannot be reached with k=3"),
    ("validation.json in the way", lambda d: (d / "draft" / VALIDATION_FILE).mkdir() or [], "not a plain file"),
])
def test_bad_inputs_fail_before_the_verifier_is_loaded(example, tmp_path, loads, case, args, says):
    """Loading the verifier takes minutes on a real model: every input is checked first (issue 23: a missing
    --prompts file was reported after 20-25 s of loading)."""
    draft = _copy(example, tmp_path / "draft")
    r = CliRunner().invoke(app, ["validate", str(draft), "--run", "--no-vllm", *args(tmp_path)], terminal_width=200)
    assert r.exit_code == 2 and says in r.output, r.output
    assert loads == [], f"{case}: loaded {loads} before refusing"
    assert not (draft / VALIDATION_FILE).is_file()


def test_without_vllm_installed_run_refuses_before_loading_and_names_no_vllm(example, tmp_path, loads, monkeypatch):
    monkeypatch.setattr("specfmt.validation.vllm_run.vllm_available", lambda: False)
    draft = _copy(example, tmp_path / "draft")
    r = CliRunner().invoke(app, ["validate", str(draft), "--run"], terminal_width=200)
    assert r.exit_code == 2 and "vLLM is not installed" in r.output and "--no-vllm" in r.output, r.output
    assert loads == []


def test_progress_is_told_phase_by_phase_and_groups_add_up_to_one_run(measured, three_prompts, tmp_path, monkeypatch):
    """Every phase reports as it goes (verifier load, greedy paths, readings, vLLM), and the prompts run one group at
    a time (one prompt a group here) give exactly the figures of one group of all of them (``measured``)."""
    from specfmt.validation import run as vr

    draft, whole = measured
    _fake_vllm(monkeypatch)
    monkeypatch.setattr(vr, "group_size", lambda model, longest: 1)
    told: list[tuple[str, int, int | None]] = []
    res = _run(draft, three_prompts, tolerance=1.0, write=False, progress=lambda *a: told.append(a))
    assert res.reference == {**whole["reference"], "seconds": res.reference["seconds"]}
    assert res.variants == whole["variants"] and res.vllm == whole["vllm"]
    phases = list(dict.fromkeys(p for p, _, _ in told))
    assert phases == ["verifier load", "greedy paths", "readings", "vLLM"]
    # the draft's readings, and the free methods simulated beside them on the same paths (issue 37)
    readings = 1 + len(whole["variants"]) + sum("not_measured" not in m for m in whole["beside"]["methods"])
    by = {p: [(d, t) for q, d, t in told if q == p] for p in phases}
    assert by["verifier load"] == [(0, None), (1, 1)]
    assert by["greedy paths"] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    done = [d for d, _ in by["readings"]]
    assert done == sorted(done) and done[-1] == 3 * readings and {t for _, t in by["readings"]} == {3 * readings}
    assert len(set(done)) == 1 + 3 * readings  # one step per reading and group
    assert by["vLLM"] == [(0, 2), (1, 2), (2, 2)]
    # each group's readings come after that group's greedy path, and before the next group's
    order = [(p, d) for p, d, _ in told if p in ("greedy paths", "readings")]
    assert order.index(("greedy paths", 1)) < order.index(("readings", 1)) < order.index(("readings", readings)) < order.index(("greedy paths", 2))


def test_cli_shows_progress_bars_on_stderr_at_a_terminal(example, three_prompts, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import specfmt.cli.validate as cli

    draft = _copy(example, tmp_path / "draft")
    screen = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=screen, force_terminal=True, width=120))
    r = CliRunner().invoke(app, ["validate", str(draft), "--run", "--no-vllm", "--prompts", str(three_prompts), "--max-tokens", str(SHORT)],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    shown = screen.getvalue()
    assert all(p in shown for p in ("verifier load", "greedy paths", "readings")) and "3/3" in shown, shown
    assert "greedy paths" not in r.output  # nothing of the bars on stdout


def test_a_run_that_measures_less_keeps_what_an_earlier_run_measured_on_the_same_draft(measured, three_prompts, tmp_path):
    """`validate --run --no-vllm` after a run with vLLM: the vLLM figures and checks stay in validation.json
    (push puts them on the model card), marked with the date they were measured; the output says so."""
    src, before = measured
    draft = _copy(src, tmp_path / "draft", keep_validation=True)
    r = CliRunner().invoke(app, ["validate", str(draft), "--run", "--no-vllm", "--prompts", str(three_prompts), "--max-tokens", str(SHORT)],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    after = json.loads((draft / VALIDATION_FILE).read_text())
    assert after["vllm"] == before["vllm"] and after["passed"] is True and after["date"] >= before["date"]
    assert f"kept: the vllm figures and checks (vllm, vllm_exact, agreement, vllm_weights) measured on {before['date']}" in r.output
    assert "greedy paths" not in r.output  # not a terminal: no progress bars
    assert after["kept"] == {"vllm": {k: before[k] for k in ("date", "specfmt_version", "prompts", "num_speculative_tokens", "max_tokens")}}
    checks, old = ({c["name"]: c for c in d["checks"]} for d in (after, before))
    for name in ("vllm", "vllm_exact", "agreement", "vllm_weights"):
        assert checks[name]["status"] == old[name]["status"] == "pass"
        assert checks[name]["summary"] == f"kept from {before['date']}: {old[name]['summary']}"
    assert after["reference"]["mean_acceptance_length"] == before["reference"]["mean_acceptance_length"]
    # kept again by a later run: still the date of the run that measured them; a kept failure still fails
    after["checks"] = [{**c, "status": "fail"} if c["name"] == "vllm_weights" else c for c in after["checks"]]
    (draft / VALIDATION_FILE).write_text(json.dumps(after))
    again = _run(draft, three_prompts, use_vllm=False)
    assert again.vllm == before["vllm"] and again.kept["vllm"]["date"] == before["date"]
    assert not again.report.ok and json.loads((draft / VALIDATION_FILE).read_text())["passed"] is False


def test_a_part_this_run_tried_and_failed_is_never_covered_by_earlier_figures(measured, three_prompts, tmp_path, monkeypatch):
    """Only what a run did not try is kept: a vLLM that fails now is reported as failing, not as the earlier pass."""
    from specfmt.errors import VLLMRunError

    def broken_engine(model, prompts, **kw):
        raise VLLMRunError("vLLM exited with code 1 without a result", where=str(model))

    draft = _copy(measured[0], tmp_path / "draft", keep_validation=True)
    monkeypatch.setattr("specfmt.validation.vllm_run.vllm_available", lambda: True)
    monkeypatch.setattr("specfmt.validation.vllm_run.generate", broken_engine)
    res = _run(draft, three_prompts)
    after = json.loads((draft / VALIDATION_FILE).read_text())
    assert after["vllm"] is None and after["kept"] == {} and after["passed"] is False and res.notes == []
    assert {c["name"]: c["status"] for c in after["checks"]}["vllm"] == "fail"


@pytest.mark.parametrize("change", ["weights", "config", "verifier"])
def test_figures_of_a_changed_draft_or_another_verifier_are_never_carried_over(measured, three_prompts, tmp_path, change):
    import shutil

    src, before = measured
    draft = _copy(src, tmp_path / "draft", keep_validation=True)
    verifier = None
    if change == "weights":
        t = load_file(str(draft / "model.safetensors"))
        t["norm.weight"] = t["norm.weight"] * 1.01
        save_file(t, str(draft / "model.safetensors"))
    elif change == "config":
        cfg = json.loads((draft / "config.json").read_text())
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 2
        (draft / "config.json").write_text(json.dumps(cfg, indent=2))
    else:
        verifier = str(shutil.copytree(WORLD / "verifier", tmp_path / "other-verifier"))
    res = _run(draft, three_prompts, verifier=verifier, use_vllm=False)
    after = json.loads((draft / VALIDATION_FILE).read_text())
    assert after["vllm"] is None and after["kept"] == {} and res.vllm is None
    assert {c["name"]: c["status"] for c in after["checks"]}["vllm"] == "skip"
    why = {"weights": "model.safetensors differ", "config": "config.json differ", "verifier": f"another verifier ({WORLD / 'verifier'})"}[change]
    assert res.notes == [f"not kept: the vllm figures of the earlier {VALIDATION_FILE} ({before['date']}): it "
                         + ("measured other files (" + why + ")" if change != "verifier" else "ran " + why)]


def test_validation_json_is_replaced_whole_or_not_at_all(measured, three_prompts, tmp_path, monkeypatch):
    import os

    draft = _copy(measured[0], tmp_path / "draft", keep_validation=True)
    before = (draft / VALIDATION_FILE).read_bytes()
    replace = os.replace

    def disk_full(src, dst):  # the rename onto validation.json fails; any other goes through
        if Path(dst).name == VALIDATION_FILE:
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _run(draft, three_prompts, use_vllm=False)
    assert (draft / VALIDATION_FILE).read_bytes() == before
    assert sorted(p.name for p in draft.iterdir()) == ["config.json", "model.safetensors", VALIDATION_FILE]


def test_the_engine_hosts_log_is_removed_when_its_block_ends(monkeypatch, tmp_path):
    """The host's log file exists while the block runs (errors quote its tail; test_ctrl_c reads it for vLLM's loading
    line) and is gone after: every `validate --run` used to leave a /tmp/specfmt-vllm-*.log behind."""
    import tempfile

    from specfmt.validation import vllm_run

    monkeypatch.setattr(vllm_run, "_shared", None)  # not the session's shared host (conftest.one_vllm_host)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with vllm_run.engines() as host:
        log = Path(host._log.name)
        assert log.parent == tmp_path and log.is_file()
        with vllm_run.engines() as inner:  # re-entrant: the same host, its log kept until the outer block ends
            assert inner is host
        assert log.is_file()
    assert not log.exists() and list(tmp_path.iterdir()) == []


def test_the_host_leaves_no_heap_frozen_after_an_engine_that_failed(monkeypatch, capsys):
    """``_engine`` freezes the host's heap (``gc.freeze``) so that vLLM's collections while it starts skip what was
    there before; vLLM's shutdown unfreezes it. An engine that fails before its shutdown must not leave it frozen:
    what it built in cycles would never be collected in a host that runs on."""
    import gc
    import io

    from specfmt import interrupt
    from specfmt.validation import vllm_run

    def failing(spec):
        gc.freeze()
        raise RuntimeError(f"engine for {spec['model']} failed to start")

    monkeypatch.setattr(vllm_run, "_engine", failing)
    monkeypatch.setattr(interrupt, "parent_watch", lambda: None)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"model": "M"}) + "\n"))
    gc.unfreeze()
    vllm_run._serve()
    assert gc.get_freeze_count() == 0
    out = capsys.readouterr().out
    assert json.loads(out.split(vllm_run.MARK, 1)[1]) == {"error": "RuntimeError: engine for M failed to start"}


def test_a_misreading_ahead_by_chance_over_the_prompts_is_not_a_failure():
    """Issue 38: a draft trained with ``norm_before_fc`` read with ``norm_before_residual`` flipped was accepted 0.21 more
    often on 8 prompts (and 0.01 on 16), and ``train``'s own validation failed it. A misreading fails the check only when
    it is ahead by the margin and beyond chance over the prompts (paired bootstrap); one ahead on every prompt still fails."""
    from specfmt.algorithms import get
    from specfmt.algorithms.base import Variant
    from specfmt.validation.acceptance import ChainResult, paired_difference_low
    from specfmt.validation.report import Report
    from specfmt.validation.run import VARIANT_MARGIN, RunResult, _variants_check

    def chain(accepted):
        return ChainResult(k=3, prompts=8, drafts_per_prompt=[10] * 8, accepted_per_prompt=accepted, num_drafts=80,
                           num_accepted_tokens=sum(accepted))

    written = chain([10] * 8)  # AL 2.0
    lucky = chain([34, 34, 6, 6, 6, 6, 6, 6])  # AL 2.3 = 2.0 + 2 x VARIANT_MARGIN, from two prompts
    always = chain([13] * 8)  # AL 2.3 on every prompt
    assert lucky.mean_acceptance_length == always.mean_acceptance_length >= written.mean_acceptance_length + VARIANT_MARGIN
    assert paired_difference_low(lucky, written) <= 0 < paired_difference_low(always, written)
    assert paired_difference_low(lucky, written) == paired_difference_low(lucky, written)  # seeded
    found = {}
    for name, other in (("lucky", lucky), ("always", always)):
        res = RunResult(Report("x"), 3, 32)
        _variants_check(res, get("eagle3"), [(Variant(None, "as written", {}), written), (Variant("norm order", "norm_before_residual true", {}), other)])
        check = next(c for c in res.report.checks if c.name == "variants")
        found[name] = (check.status, check.summary, res.causes)
    assert found["lucky"][0] == "pass" and "ahead by chance" in found["lucky"][1] and found["lucky"][2] == []
    assert found["always"][0] == "fail" and found["always"][2] == ["norm order"]
