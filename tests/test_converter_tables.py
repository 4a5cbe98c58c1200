"""A converter is tables plus a few named transforms (issue 24): the source dialect's name map
applied first, refusals as rows, the tap convention in one shared module, short methods, and a
plan that reads output names, never the source's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO, WORLD
from test_architecture import FakeReader, _eagle3_config, _eagle3_shapes

CONVERTERS = REPO / "converters"


def _plan(converter: str, config: dict, reader, names=None, opts=None):
    from specfmt.converters import Options, Source, get
    from specfmt.sources.resolve import Resolved
    from specfmt.sources.verifier import Verifier

    src = Source(Resolved(Path("/nonexistent-fake-source"), "fake/source", None, True), config, reader, Verifier.load(str(WORLD / "verifier")), names)
    return get(converter).plan(src, opts or Options())


def _summary(plan):
    """What a plan decides, apart from the source names (a kept name under a map is a rename of the real one)."""
    copied = {"keep": "copy", "rename": "copy"}
    return (plan.layout, plan.config, plan.notes, plan.unknown, [(m.dst, copied.get(m.action, m.action), m.reason, m.out_dtype) for m in plan.moves],
            [(d.dst, d.shape, d.out_dtype, d.how) for d in plan.derived])


@pytest.mark.parametrize("dialect", ["prefix", "substr", "regex"])
def test_a_source_whose_names_go_through_a_name_map_plans_identically(dialect):
    from specfmt.converters.base import NameMap

    shapes = _eagle3_shapes()
    plain = _plan("eagle3", _eagle3_config(), FakeReader(shapes))
    if dialect == "prefix":
        names, renamed = NameMap(prefix=(("draft_model.", ""),)), {f"draft_model.{n}": v for n, v in shapes.items()}
    elif dialect == "substr":
        names, renamed = NameMap(substr=(("decoder_block.", "midlayer."),)), {n.replace("midlayer.", "decoder_block."): v for n, v in shapes.items()}
    else:
        names, renamed = NameMap(regex=((r"^ext\.(.+)$", r"\1"),)), {f"ext.{n}": v for n, v in shapes.items()}
    mapped = _plan("eagle3", _eagle3_config(), FakeReader(renamed), names)
    assert _summary(mapped) == _summary(plain)
    # the moves name the real source tensors: what is read, and recorded in the provenance block
    assert sorted(m.src for m in mapped.moves) == sorted(renamed)


@pytest.mark.vllm
def test_a_name_map_reads_names_as_vllms_weights_mapper_does():
    """Marked ``vllm`` (vLLM's ``WeightsMapper`` is the reference): without vLLM it fails (conftest), never skips."""
    from vllm.model_executor.models import utils
    from specfmt.converters.base import NameMap

    regex = ((r"^fusion_fc\.(weight|bias)$", r"fc.\1"), (r"^transformer\.(.+)$", r"layers.0.\1"), (r"^(model\.)?lm_head\.weight$", None))
    ours = NameMap(regex=regex, substr=(("block.", "layer."),), prefix=(("model.", ""),))
    theirs = utils.WeightsMapper(orig_to_new_regex={re.compile(p): t for p, t in regex}, orig_to_new_substr={"block.": "layer."},
                                 orig_to_new_prefix={"model.": ""})
    for name in ("fusion_fc.weight", "fusion_fc.bias", "transformer.mlp.up_proj.weight", "lm_head.weight", "model.lm_head.weight",
                 "model.layers.0.block.weight", "model.fc.weight", "embed_tokens.weight"):
        assert ours.map_name(name) == theirs.map_name(name), name


def test_the_dialects_are_name_maps():
    from specfmt.converters.eagle import SPECULATORS_EAGLE_NAMES, V0_NAMES

    assert SPECULATORS_EAGLE_NAMES.view(["fusion_fc.weight", "fusion_fc.bias", "transformer.self_attn.q_proj.weight", "embed_tokens.weight"]) == {
        "fc.weight": "fusion_fc.weight", "fc.bias": "fusion_fc.bias", "layers.0.self_attn.q_proj.weight": "transformer.self_attn.q_proj.weight",
        "embed_tokens.weight": "embed_tokens.weight"}
    assert V0_NAMES.view(["model.fc.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight", "model.lm_head.weight", "fc.bias"]) == {
        "fc.weight": "model.fc.weight", "layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight", "fc.bias": "fc.bias"}


def test_a_refusal_row_raises_its_message_hint_and_file():
    from specfmt.converters.base import Refusal, refuse
    from specfmt.errors import ConversionError

    table = (Refusal(lambda c: c.get("a") == 1, "a is one", hint="set a"),
             Refusal(lambda c: c.get("b", 0) > 2, lambda c: f"b is {c['b']}", where=None))
    refuse(table, {"a": 0, "b": 1})
    with pytest.raises(ConversionError) as e:
        refuse(table, {"a": 1, "b": 5})  # the first row that holds
    assert (e.value.message, e.value.hint, e.value.where) == ("a is one", "set a", "config.json")
    with pytest.raises(ConversionError) as e:
        refuse(table, {"b": 5})
    assert (e.value.message, e.value.hint, e.value.where) == ("b is 5", None, None)


def test_a_field_reading_puts_a_layouts_meaning_in_vllms_with_a_note_or_refuses():
    from specfmt.converters.base import FieldReading, Refusal, read_fields
    from specfmt.errors import ConversionError

    readings = (FieldReading("norm_output", lambda cfg, _: "norm_output" in cfg, lambda cfg, _: False, "read as vLLM's false",
                             Refusal(lambda cfg: cfg["norm_output"] is False, "false has no vLLM reading")),)
    notes: list[str] = []
    cfg = {"norm_output": True, "hidden_size": 8}
    assert read_fields(readings, cfg, None, notes) == {"norm_output": False, "hidden_size": 8} and notes == ["read as vLLM's false"]
    assert cfg["norm_output"] is True  # the source's config is left as it is
    assert read_fields(readings, {"hidden_size": 8}, None, notes) == {"hidden_size": 8} and len(notes) == 1
    with pytest.raises(ConversionError, match="false has no vLLM reading"):
        read_fields(readings, {"norm_output": False}, None, notes)


def test_one_unnumbered_midlayer_is_read_as_one_layer_with_a_note():
    plan = _plan("eagle3", _eagle3_config(num_hidden_layers=32), FakeReader(_eagle3_shapes()))
    assert plan.config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert any("num_hidden_layers=32" in n and "converted as 1 layer" in n for n in plan.notes)


def test_an_eagle_config_flag_is_refused_by_its_table_row():
    from specfmt.errors import ConversionError

    with pytest.raises(ConversionError, match=r"eagle_config.use_mtp_layernorm=True describes a draft vLLM's EAGLE-3 model does not run \(needs False\)"):
        _plan("eagle3", _eagle3_config(eagle_config={"use_mtp_layernorm": True}), FakeReader(_eagle3_shapes()))


def test_the_tap_convention_lives_in_one_shared_module():
    from specfmt.converters import eagle3, taps

    assert eagle3.read_taps is taps.read_taps and eagle3.TAP_READINGS is taps.TAP_READINGS
    src = (CONVERTERS / "eagle3.py").read_text()
    assert "def read_taps" not in src and "TAP_READINGS: dict" not in src


def _functions(path: Path):
    """``(qualified name, lines, is a method)`` of every function in a module."""
    out = []

    def walk(node, prefix, in_class):
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + n.name, n.end_lineno - n.lineno + 1, in_class))
                walk(n, prefix + n.name + ".", False)
            elif isinstance(n, ast.ClassDef):
                walk(n, prefix + n.name + ".", True)

    walk(ast.parse(path.read_text()), "", False)
    return out


def test_no_converter_method_is_longer_than_40_lines_and_no_function_than_80():
    long = {f"{p.name}::{name}": n for p in sorted(CONVERTERS.glob("*.py")) for name, n, method in _functions(p) if n > (40 if method else 80)}
    assert long == {}


def test_no_converter_reads_the_source_names_outside_the_base():
    """A plan reads output names (``Plan.outputs`` / ``Plan.names``); only the shared base (and a
    dialect's translation, through ``Source.source_names``) sees the source's."""
    pattern = re.compile(r"\bsrc\.reader\b|\breader\.infos\b")
    offenders = {p.name: [i + 1 for i, line in enumerate(p.read_text().splitlines()) if pattern.search(line)]
                 for p in CONVERTERS.glob("*.py") if p.name != "base.py"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_source_finder_finds_reads():
    pattern = re.compile(r"\bsrc\.reader\b|\breader\.infos\b")
    assert [bool(pattern.search(s)) for s in ("x = src.reader.infos", "reader.infos[n]", "vreader.infos[n]", "src.source_names")] == [True, True, False, False]
