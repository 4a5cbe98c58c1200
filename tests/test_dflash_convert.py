"""``--from dflash`` (issue 25): z-lab's and SpecForge's DFlash layout, and speculators 0.9's own converter of it.

The source is built here in the shape of the published configs (``tests/data/real_configs/native-dflash-*``: a Qwen3
config with ``block_size``, ``num_target_layers``, ``dflash_config``; tensors ``layers.*``, ``fc``, ``hidden_norm``,
``norm``) for the Qwen3 example verifier (H 128, V 2048, N 8). On the same source speculators 0.9's
``speculators.convert.dflash.DFlashConverter`` and ``specfmt convert --from dflash`` write the same tensors, bit for bit,
and the same taps, mask token, block and k; every config difference is listed in :data:`DIFFERENCES` with its reason, and
the one that matters is shown through vLLM 0.32's own reader (``update_dflash``): speculators' output leaves
``sliding_window_non_causal`` false, so vLLM builds every layer causal. A tap of the verifier's last layer is refused by
specfmt and breaks speculators' converter (it drops the tap but not ``fc``'s columns).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO
from specfmt.converters import Options
from specfmt.converters.dflash import build_target_layer_ids
from specfmt.convert import convert
from specfmt.errors import ConversionError
from speculators_env import spec_env  # noqa: F401  (fixture)

VERIFIER = str((REPO / "examples" / "world-qwen3" / "verifier").resolve())
H, I, NH, NKV, D, N = 128, 384, 4, 2, 32, 8
IDS, MASK, B = [1, 3, 5], 2047, 4


def zlab(folder: Path, ids=IDS, mask: int | None = MASK, layers: int = 2, block: int = B, extra: dict | None = None, **cfg_more) -> dict:
    """A z-lab / SpecForge DFlash checkpoint for the example verifier: random bfloat16 weights, the published config's keys."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: (0.05 * torch.randn(*s, generator=g)).to(torch.bfloat16)  # noqa: E731
    n = lambda k: (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16)  # noqa: E731
    n_taps = len(ids) if ids is not None else len(build_target_layer_ids(N, layers))
    t = {"fc.weight": r(H, n_taps * H), "hidden_norm.weight": n(H), "norm.weight": n(H)}
    for i in range(layers):
        p = f"layers.{i}."
        t.update({p + "input_layernorm.weight": n(H), p + "post_attention_layernorm.weight": n(H), p + "self_attn.q_proj.weight": r(NH * D, H),
                  p + "self_attn.k_proj.weight": r(NKV * D, H), p + "self_attn.v_proj.weight": r(NKV * D, H), p + "self_attn.o_proj.weight": r(H, NH * D),
                  p + "self_attn.q_norm.weight": n(D), p + "self_attn.k_norm.weight": n(D), p + "mlp.gate_proj.weight": r(I, H),
                  p + "mlp.up_proj.weight": r(I, H), p + "mlp.down_proj.weight": r(H, I)})
    t.update(extra or {})
    folder.mkdir(parents=True)
    save_file(t, str(folder / "model.safetensors"))
    dc = {"mask_token_id": mask, "target_layer_ids": list(ids)} if ids is not None else {"mask_token_id": mask}
    if mask is None:
        dc.pop("mask_token_id")
    cfg = {"architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0, "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "block_size": block, "bos_token_id": 0, "dflash_config": dc, "dtype": "bfloat16", "eos_token_id": 1, "head_dim": D, "hidden_act": "silu",
           "hidden_size": H, "initializer_range": 0.02, "intermediate_size": I, "layer_types": ["full_attention"] * layers,
           "max_position_embeddings": 2048, "max_window_layers": layers, "model_type": "qwen3", "num_attention_heads": NH,
           "num_hidden_layers": layers, "num_key_value_heads": NKV, "num_target_layers": N, "rms_norm_eps": 1e-6, "rope_scaling": None,
           "rope_theta": 10000, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
           "vocab_size": 2048, **cfg_more}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return t


THEIRS = r"""
import sys
from speculators.convert.dflash import DFlashConverter
DFlashConverter().convert(sys.argv[1], sys.argv[2], base_model=sys.argv[3], validate=True)
"""

#: every config field where speculators' output differs from ours, and why (``transformer_layer_config`` keys prefixed ``tlc.``)
DIFFERENCES = {
    "sliding_window_non_causal": "speculators leaves its default (false); vLLM then builds every layer causal "
                                 "(update_dflash: causal = not it; qwen3_dflash.py _dflash_layer_causal), but the source's layers attend "
                                 "within the block both ways (Qwen3DFlashAttention.is_causal = False): specfmt writes true",
    "architectures": "save_pretrained writes the class (DFlashDraftModel); the format's is DFlashSpeculator. vLLM sets its own (update_dflash)",
    "auto_map": "a transformers save_pretrained artefact for speculators' own loader; vLLM does not read it",
    "transformers_version": "a transformers save_pretrained artefact",
    "tlc.architectures": "specfmt names the decoder family's class, as for every converter",
    "tlc.rope_theta": "specfmt writes it beside rope_parameters (vLLM 0.30 reads rope_theta); transformers 5 folds it into rope_parameters",
    "tlc.mlp_bias": "specfmt writes the typed decoder config's default explicitly",
    **{f"tlc.{k}": "copied by speculators from the source's config (it keeps every key it does not know); not a field of the draft's "
                   "decoder that vLLM reads" for k in ("attention_dropout", "bos_token_id", "eos_token_id", "initializer_range", "use_cache")},
}


def _diff(ours: dict, theirs: dict) -> set[str]:
    """The fields whose values differ (null and absent are the same: vLLM and transformers read both as None)."""
    out = {k for k in set(ours) | set(theirs) if k not in ("specfmt", "transformer_layer_config") and ours.get(k) != theirs.get(k)}
    a, b = ours["transformer_layer_config"], theirs["transformer_layer_config"]
    return out | {f"tlc.{k}" for k in set(a) | set(b) if a.get(k) != b.get(k)}


def _vllm_reads(cfg: dict) -> dict:
    """vLLM 0.32's own speculators reader on a config (no engine): the draft's Hugging Face config it builds."""
    from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES

    pre = dict(cfg["transformer_layer_config"])
    SUPPORTED_SPECULATORS_TYPES["dflash"](cfg, pre)
    return pre


@pytest.fixture(scope="module")
def both(spec_env, tmp_path_factory) -> tuple[Path, dict]:
    """One z-lab draft converted by specfmt (``ours``) and by speculators 0.9 (``theirs``): the folder holding both, the source's tensors."""
    root = tmp_path_factory.mktemp("both")
    tensors = zlab(root / "src")
    convert("dflash", str(root / "src"), root / "ours", VERIFIER)
    r = spec_env.run("-c", THEIRS, root / "src", root / "theirs", VERIFIER)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, tensors


def test_specfmt_and_speculators_convert_a_zlab_draft_to_the_same_tensors_and_differ_only_where_stated(both):
    root, tensors = both
    ours_t, theirs_t = load_file(str(root / "ours" / "model.safetensors")), load_file(str(root / "theirs" / "model.safetensors"))
    assert sorted(ours_t) == sorted(theirs_t) == sorted(tensors)  # neither writes an embedding or lm_head (Vd = V: the verifier's)
    assert all(torch.equal(ours_t[n], theirs_t[n]) and torch.equal(ours_t[n], tensors[n]) for n in tensors)
    ours, theirs = (json.loads((root / d / "config.json").read_text()) for d in ("ours", "theirs"))
    for key in ("speculators_model_type", "aux_hidden_state_layer_ids", "mask_token_id", "block_size", "draft_vocab_size", "sample_from_anchor",
                "target_hidden_size", "speculators_config"):
        assert ours[key] == theirs[key], key
    assert ours["aux_hidden_state_layer_ids"] == [i + 1 for i in IDS] and ours["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == B - 1
    assert _diff(ours, theirs) == set(DIFFERENCES)


@pytest.mark.vllm
def test_vllm_reads_ours_non_causal_and_speculators_causal(both):
    """The difference that matters, through vLLM 0.32's own reader (no engine): the same taps and mask token, and vLLM
    builds our draft's layers non-causal, as the source's attend, speculators' causal. Marked ``vllm``: without vLLM it
    fails (conftest), never skips."""
    root, _ = both
    ours, theirs = (json.loads((root / d / "config.json").read_text()) for d in ("ours", "theirs"))
    mine, spec = _vllm_reads(ours), _vllm_reads(theirs)
    assert mine["dflash_config"]["target_layer_ids"] == spec["dflash_config"]["target_layer_ids"] == IDS  # the source's own ids, back
    assert mine["dflash_config"]["mask_token_id"] == MASK and mine["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in IDS]
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    assert SpeculatorsConfig.build_vllm_speculative_config(ours) == {"method": "dflash", "num_speculative_tokens": B - 1}  # a block of 1 + k = B
    assert mine["dflash_config"]["causal"] is False and spec["dflash_config"]["causal"] is True  # the difference that matters


def test_a_tap_of_the_verifiers_last_layer_is_refused_and_breaks_speculators_converter(spec_env, tmp_path):
    """z-lab's id N - 1 is HF's ``hidden_states[N]`` (after the final norm); vLLM would read layer N - 1's output, before it. speculators drops the tap from its ids but keeps ``fc``'s columns, so its own model no longer loads them."""
    src = tmp_path / "src"
    zlab(src, ids=[1, 3, N - 1])
    with pytest.raises(ConversionError, match=rf"taps the verifier's last layer \({N - 1}\).*hidden_states\[{N}\], after the final norm"):
        convert("dflash", str(src), tmp_path / "ours", VERIFIER)
    r = spec_env.run("-c", THEIRS, src, tmp_path / "theirs", VERIFIER)
    assert r.returncode != 0 and "size mismatch for fc.weight" in r.stderr, r.stderr[-2000:]


def _cfg(tmp_path: Path, name: str, opts: Options | None = None, **kw) -> dict:
    zlab(tmp_path / name, **kw)
    return convert("dflash", str(tmp_path / name), tmp_path / f"{name}-out", VERIFIER, opts=opts).config


def test_each_decision_follows_the_source_and_a_changed_source_changes_the_output(tmp_path):
    """The taps are the source's ids + 1, the block its block_size (k = B - 1), the mask its mask token; without ids, SpecForge's
    default; without a mask token, ``--mask-token-id``."""
    base = _cfg(tmp_path, "base")
    assert [base["aux_hidden_state_layer_ids"], base["mask_token_id"], base["block_size"]] == [[2, 4, 6], MASK, B]
    assert _cfg(tmp_path, "ids", ids=[0, 3, 5])["aux_hidden_state_layer_ids"] == [1, 4, 6]
    assert _cfg(tmp_path, "mask", mask=5)["mask_token_id"] == 5
    blk = _cfg(tmp_path, "blk", block=8)
    assert blk["block_size"] == 8 and blk["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # SpecForge's qwen3-8b-dflash template's ids
    assert _cfg(tmp_path, "default", ids=None)["aux_hidden_state_layer_ids"] == [2, 6]  # SpecForge's [1, 5] for N 8 and 2 draft layers, + 1
    assert _cfg(tmp_path, "given", opts=Options(mask_token_id=9), mask=None)["mask_token_id"] == 9


@pytest.mark.parametrize("case, kw, opts, message", [
    ("no mask token", {"mask": None}, None, "dflash_config.mask_token_id is missing"),
    ("contradicted mask token", {}, Options(mask_token_id=3), f"--mask-token-id 3 contradicts dflash_config.mask_token_id {MASK}"),
    ("mask token outside V", {"mask": 2048}, None, "mask token id 2048 is outside the vocabulary"),
    ("layer inputs", {}, Options(tap_ids="layer-input"), "--tap-ids layer-input contradicts z-lab's extract_context_feature"),
    ("k", {}, Options(speculative_tokens=5), "--speculative-tokens 5, but a block of 4 proposes 3"),
    ("two blocks", {"dflash_config_block": 8}, None, "block_size 4 and dflash_config.block_size 8 differ"),
    ("unknown key", {"dflash_config_more": {"window": 3}}, None, "dflash_config has fields this converter does not know: ['window']"),
    ("projector", {"dflash_config_more": {"projector_type": "mlp"}}, None, "dflash_config.projector_type='mlp'"),
    ("shifted labels", {"dflash_config_more": {"shift_label": True}}, None, "dflash_config.shift_label=True"),
    ("prefix", {"dflash_config_more": {"pure_draft_prefix_len": 2}}, None, "dflash_config.pure_draft_prefix_len=2"),
    ("other verifier", {"num_target_layers": 36}, None, "num_target_layers 36 but the verifier has 8 layers"),
    ("sliding layers", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}, None, "sliding_attention layers"),
    ("laguna", {"extra": {"layers.0.self_attn.g_proj.weight": torch.zeros(H, H, dtype=torch.bfloat16)}}, None, "Laguna-style DFlash tensors"),
    ("fc", {"extra": {"fc.weight": torch.zeros(H, 2 * H, dtype=torch.bfloat16)}}, None, "fc.weight [128, 256], but 3 taps of width 128 need [128, 384]"),
])
def test_what_the_source_does_not_say_exactly_is_refused_in_one_line(tmp_path, case, kw, opts, message):
    kw = dict(kw)
    block, more = kw.pop("dflash_config_block", None), kw.pop("dflash_config_more", {})
    zlab(tmp_path / "src", **kw)
    if block is not None or more:
        cfg = json.loads((tmp_path / "src" / "config.json").read_text())
        cfg["dflash_config"].update(more, **({"block_size": block} if block is not None else {}))
        (tmp_path / "src" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError) as e:
        convert("dflash", str(tmp_path / "src"), tmp_path / "out", VERIFIER, opts=opts)
    assert message in e.value.one_line() and "\n" not in e.value.one_line()


def test_inspect_and_from_auto_name_a_zlab_draft_dflash_even_when_its_fc_looks_like_eagle1s(tmp_path):
    """Two taps give ``fc`` [H, 2H] and ``layers.*``, EAGLE-1's layout too: ``dflash_config`` decides (dflash is first in
    ``--from auto``'s order)."""
    from specfmt.detect import detect

    zlab(tmp_path / "src", ids=[1, 5])
    d = detect(tmp_path / "src")
    assert (d.format, d.layout, d.candidates) == ("dflash", "specforge", ["dflash"])
    out = convert("auto", str(tmp_path / "src"), tmp_path / "out", VERIFIER)
    assert out.config["aux_hidden_state_layer_ids"] == [2, 6]
