"""SpecForge's own exporter (``specforge/export/to_sglang.py``, SpecForge 0.2.0 in the SGLang env of
``tests/sglang_env.py``) writes the world's EAGLE-3 draft in SGLang's layout, and ``specfmt convert --from auto``
reads that export.

SpecForge exports from a training checkpoint (``training_state.pt``: ``strategy`` and ``draft_state_dict``) and its
draft config; the world's SafeAILab draft is that state dict (``midlayer.*``, ``fc``, ``norm``, ``lm_head``,
``d2t``, ``t2d``: SpecForge's module names), with ``architectures: LlamaForCausalLMEagle3``. ``export_to_sglang``
builds SpecForge's ``LlamaForCausalLMEagle3`` in bfloat16 (``materialize_draft``), loads the state, drops the
embedding and ``save_pretrained``s it. The conversion must give the SpecForge export's tensors, every one, renamed
to specfmt's names: the world draft's values cast to bfloat16, as SpecForge wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_drafts import VERIFIER, WORLD
from sglang_env import STUB, sgl_env  # noqa: F401  (fixture)
from specfmt.convert import convert

#: run in the env: the world draft as a SpecForge training checkpoint, exported by SpecForge's own exporter; and the same
#: draft as SpecForge's EAGLE-3.1 (``fc_norm``: three per-tap norms, and SpecForge's top-level ``norm_output: true``)
EXPORT = r"""
import json, sys
from pathlib import Path
import torch
from specforge.export.to_sglang import export_to_sglang

world, tmp = Path(sys.argv[1]), Path(sys.argv[2])
weights = torch.load(world / "pytorch_model.bin", map_location="cpu")
cfg = json.loads((world / "config.json").read_text())
cfg["architectures"] = ["LlamaForCausalLMEagle3"]
gen = torch.Generator().manual_seed(0)
norms = {f"fc_norm.{k}.weight": 1 + 0.1 * torch.randn(cfg["hidden_size"], generator=gen) for k in range(3)}
for name, extra, fields in (("plain", {}, {}), ("eagle3.1", norms, {"fc_norm": True, "norm_output": True})):
    torch.save({"strategy": "eagle3", "draft_state_dict": {**weights, **extra}}, tmp / f"{name}.pt")
    (tmp / f"{name}.json").write_text(json.dumps({**cfg, **fields}))
    export_to_sglang(str(tmp / f"{name}.pt"), str(tmp / f"{name}.json"), str(tmp / name))
"""


@pytest.fixture(scope="module")
def specforge_export(sgl_env, tmp_path_factory) -> Path:  # noqa: F811
    tmp = tmp_path_factory.mktemp("specforge")
    r = sgl_env.run("-c", STUB + EXPORT, WORLD / "eagle3-safeailab", tmp)
    assert r.returncode == 0, r.stderr[-4000:]
    return tmp


def _converted(export: Path, out: Path) -> tuple[dict, dict, dict]:
    """SpecForge's tensors, specfmt's conversion of them, and its config; every tensor converted, renamed, value for value."""
    theirs = load_file(str(next(export.glob("*.safetensors"))))
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    result = convert("auto", str(export), out, str(VERIFIER))
    assert result.plan.layout == "safeailab"  # midlayer.*, no eagle_config: SGLang captures its default taps, which convert writes
    ours = load_file(str(out / "model.safetensors"))
    back = {("layers.0." + n[len("midlayer."):] if n.startswith("midlayer.") else n): t for n, t in theirs.items()}
    assert sorted(ours) == sorted(back)
    for name, t in back.items():
        assert ours[name].dtype == t.dtype and torch.equal(ours[name], t), name
    return theirs, ours, json.loads((out / "config.json").read_text())


def test_specforges_sglang_export_of_the_world_draft_converts_every_tensor(specforge_export, tmp_path):
    theirs, ours, cfg = _converted(specforge_export / "plain", tmp_path / "out")
    assert {"midlayer.self_attn.q_proj.weight", "d2t", "t2d"} <= set(theirs)
    world = torch.load(WORLD / "eagle3-safeailab" / "pytorch_model.bin", map_location="cpu")
    for name, t in world.items():  # SpecForge's values are the world draft's, cast to bfloat16 (materialize_draft)
        assert torch.equal(theirs[name], t.to(theirs[name].dtype)), name
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_specforges_eagle3_1_export_converts_with_its_norms(specforge_export, tmp_path):
    """SpecForge's ``norm_output: true`` is its own (norm before lm_head, the pre-norm output fed back): vLLM's false."""
    theirs, ours, cfg = _converted(specforge_export / "eagle3.1", tmp_path / "out")
    assert {f"fc_norm.{k}.weight" for k in range(3)} <= set(ours)
    assert (cfg["fc_norm"], cfg["norm_output"]) == (True, False)
