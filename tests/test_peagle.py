"""P-EAGLE (issue 25): EAGLE-3 drafting k tokens in one pass, as a full algorithm of its own.

* the format: ``PEagleConfig(Eagle3Config)`` adds ``mask_token_id``; the tensor table is EAGLE-3's and
  ``mask_hidden`` [1, 1, n_aux·H_t]; the schema has its branch;
* serving: the explicit ``--speculative-config`` carries ``"parallel_drafting": true`` (without it vLLM
  drafts sequentially and skips ``mask_hidden``); EAGLE-3's lines are unchanged;
* the reference forward: the proposer's k logits equal speculators 0.9's own ``PEagleDraftModel``
  (``speculators/models/peagle/core.py``) on random float64 weights to 1e-6, at every verified position
  and every mask position; a tap shift, a wrong mask token, a non-causal mask among the parallel
  positions or serving without parallel drafting each change them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from builders import _spec_block
from specfmt.algorithms import get, schema_violations
from specfmt.algorithms import peagle as peagle_module
from specfmt.algorithms.recognised import recognised
from specfmt.algorithms.reference import VerifierStates
from specfmt.format.versions import SPECULATORS_VERSION
from specfmt.serving import explicit_config
from speculators_env import FLOAT64, spec_env  # noqa: F401  (fixture)

H, V, N_LAYERS, TAPS, MASK = 32, 97, 5, [1, 2, 3], 95


def peagle_config(k: int = 4, mask: int = MASK, **layer) -> dict:
    return {"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle", "speculators_version": SPECULATORS_VERSION,
            "speculators_config": _spec_block("peagle", "verifier", k=k),
            "transformer_layer_config": {"model_type": "llama", "vocab_size": V, "hidden_size": H, "intermediate_size": 48, "num_hidden_layers": 1,
                                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
                                         "max_position_embeddings": 128, "rope_theta": 10000.0, "num_aux_hidden_states": len(TAPS), **layer},
            "draft_vocab_size": V, "norm_before_residual": False, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": TAPS,
            "norm_before_fc": False, "fc_norm": False, "norm_output": False, "mask_token_id": mask, "tie_word_embeddings": False}


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The draft's tensors, random in float64 (norms around 1), with its own embedding."""
    module = get("peagle").module(cfg)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in module.state_dict().items():
        r = torch.randn(t.shape, generator=g, dtype=torch.float64)
        out[n] = 1 + 0.2 * r if n.endswith("norm.weight") else 0.3 * r
    out["embed_tokens.weight"] = 0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)
    return out


# --------------------------------------------------------------------------- format


def test_a_peagle_config_validates_and_its_rules_are_eagle3s_and_the_mask_token():
    cfg = peagle_config()
    assert schema_violations(cfg) == []
    assert recognised("peagle") is None and get("peagle").title == "P-EAGLE"
    assert any("mask_token_id" in m for _, m in schema_violations({k: v for k, v in cfg.items() if k != "mask_token_id"}))  # vLLM needs it
    assert schema_violations({**cfg, "mask_token_id": V}) == [
        ("$.mask_token_id", f"{V} is outside the verifier vocabulary transformer_layer_config.vocab_size={V}")]
    assert any(p == "$.mask_token_id" for p, _ in schema_violations({**cfg, "mask_token_id": -1}))
    assert any(p == "$.eagle_aux_hidden_state_layer_ids" for p, _ in schema_violations({**cfg, "eagle_aux_hidden_state_layer_ids": [4, 1, 2]}))


def test_the_tensor_table_is_eagle3s_and_mask_hidden():
    cfg = peagle_config()
    eagle3 = get("eagle3").expected_tensors({**cfg, "speculators_model_type": "eagle3"})
    specs = get("peagle").expected_tensors(cfg)
    assert {n: s for n, s in specs.items() if n != "mask_hidden"} == eagle3
    assert specs["mask_hidden"].shape == (1, 1, len(TAPS) * H)
    assert set(get("peagle").module(cfg).state_dict()) == {n for n, s in specs.items() if n != "embed_tokens.weight"}


def test_peagle_is_not_trained_by_specfmt():
    from specfmt.algorithms import trainable

    assert get("peagle").training is None and get("peagle") not in trainable()


# --------------------------------------------------------------------------- serving


def test_the_explicit_line_carries_parallel_drafting_and_eagle3s_does_not_change():
    cfg = peagle_config(k=5)
    assert explicit_config(cfg, "out") == {"model": "out", "method": "eagle3", "num_speculative_tokens": 5, "parallel_drafting": True}
    e3 = {**cfg, "speculators_model_type": "eagle3", "speculators_config": _spec_block("eagle3", "verifier", k=5)}
    assert explicit_config(e3, "out") == {"model": "out", "method": "eagle3", "num_speculative_tokens": 5}


# --------------------------------------------------------------------------- the reference forward


def _states(seed: int, T: int) -> VerifierStates:
    g = torch.Generator().manual_seed(seed)
    return VerifierStates([torch.randn(T, H, generator=g, dtype=torch.float64) for _ in range(N_LAYERS + 1)], torch.zeros(T, V, dtype=torch.float64))


def _logits_of(algo, reading, tensors, tokens, states, k) -> torch.Tensor:
    """The logits behind a proposal: the last verified position's, then each further position's ([k, V])."""
    proposer = algo.proposer(reading, tensors, tensors["embed_tokens.weight"], None)
    seen = []
    hook = proposer.draft.lm_head.register_forward_hook(lambda m, i, o: seen.append(o[0].detach().clone()))
    try:
        proposer(tokens, states, k)
    finally:
        hook.remove()
    return torch.cat(seen)


def plain_peagle(tensors: dict, cfg: dict, tokens: list[int], states: VerifierStates, k: int) -> torch.Tensor:
    """One full causal pass of the draft module over the verified positions and k-1 mask positions, no cache: [T + k - 1, V]."""
    draft = get("peagle").module(cfg, tensors, share=True)  # float64, as the tensors
    T = len(tokens) - 1
    aux = torch.cat([states.hidden[t] for t in cfg["eagle_aux_hidden_state_layer_ids"]], dim=-1)
    hidden = torch.cat([draft.combine(aux), draft.mask_features()[None].expand(k - 1, -1)])[None]
    ids = torch.tensor(tokens[1:] + [cfg["mask_token_id"]] * (k - 1))
    logits, _, _ = draft(tensors["embed_tokens.weight"][ids][None], hidden, torch.arange(T + k - 1))
    return logits[0]


def test_the_proposer_drafts_k_tokens_from_one_parallel_pass_as_a_full_causal_pass_does():
    cfg = peagle_config(k=4)
    tensors = random_tensors(cfg)
    algo = get("peagle")
    tokens, states, k = [5, 9, 11, 3, 40, 7, 21], _states(1, 6), 4
    full = plain_peagle(tensors, cfg, tokens, states, k)
    ours = _logits_of(algo, algo.readings(cfg, N_LAYERS)[0], tensors, tokens, states, k)
    assert ours.shape == (k, V) and (ours - full[-k:]).abs().max() < 1e-9
    assert algo.proposer(algo.readings(cfg, N_LAYERS)[0], tensors, tensors["embed_tokens.weight"], None)(tokens, states, k) == \
        full[-k:].argmax(-1).tolist()


def test_each_peagle_misreading_changes_the_proposals_logits():
    cfg = peagle_config(k=4)
    tensors = random_tensors(cfg)
    algo = get("peagle")
    tokens, states, k = [5, 9, 11, 3, 40, 7, 21], _states(2, 6), 4
    readings = algo.readings(cfg, N_LAYERS)
    assert {r.cause for r in readings} >= {None, "tap ids", "parallel drafting", "mask token id"}
    assert {r.cause for r in readings if r.cause} <= set(algo.causes)
    written = _logits_of(algo, readings[0], tensors, tokens, states, k)
    for r in readings[1:]:
        other = _logits_of(algo, r, tensors, tokens, states, k)
        assert other.shape != written.shape or (other - written).abs().max() > 1e-3, r.label


# --------------------------------------------------------------------------- against speculators 0.9


DRIVE = FLOAT64 + r"""
import json, sys, torch
from safetensors.torch import load_file
from speculators import SpeculatorModelConfig
import speculators.models.peagle.core as core
folder, T, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = SpeculatorModelConfig.from_pretrained(folder)
cfg.transformer_layer_config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32
model = core.PEagleDraftModel(cfg).double().eval()
float64_like_transformers(model, cfg.transformer_layer_config)  # rotary tables and RMSNorm in float64 (FLOAT64)
state = load_file(folder + "/model.safetensors")
missing, unexpected = model.load_state_dict(state, strict=False)
inputs = load_file(folder + "/inputs.safetensors")
# the inference picture as P-EAGLE's COD sampling states it: every verified position at depth 0, then
# the rollout of the last one at depths 1..k-1 (speculators models/peagle/attention.py)
anchor = torch.cat([torch.arange(T), torch.full((k - 1,), T - 1)])
depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, k)])
core.generate_cod_sample_indices = lambda **kw: (anchor, depth)
seen = []
class Done(Exception):
    pass
def capture(m, i, o):
    seen.append(o.detach())
    raise Done  # the draft's logits are what is compared; the training loss after them is not run
model.lm_head.register_forward_hook(capture)
L = T + k - 1
with torch.no_grad(), __import__("contextlib").suppress(Done):
    model(hidden_states=inputs["aux"][None], input_ids=inputs["ids"][None], document_ids=torch.zeros(1, L, dtype=torch.long),
          loss_mask=torch.ones(1, L), verifier_last_hidden_states=torch.zeros(1, L, cfg.transformer_layer_config.hidden_size, dtype=torch.float64),
          num_depths=k)
from safetensors.torch import save_file
save_file({"logits": seen[0][0].contiguous()}, folder + "/logits.safetensors")
print("REPORT " + json.dumps({"class": type(model).__name__, "missing": sorted(missing), "unexpected": sorted(unexpected),
                              "mask_token_id": model.mask_token_id}))
"""


def _speculators_logits(spec_env, folder: Path, cfg: dict, tensors: dict, tokens: list[int], states: VerifierStates, k: int) -> torch.Tensor:
    """speculators' ``PEagleDraftModel`` forward on the same weights and inputs: [T + k - 1, V]."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    T = len(tokens) - 1
    aux = torch.cat([states.hidden[t] for t in cfg["eagle_aux_hidden_state_layer_ids"]], dim=-1)
    aux = torch.cat([aux, torch.zeros(k - 1, aux.shape[1], dtype=aux.dtype)])  # the rows of depth > 0 read mask_hidden instead
    ids = torch.tensor(tokens[1:] + [0] * (k - 1))  # position j reads token j+1; depth > 0 reads the mask token instead
    save_file({"aux": aux, "ids": ids}, str(folder / "inputs.safetensors"))
    r = spec_env.run("-c", DRIVE, folder, T, k)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    rep = json.loads(line[len("REPORT "):])
    assert rep["class"] == "PEagleDraftModel" and rep["unexpected"] == [] and rep["mask_token_id"] == cfg["mask_token_id"], rep
    assert set(rep["missing"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}, rep  # every draft tensor is loaded
    return load_file(str(folder / "logits.safetensors"))["logits"]


class _NonCausal(peagle_module._EveryPosition):
    """A wrong mask: the parallel positions see each other both ways (every new key placed at the first mask position)."""

    def __init__(self, lengths, past, key_positions):
        super().__init__(lengths, past, [torch.cat([kp[:-n], torch.full((n,), int(kp[-n]))]) for kp, n in zip(key_positions, lengths)])


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_the_reference_equals_speculators_peagle_draft_model_in_float64(spec_env, tmp_path, monkeypatch, model_type):
    """specfmt's :class:`~specfmt.algorithms.peagle_nn.PEagleDraft` run by the P-EAGLE proposer against speculators 0.9's
    ``PEagleDraftModel`` (``models/peagle/core.py``, forward driven with the COD indices of one rollout at the last position;
    its rotary tables and RMSNorms computed in float64 like ours, where transformers computes them in float32 whatever the dtype):
    every verified position's logits and the k drafted ones agree to 1e-6; a tap shift, the wrong mask token, a non-causal
    mask among the parallel positions and serving without parallel drafting each miss by far more."""
    k = 4
    cfg = peagle_config(k=k, model_type=model_type)
    tensors = random_tensors(cfg, seed=3)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60, 2], _states(4, 8)
    T = len(tokens) - 1
    theirs = _speculators_logits(spec_env, tmp_path / "draft", cfg, tensors, tokens, states, k)
    assert theirs.shape == (T + k - 1, V) and theirs.dtype == torch.float64
    algo = get("peagle")
    readings = algo.readings(cfg, N_LAYERS)
    draft = algo.module(cfg, tensors, share=True)
    aux = torch.cat([states.hidden[t] for t in TAPS], dim=-1)
    verified, _, _ = draft(tensors["embed_tokens.weight"][torch.tensor(tokens[1:])][None], draft.combine(aux)[None], torch.arange(T))
    assert (verified[0] - theirs[:T]).abs().max() < 1e-6  # every verified position
    ours = _logits_of(algo, readings[0], tensors, tokens, states, k)
    assert (ours - theirs[T - 1:]).abs().max() < 1e-6  # the k proposals' logits
    assert algo.proposer(readings[0], tensors, tensors["embed_tokens.weight"], None)(tokens, states, k) == theirs[T - 1:].argmax(-1).tolist()

    def misses(logits) -> bool:
        return logits.shape != theirs[T - 1:].shape or (logits - theirs[T - 1:]).abs().max() > 1e-3

    by_label = {r.label: r for r in readings}
    assert misses(_logits_of(algo, by_label[f"taps + 1: {[t + 1 for t in TAPS]}"], tensors, tokens, states, k))
    assert misses(_logits_of(algo, by_label["taps - 1: " + str([t - 1 for t in TAPS])], tensors, tokens, states, k))
    assert misses(_logits_of(algo, by_label["mask_token_id 0"], tensors, tokens, states, k))
    assert misses(_logits_of(algo, by_label["served without parallel drafting (sequential EAGLE-3)"], tensors, tokens, states, k))
    monkeypatch.setattr(peagle_module, "_EveryPosition", _NonCausal)
    assert misses(_logits_of(algo, readings[0], tensors, tokens, states, k))


# --------------------------------------------------------------------------- speculators' own outputs


SAVE = r"""
import json, sys, torch
from speculators import SpeculatorModelConfig
from speculators.models.peagle.core import PEagleDraftModel
cfg = SpeculatorModelConfig.from_dict(json.loads(open(sys.argv[1]).read()))
torch.manual_seed(0)
model = PEagleDraftModel(cfg)
with torch.no_grad():  # speculators leaves some parameters uninitialised (trained from the verifier's): random here
    for name, p in model.named_parameters():
        p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else 0.02 * torch.randn_like(p))
model.save_pretrained(sys.argv[2])
"""


def _world_peagle(verifier: str, mask) -> dict:
    cfg = peagle_config(k=5, mask=mask, vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4, head_dim=32)
    cfg["transformer_layer_config"].pop("num_aux_hidden_states")
    cfg["speculators_config"]["verifier"]["name_or_path"] = verifier
    return {**cfg, "draft_vocab_size": 2048, "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}


def test_speculators_own_peagle_output_is_upgraded_and_validates_and_without_a_mask_token_is_refused(spec_env, tmp_path):
    """A P-EAGLE draft saved by speculators 0.9 (``PEagleDraftModel.save_pretrained``) for the example verifier:
    ``specfmt upgrade`` keeps every tensor (``mask_hidden`` included) and ``mask_token_id``, and the output validates;
    the same draft saved with speculators' default ``mask_token_id`` (null) is refused, naming the key."""
    from safetensors.torch import load_file

    from conftest import WORLD, run_cli

    verifier = str((WORLD / "verifier").resolve())
    for name, mask in (("theirs", 2047), ("nomask", None)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_world_peagle(verifier, mask)))
        r = spec_env.run("-c", SAVE, tmp_path / f"{name}.json", tmp_path / name)
        assert r.returncode == 0, r.stderr[-3000:]
    written = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert written["speculators_model_type"] == "peagle" and written["mask_token_id"] == 2047
    up = run_cli("upgrade", tmp_path / "theirs", "-o", tmp_path / "up", "--verifier", verifier)
    assert up.returncode == 0, up.stdout + up.stderr
    v = run_cli("validate", tmp_path / "up")
    assert v.returncode == 0, v.stdout
    out = json.loads((tmp_path / "up" / "config.json").read_text())
    assert out["speculators_model_type"] == "peagle" and out["mask_token_id"] == 2047 and out["architectures"] == ["PEagleSpeculator"]
    theirs, ours = load_file(str(tmp_path / "theirs" / "model.safetensors")), load_file(str(tmp_path / "up" / "model.safetensors"))
    assert sorted(ours) == sorted(theirs) and "mask_hidden" in ours
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    refused = run_cli("upgrade", tmp_path / "nomask", "-o", tmp_path / "up2", "--verifier", verifier)
    assert refused.returncode != 0 and "mask_token_id" in refused.stdout + refused.stderr


@pytest.mark.vllm
def test_vllm_reads_our_peagle_config_as_parallel_eagle3_with_our_mask_token():
    """vLLM 0.32's own speculators reader on our config (no engine): method ``eagle3`` with ``parallel_drafting``,
    ``PeagleLlamaForCausalLM`` / ``PeagleQwen3ForCausalLM``, ``pard_token`` = ``mask_token_id``, our taps and norm order.
    Marked ``vllm``: without vLLM it fails (conftest), never skips."""
    from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    for family, arch in (("llama", "PeagleLlamaForCausalLM"), ("qwen3", "PeagleQwen3ForCausalLM")):
        cfg = peagle_config(k=4, model_type=family)
        assert SpeculatorsConfig.build_vllm_speculative_config(cfg) == {"method": "eagle3", "num_speculative_tokens": 4, "parallel_drafting": True}
        pre = dict(cfg["transformer_layer_config"])
        SUPPORTED_SPECULATORS_TYPES["peagle"](cfg, pre)
        assert pre["architectures"] == [arch] and pre["pard_token"] == MASK
        assert pre["eagle_aux_hidden_state_layer_ids"] == TAPS and pre["norm_before_residual"] is False and pre["draft_vocab_size"] == V


def test_the_card_says_how_it_drafts_and_its_mask_token():
    rows = dict(get("peagle").card_rows(peagle_config()))
    assert rows["drafting"].startswith("k tokens in one parallel pass") and rows["mask token (`mask_token_id`, vLLM's `pard_token`)"] == str(MASK)
    assert list(rows)[:3] == [r for r, _ in get("eagle3").card_rows(peagle_config())][:3]


# --------------------------------------------------------------------------- SpecForge's native layout


def _specforge_peagle(folder: Path, mask: int | None = None, layers: int = 2) -> dict[str, torch.Tensor]:
    """A SpecForge ``PEagleDraftModel`` checkpoint for the example verifier (``specforge/modeling/draft/peagle.py``): a plain
    Llama config (``layers`` layers, ``draft_vocab_size``, no taps, ``mask_token_id`` only when given) and speculators' tensor
    names (``layers.0`` EAGLE-3's first layer, ``mask_hidden`` [1, 1, 3·H]), random bfloat16 values, a valid vocabulary map."""
    from safetensors.torch import save_file

    cfg = _world_peagle("verifier", MASK)
    cfg["transformer_layer_config"]["num_hidden_layers"] = layers
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for name, spec in get("peagle").expected_tensors({**cfg, "draft_vocab_size": 1024}).items():
        if spec.kind == "float":
            tensors[name] = (0.02 * torch.randn(spec.shape, generator=g)).to(torch.bfloat16)
    used = torch.arange(1024) * 2
    tensors["d2t"], tensors["t2d"] = used - torch.arange(1024), torch.zeros(2048, dtype=torch.bool).index_fill(0, used, True)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    research = {"architectures": ["PEagleDraftModel"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": layers,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
                "rope_theta": 10000.0, "vocab_size": 2048, "draft_vocab_size": 1024, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                **({"mask_token_id": mask} if mask is not None else {})}
    (folder / "config.json").write_text(json.dumps(research))
    return tensors


def test_specforges_native_peagle_layout_converts_with_the_mask_token_the_user_states(tmp_path):
    """SpecForge's layout (its config records no mask token) is named by ``inspect``, refused by ``--from auto`` without
    ``--mask-token-id`` (naming the option), and converted with it: every tensor kept bit for bit, all decoder layers,
    EAGLE-3's default taps (SpecForge's [1, N//2-1, N-4] through SGLang's +1), the stated token written as ``mask_token_id``;
    another token gives another config; a token the config does record cannot be contradicted; the output validates."""
    from safetensors.torch import load_file

    from conftest import WORLD, run_cli

    verifier = str((WORLD / "verifier").resolve())
    tensors = _specforge_peagle(tmp_path / "sf")
    r = run_cli("inspect", tmp_path / "sf")
    assert r.returncode == 0 and "peagle" in r.stdout and "specforge" in r.stdout, r.stdout
    refused = run_cli("convert", "--from", "auto", tmp_path / "sf", "-o", tmp_path / "no", "--verifier", verifier)
    assert refused.returncode != 0 and "mask_token_id is None" in refused.stderr and "--mask-token-id" in refused.stderr, refused.stderr
    outs = {}
    for mask in (7, 8):
        r = run_cli("convert", "--from", "auto", tmp_path / "sf", "-o", tmp_path / f"m{mask}", "--verifier", verifier, "--mask-token-id", mask)
        assert r.returncode == 0, r.stderr
        outs[mask] = json.loads((tmp_path / f"m{mask}" / "config.json").read_text())
    out = outs[7]
    assert out["speculators_model_type"] == "peagle" and out["mask_token_id"] == 7 and outs[8]["mask_token_id"] == 8
    assert out["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and out["transformer_layer_config"]["num_hidden_layers"] == 2
    assert out["specfmt"]["source"]["layout"] == "specforge" and out["norm_before_residual"] is False
    assert {k: v for k, v in out.items() if k not in ("mask_token_id", "specfmt")} == {k: v for k, v in outs[8].items() if k not in ("mask_token_id", "specfmt")}
    written = load_file(str(tmp_path / "m7" / "model.safetensors"))
    assert sorted(written) == sorted(tensors) and all(torch.equal(written[n], tensors[n]) for n in tensors)
    v = run_cli("validate", tmp_path / "m7")
    assert v.returncode == 0, v.stdout
    _specforge_peagle(tmp_path / "stated", mask=7)
    r = run_cli("convert", "--from", "peagle", tmp_path / "stated", "-o", tmp_path / "s8", "--verifier", verifier, "--mask-token-id", 8)
    assert r.returncode != 0 and "--mask-token-id 8 contradicts the source's mask_token_id 7" in r.stderr, r.stderr
    r = run_cli("convert", "--from", "peagle", tmp_path / "stated", "-o", tmp_path / "s7", "--verifier", verifier)
    assert r.returncode == 0 and json.loads((tmp_path / "s7" / "config.json").read_text())["mask_token_id"] == 7, r.stderr
    r = run_cli("convert", "--from", "peagle", tmp_path / "sf", "-o", tmp_path / "big", "--verifier", verifier, "--mask-token-id", 2048)
    assert r.returncode != 0 and "mask token id 2048 is outside the vocabulary [0, 2048)" in r.stderr, r.stderr
