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

#: run in the env: the world draft as a SpecForge training checkpoint, exported by SpecForge's own exporter
EXPORT = r"""
import json, sys
from pathlib import Path
import torch
from specforge.export.to_sglang import export_to_sglang

world, tmp = Path(sys.argv[1]), Path(sys.argv[2])
state = {"strategy": "eagle3", "draft_state_dict": torch.load(world / "pytorch_model.bin", map_location="cpu")}
torch.save(state, tmp / "training_state.pt")
cfg = json.loads((world / "config.json").read_text())
cfg["architectures"] = ["LlamaForCausalLMEagle3"]
(tmp / "draft_config.json").write_text(json.dumps(cfg))
export_to_sglang(str(tmp / "training_state.pt"), str(tmp / "draft_config.json"), str(tmp / "specforge-sglang"))
"""


@pytest.fixture(scope="module")
def specforge_export(sgl_env, tmp_path_factory) -> Path:  # noqa: F811
    tmp = tmp_path_factory.mktemp("specforge")
    r = sgl_env.run("-c", STUB + EXPORT, WORLD / "eagle3-safeailab", tmp)
    assert r.returncode == 0, r.stderr[-4000:]
    return tmp / "specforge-sglang"


def test_specforges_sglang_export_of_the_world_draft_converts_every_tensor(specforge_export, tmp_path):
    theirs = load_file(str(next(specforge_export.glob("*.safetensors"))))
    assert json.loads((specforge_export / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert {"midlayer.self_attn.q_proj.weight", "d2t", "t2d"} <= set(theirs)
    result = convert("auto", str(specforge_export), tmp_path / "out", str(VERIFIER))
    assert result.plan.layout == "safeailab"  # midlayer.*, no eagle_config: SGLang captures its default taps, which convert writes
    ours = load_file(str(tmp_path / "out" / "model.safetensors"))
    back = {("layers.0." + n[len("midlayer."):] if n.startswith("midlayer.") else n): t for n, t in theirs.items()}
    assert sorted(ours) == sorted(back)
    for name, t in back.items():
        assert ours[name].dtype == t.dtype and torch.equal(ours[name], t), name
    world = torch.load(WORLD / "eagle3-safeailab" / "pytorch_model.bin", map_location="cpu")
    for name, t in world.items():  # SpecForge's values are the world draft's, cast to bfloat16 (materialize_draft)
        assert torch.equal(theirs[name], t.to(theirs[name].dtype)), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
