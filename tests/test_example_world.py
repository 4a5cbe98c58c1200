"""The shipped example world is what the README and docs/getting-started.md say: small, real, and in the research layout."""

import json

import torch

from conftest import REPO, assert_figures
from specfmt.algorithms.eagle3 import vocab_map_problems
from specfmt.convert import convert
from specfmt.validation.static import validate_static

WORLD = REPO / "examples" / "world"

SAFEAILAB_KEYS = {
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def test_world_is_small():
    size = sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file())
    assert size < 30e6  # issue 5: the whole example under 30 MB


def test_verifier_has_distinct_default_taps_and_cpu_friendly_heads():
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["num_hidden_layers"] >= 8  # (2, N//2, N-3) distinct
    assert cfg["head_dim"] >= 32  # vLLM's CPU attention rejects smaller heads
    assert (WORLD / "verifier" / "tokenizer.json").is_file()


def test_draft_is_exactly_the_safeailab_layout():
    folder = WORLD / "eagle3-safeailab"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "pytorch_model.bin"]
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert set(sd) == SAFEAILAB_KEYS
    assert {sd[k].dtype for k in sd if k not in ("d2t", "t2d")} == {torch.float16}
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert "eagle_aux_hidden_state_layer_ids" not in cfg and "eagle_config" not in cfg and "rope_theta" not in cfg
    assert cfg["draft_vocab_size"] == sd["lm_head.weight"].shape[0] < cfg["vocab_size"]
    assert vocab_map_problems(sd["d2t"], sd["t2d"], cfg["vocab_size"], cfg["draft_vocab_size"]) == []


def test_world_converts_and_validates(tmp_path):
    convert("eagle3", str(WORLD / "eagle3-safeailab"), tmp_path / "out", str(WORLD / "verifier"))
    rep = validate_static(tmp_path / "out")
    assert rep.ok, rep.to_json()
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_eagle1_draft_is_the_safeailab_llama3_layout_and_converts(tmp_path):
    folder = WORLD / "eagle-safeailab"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "pytorch_model.bin"]
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert "fc.bias" not in sd and "layers.0.input_layernorm.weight" not in sd
    assert sd["fc.weight"].shape == (128, 256) and sd["embed_tokens.weight"].shape == (2048, 128)
    assert {t.dtype for t in sd.values()} == {torch.float16}
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["bias"] is False and cfg["model_type"] == "llama"
    # the draft reads the verifier's embedding, frozen: the copy is the verifier's, rounded to float16
    from safetensors.torch import load_file

    embed = load_file(str(WORLD / "verifier" / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(sd["embed_tokens.weight"], embed.to(torch.float16))
    convert("eagle", str(folder), tmp_path / "out", str(WORLD / "verifier"))
    assert validate_static(tmp_path / "out").ok


def test_medusa_heads_are_the_legacy_trainer_layout_and_convert(tmp_path):
    from safetensors.torch import load_file

    folder = WORLD / "medusa-legacy"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    sd = load_file(str(folder / "medusa_lm_head.safetensors"))
    assert set(sd) == {f"{i}.0.linear.{w}" for i in range(3) for w in ("weight", "bias")} | {f"{i}.1.weight" for i in range(3)}
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 1
    convert("medusa", str(folder), tmp_path / "out", str(WORLD / "verifier"))
    assert validate_static(tmp_path / "out").ok


def test_manifest_figures_meet_the_bar():
    drafts = json.loads((WORLD / "world.json").read_text())["drafts"]
    assert drafts["eagle3"]["heldout"]["mean_acceptance_length"] >= 1.8
    assert all(d["heldout"]["k"] == 3 and d["heldout"]["prompts"] == 16 for d in drafts.values())


def test_reference_figures_are_the_ones_the_world_was_made_with(tmp_path):
    """``validate --run --no-vllm`` on the 16 held-out prompts x 32 tokens gives, for each shipped
    draft, exactly the figures ``make_world.py`` recorded in world.json: the reference run that
    simulates every reading against one verifier pass per prompt counts what the step-by-step loop
    counted."""
    from specfmt.validation.run import validate_run

    drafts = json.loads((WORLD / "world.json").read_text())["drafts"]
    for algo, (name, fmt) in {"eagle3": ("eagle3-safeailab", "eagle3"), "eagle": ("eagle-safeailab", "eagle"),
                              "medusa": ("medusa-legacy", "medusa")}.items():
        out = tmp_path / algo
        convert(fmt, str(WORLD / name), out, str(WORLD / "verifier"))
        res = validate_run(out, prompts=str(WORLD / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, use_vllm=False, write=False)
        got = {**res.reference, "k": res.k, "prompts": len(res.prompts.ids), "tokens": len(res.prompts.ids) * res.max_tokens}
        assert_figures(got, drafts[algo]["heldout"], algo)


def test_eagle3_figures_are_those_of_a_plain_step_by_step_loop():
    """world.json's EAGLE-3 figures were recorded by specfmt's reference run, the code under test; here they are
    counted again by greedy speculative decoding written out in the test (``plain_eagle3``): transformers' verifier,
    a full pass per step, and the draft's forward pass in plain torch from the research checkpoint's own tensors
    (SafeAILab names, before any conversion), with the EAGLE-3 reference taps (2, N//2, N-3)."""
    from plain_eagle3 import PlainEagle3, one_thread, speculative_figures
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verifier = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    sd = torch.load(WORLD / "eagle3-safeailab" / "pytorch_model.bin", weights_only=True)
    cfg = json.loads((WORLD / "eagle3-safeailab" / "config.json").read_text())
    layer = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj", "gate": "mlp.gate_proj",
             "up": "mlp.up_proj", "down": "mlp.down_proj", "input_norm": "input_layernorm", "hidden_norm": "hidden_norm",
             "post_norm": "post_attention_layernorm"}
    w = {short: sd[f"midlayer.{name}.weight"].float() for short, name in layer.items()}
    w.update(fc=sd["fc.weight"].float(), norm=sd["norm.weight"].float(), lm_head=sd["lm_head.weight"].float(), d2t=sd["d2t"],
             embed=verifier.get_input_embeddings().weight.detach())  # the research draft reads the verifier's embedding
    draft = PlainEagle3(w, heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                        head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], eps=cfg["rms_norm_eps"], theta=cfg.get("rope_theta", 10000.0))
    n = verifier.config.num_hidden_layers
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in (WORLD / "prompts.jsonl").read_text().splitlines()]
    with one_thread():
        got = speculative_figures(verifier, draft, prompts, [2, n // 2, n - 3], k=3, max_tokens=32)
        # the loop is lossless: its tokens are the verifier's own greedy ones
        alone = [verifier.generate(torch.tensor([p]), do_sample=False, max_new_tokens=32, min_new_tokens=32)[0, len(p):].tolist() for p in prompts]
    assert_figures(got, json.loads((WORLD / "world.json").read_text())["drafts"]["eagle3"]["heldout"], "eagle3")
    assert got["token_ids"] == alone
