"""Every remaining source layout of the converters, converted for the example verifier and served.

`test_vllm_e2e.py` and `test_vllm_medusa.py` probe one conversion per output variant in
depth; here each other source layout's converted folder goes through `vllm serve`
detection too (no speculative config): the method vLLM attaches, drafts counted, greedy
tokens equal to the verifier alone, and every draft weight vLLM holds equal to the file's.
"""

from __future__ import annotations


import pytest
import torch

from builders import write_eagle1, write_speculators_eagle3
from builders_medusa import write_full, write_legacy
from conftest import E2E_TOKENS, WORLD, assert_served
from test_layouts import write_d2t_only, write_v0_wrapper, write_vllm_medusa
from specfmt.convert import convert
from specfmt.converters import Options
from specfmt.validation.vllm_run import generate

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not

W1 = {"hidden": 128, "vocab": 2048, "inter": 384, "heads": 4, "kv_heads": 2}  # examples/world/verifier
VERIFIER = str((WORLD / "verifier").resolve())

LAYOUTS = {
    "hass-safetensors": ("hass", lambda d: write_eagle1(d, fmt="safetensors", seed=5, **W1), "eagle"),
    "eagle-accelerate-no-bias": ("eagle", lambda d: write_eagle1(d, fmt="accelerate", fc_bias=False, seed=6, **W1), "eagle"),
    "medusa-legacy-trainer": ("medusa", lambda d: write_legacy(d, hidden=128, vocab=2048, heads=3, dtype=torch.float32, seed=7), "medusa"),
    "medusa-2-full": ("medusa", lambda d: write_full(d, hidden=128, vocab=2048, heads=2), "medusa"),
    "speculators-0.1-converter": ("speculators", lambda d: write_speculators_eagle3(d, VERIFIER, style="converter-0.1", hidden=128, vocab=2048, draft_vocab=1024, inter=384, heads=4, kv_heads=2), "eagle3"),
    "eagle-vllm-v0-wrapper": ("auto", lambda d: write_v0_wrapper(d, fc_bias=True, prefix="model.", seed=8, **W1), "eagle"),
    "medusa-vllm-names": ("auto", lambda d: write_vllm_medusa(d, hidden=128, vocab=2048, bias=True), "medusa"),
    "eagle3-d2t-int32-only": ("auto", lambda d: write_d2t_only(d, hidden=128, vocab=2048, draft_vocab=1024), "eagle3"),
    "modelopt-0.1.0.dev14": ("speculators", lambda d: write_speculators_eagle3(d, VERIFIER, style="modelopt", hidden=128, vocab=2048, draft_vocab=1024, inter=384, heads=4, kv_heads=2), "eagle3"),
}
#: layouts whose tap ids name no convention (a SpecForge eagle_config): read as SGLang's layer outputs
TAP_IDS = {"eagle3-d2t-int32-only": "layer-output"}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_is_served_exactly(tmp_path, layout, world_prompts, verifier_alone):
    source_format, build, method = LAYOUTS[layout]
    out = tmp_path / "out"
    convert(source_format, str(build(tmp_path / "src")), out, VERIFIER, opts=Options(tap_ids=TAP_IDS.get(layout)))
    held = tmp_path / "held.safetensors"
    assert_served(generate(str(out), world_prompts, max_tokens=E2E_TOKENS, dump_draft=str(held)), verifier_alone, out, method, E2E_TOKENS, held)
