"""Typed configs (issue 24): one class per algorithm states its fields, types, defaults and rules once;
the published JSON Schema, the builders' output and the converters' field tables all come from it.

* the committed ``schemas/config-v1.schema.json`` is what the classes generate, byte for byte;
* v1 stays v1: every config that validated before this issue (main's schema, frozen as
  ``tests/data/config-v1.as-of-issue-24.schema.json``, then main's rules) still validates with the
  generated schema and the typed classes, and every config refused then gets the same answer, over a
  corpus (``tests/data/configs-v1-corpus.json``: every config the tests write, the speculators configs
  of ``examples/``, ``tests/data/real_configs`` and the tests' inputs, with main's answer; written by
  ``tests/snapshot_outputs.py corpus``) and fuzzed edits of it;
* a variant of an algorithm is a subclass (a P-EAGLE-like config adds one field and its name);
* builders write the file's keys in the file's order; the converters' field tables are derived.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, ClassVar

import pytest
from conftest import REPO, WORLD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field

from specfmt.algorithms.eagle import EagleConfig, EagleLayerConfig
from specfmt.algorithms.eagle3 import Eagle3Config
from specfmt.algorithms.medusa import MedusaConfig
from specfmt.format.config import CONFIGS, DecoderConfig, SpeculatorConfig
from specfmt.format.model import (BOOL, INDEXES, NON_NEGATIVE_INT, OBJECT, POSITIVE_INT, POSITIVE_REAL, STRING, STRINGS, ConfigModel,
                                  Nullable, PositiveInt, PositiveNumber, SchemaBuilder, Unchecked, field_kinds, kind_of)
from specfmt.format.schema_gen import generate_schema, schema_text

DATA = REPO / "tests" / "data"
FROZEN = DATA / "config-v1.as-of-issue-24.schema.json"
CORPUS = DATA / "configs-v1-corpus.json"


@lru_cache(maxsize=None)
def _validator(path: Path):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(path.read_text()), format_checker=Draft202012Validator.FORMAT_CHECKER)


def violations(schema_path: Path, cfg) -> list[tuple[str, str]]:
    """What :func:`specfmt.format.schema.json_schema_violations` reports, against the schema file given."""
    out = []
    for err in _validator(schema_path).iter_errors(cfg):
        msg = err.message
        if err.validator == "not" and isinstance(err.validator_value, dict):
            msg = err.validator_value.get("description", msg)
        out.append(("$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path), _as_v1(msg)))
    return sorted(set(out))


NEW = REPO / "schemas" / "config-v1.schema.json"
#: the algorithms added to v1 after it was frozen here (issue 25): branches of their own; v1's answer to every other config stands
ADDED = ("peagle", "dflash")


def _as_v1(message: str) -> str:
    """A message as v1 worded it: the ``speculators_model_type`` enum listed only v1's algorithms."""
    for name in reversed(ADDED):  # the last added is listed last
        message = message.replace(f", {name!r}]", "]")
    return message


def widened(cfg, violation: tuple[str, str]) -> bool:
    """The one place the generated schema accepts more than v1 did: ``num_aux_hidden_states`` is EAGLE-3's
    (:class:`~specfmt.algorithms.eagle3.Eagle3LayerConfig`), so an eagle (EAGLE-1) decoder config no longer
    constrains that key, which vLLM's EAGLE-1 model never reads."""
    return isinstance(cfg, dict) and cfg.get("speculators_model_type") == "eagle" and violation[0].startswith(
        "$.transformer_layer_config.num_aux_hidden_states")


# --------------------------------------------------------------------------- the schema file


def test_the_committed_schema_is_the_one_the_typed_configs_generate():
    from specfmt.algorithms.schema import generated

    assert NEW.read_text(encoding="utf-8") == schema_text(generated()), "run: python3 -m specfmt.algorithms.schema --write"


def test_the_generated_schema_keeps_v1s_identity_and_shape():
    schema = json.loads(NEW.read_text())
    frozen = json.loads(FROZEN.read_text())
    for key in ("$schema", "$id", "title", "description", "required"):
        assert schema[key] == frozen[key], key
    model_type = schema["properties"]["speculators_model_type"]
    assert {**model_type, "enum": [n for n in model_type["enum"] if n not in ADDED]} == frozen["properties"]["speculators_model_type"]
    branches = [b["if"] for b in schema["allOf"] if b["if"]["properties"]["speculators_model_type"]["const"] not in ADDED]
    assert branches == [b["if"] for b in frozen["allOf"]]  # one branch per algorithm, keyed the same way
    assert set(frozen["$defs"]) <= set(schema["$defs"])
    # the messages tests and users read come from the same keywords
    eagle3 = schema["$defs"]["eagle3"]
    assert eagle3["not"] == frozen["$defs"]["eagle3"]["not"] and sorted(eagle3["required"]) == sorted(frozen["$defs"]["eagle3"]["required"])
    assert eagle3["properties"]["eagle_aux_hidden_state_layer_ids"]["type"] == "array"


def test_the_schema_check_command_finds_a_stale_file(tmp_path, monkeypatch, capsys):
    from specfmt.algorithms import schema as gen

    stale = tmp_path / "config-v1.schema.json"
    stale.write_text(FROZEN.read_text())
    monkeypatch.setattr(gen, "committed_path", lambda: stale)
    assert gen.main(["--check"]) == 1 and "stale" in capsys.readouterr().out
    assert gen.main(["--write"]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text() == NEW.read_text()


# --------------------------------------------------------------------------- backwards compatibility


def corpus() -> list[dict]:
    """The configs specfmt wrote in the conversion tests' folders (each with its provenance block)."""
    return json.loads(CORPUS.read_text())["configs"]


def inputs() -> list[dict]:
    """``{"where", "config"}``: the speculators configs specfmt did not write (``examples/``,
    ``tests/data/real_configs``, the tests' inputs) that validated before issue 24."""
    return json.loads(CORPUS.read_text())["inputs"]


def refused() -> list[dict]:
    """``{"where", "config", "on_main"}``: the corpus's configs that did not validate before issue 24
    (older speculators checkpoints, broken and fuzzed files), with what validation reported then."""
    return json.loads(CORPUS.read_text())["refused"]


def test_the_corpus_holds_every_kind_of_output():
    configs = corpus()
    assert len(configs) >= 50
    kinds = {c["speculators_model_type"] for c in configs}
    assert kinds == set(CONFIGS) - set(ADDED)
    layouts = {c["specfmt"]["source"]["format"] + "/" + c["specfmt"]["source"]["layout"] for c in configs}
    assert len(layouts) >= 15, sorted(layouts)
    assert any(c["specfmt"].get("train") for c in configs) and any(c["specfmt"].get("upgrades") for c in configs)
    assert any(c["transformer_layer_config"].get("model_type") == "qwen3" for c in configs if c["speculators_model_type"] == "eagle3")
    wheres = [i["where"] for i in inputs() + refused()]
    assert any(w.startswith("tests/data/real_configs/") for w in wheres) and any(w.startswith("<basetemp>/") for w in wheres), wheres
    assert any(w.startswith("examples/") for w in wheres), wheres


def _validates_now(cfg: dict) -> None:
    """``cfg`` validates with the generated schema and the typed classes (read, rules hold), and v1 of
    before issue 24 agrees."""
    from specfmt.algorithms import schema_violations

    assert violations(FROZEN, cfg) == []
    assert violations(NEW, cfg) == []
    typed = CONFIGS[cfg["speculators_model_type"]].of(cfg)
    assert typed.violations() == []
    assert schema_violations(cfg) == []  # what `specfmt validate` runs: the schema, then the typed rules


def test_every_config_the_tests_write_is_valid_under_v1_and_the_generated_schema():
    for cfg in corpus():
        _validates_now(cfg)


def test_every_config_that_validated_before_issue_24_still_validates():
    """The inputs of the corpus: configs specfmt did not write that main's schema and rules accepted."""
    for item in inputs():
        _validates_now(item["config"])


def test_every_config_refused_before_issue_24_gets_the_same_answer():
    """What `specfmt validate` reported on main (the v1 schema, then the rules), message for message,
    but for the one widening (:func:`widened`)."""
    from specfmt.algorithms import schema_violations

    assert len(refused()) >= 20
    for item in refused():
        cfg = item["config"]
        assert sorted({(p, _as_v1(m)) for p, m in schema_violations(cfg)}) == [tuple(v) for v in item["on_main"] if not widened(cfg, tuple(v))], item["where"]


def test_the_real_config_corpus_gets_the_same_answer_from_v1_and_the_generated_schema():
    """The published configs of ``tests/data/real_configs`` (research ones, and speculators ones of
    eagle3, peagle, dflash ...): the same violations, message for message."""
    configs = [json.loads(p.read_text())["config"] for p in sorted((DATA / "real_configs").glob("*.json"))]
    assert len(configs) >= 30
    for cfg in configs:
        assert violations(NEW, cfg) == [v for v in violations(FROZEN, cfg) if not widened(cfg, v)]


def _edits(base: dict):
    from fuzz_targets import edited_config

    return edited_config(base)


FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None, max_examples=400)


def test_fuzzed_configs_get_the_same_answer_from_v1_and_the_generated_schema():
    """Random edits (any JSON value at any path, deletions, unknown keys) of corpus configs of each
    algorithm: the generated schema reports what v1 reports, and accepts what v1 accepts."""
    picks = {}
    for cfg in corpus():
        picks.setdefault(cfg["speculators_model_type"], cfg)
    bases = list(picks.values())
    seen = {"both accept": 0, "both refuse": 0}

    @FUZZ
    @given(st.sampled_from(bases).flatmap(_edits))
    def run(cfg):
        old, new = violations(FROZEN, cfg), violations(NEW, cfg)
        assert new == [v for v in old if not widened(cfg, v)]
        seen["both refuse" if old else "both accept"] += 1

    run()
    assert seen["both accept"] > 20 and seen["both refuse"] > 100, seen


def test_typed_reading_never_fails_on_a_config_the_schema_accepts():
    """The typed rules run only after the schema holds; they must then read every such config."""
    bases = {c["speculators_model_type"]: c for c in corpus()}
    read = []

    @FUZZ
    @given(st.sampled_from(list(bases.values())).flatmap(_edits))
    def run(cfg):
        if violations(NEW, cfg) == []:
            typed = CONFIGS[cfg["speculators_model_type"]].of(cfg)
            assert isinstance(typed.violations(), list)
            read.append(cfg["speculators_model_type"])

    run()
    assert set(read) == set(CONFIGS) - set(ADDED)


# --------------------------------------------------------------------------- a variant is a subclass


class PEagleLikeConfig(Eagle3Config):
    """What P-EAGLE's config would be (speculators ``PEagleSpeculatorConfig(Eagle3SpeculatorConfig)``)."""

    name: ClassVar[str] = "peagle"
    architecture: ClassVar[str] = "PEagleDraftModel"
    schema_description: ClassVar[str] = "P-EAGLE: EAGLE-3 drafting several positions in parallel."

    mask_token_id: Nullable[Annotated[int, Field(ge=0)]] = Field(None, description="Token id padding the positions drafted in parallel.")


@pytest.fixture(scope="module")
def info():
    from specfmt.sources.verifier import Verifier

    return Verifier.load(str(WORLD / "verifier")).info


def _eagle3_layer(info) -> DecoderConfig:
    from specfmt.algorithms.layers import decoder_config, verifier_decoder_fields

    return decoder_config(verifier_decoder_fields({"intermediate_size": 384, "num_key_value_heads": 2}), 128, 4, info.vocab_size, info, "BF16", 1)


def test_a_variant_is_a_subclass_that_states_only_what_differs(info):
    from jsonschema import Draft202012Validator

    schema = generate_schema([Eagle3Config, PEagleLikeConfig])
    branch = schema["$defs"]["peagle"]
    assert schema["properties"]["speculators_model_type"]["enum"] == ["eagle3", "peagle"]
    assert branch["properties"]["speculators_config"] == {"properties": {"algorithm": {"const": "peagle"}}}
    assert branch["properties"]["mask_token_id"] == {"description": "Token id padding the positions drafted in parallel.", "type": ["integer", "null"],
                                                     "minimum": 0}
    assert branch["required"] == schema["$defs"]["eagle3"]["required"] and branch["not"] == schema["$defs"]["eagle3"]["not"]
    assert {k: v for k, v in branch["properties"].items() if k not in ("mask_token_id", "speculators_config")} == {
        k: v for k, v in schema["$defs"]["eagle3"]["properties"].items() if k != "speculators_config"}

    cfg = PEagleLikeConfig.build(info, _eagle3_layer(info), speculative_tokens=4, draft_vocab_size=info.vocab_size, taps=[2, 4, 5],
                                 dtype="bfloat16", mask_token_id=7).dump()
    assert cfg["speculators_model_type"] == cfg["speculators_config"]["algorithm"] == "peagle"
    assert cfg["architectures"] == ["PEagleDraftModel"]
    assert list(cfg)[-4:] == ["norm_output", "mask_token_id", "tie_word_embeddings", "dtype"]
    validator = Draft202012Validator(schema)
    assert list(validator.iter_errors(cfg)) == []
    assert [e.message for e in validator.iter_errors({**cfg, "mask_token_id": "x"})] == ["'x' is not of type 'integer', 'null'"]
    # EAGLE-3's rules hold for the variant as they are
    bad = PEagleLikeConfig.of({**cfg, "eagle_aux_hidden_state_layer_ids": [5, 2, 4]})
    assert ("$.eagle_aux_hidden_state_layer_ids", "[5, 2, 4] is not ascending; vLLM concatenates the taps in ascending layer order") in bad.violations()
    # the registry of real algorithms is untouched
    assert CONFIGS["peagle"] is not PEagleLikeConfig


# --------------------------------------------------------------------------- builders


#: the key order of the files builders wrote before the configs were typed (config.json is read by people)
EAGLE3_KEYS = ["architectures", "speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config", "draft_vocab_size",
               "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output",
               "tie_word_embeddings", "dtype"]
LAYER_KEYS = ["model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_parameters",
              "attention_bias", "mlp_bias", "tie_word_embeddings", "dtype"]
MEDUSA_KEYS = ["architectures", "model_type", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "medusa_fc_bias", "original_lm_head",
               "truncated_vocab_size", "speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config",
               "tie_word_embeddings", "dtype"]
SPECULATORS_BLOCK = {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                                                                 "accept_tolerance": 0.0}], "default_proposal_method": "greedy"}


def test_builders_write_the_files_keys_in_their_order(info):
    from specfmt.algorithms.eagle import build_config as eagle_config
    from specfmt.algorithms.eagle3 import build_config as eagle3_config
    from specfmt.algorithms.medusa import build_config as medusa_config

    cfg = eagle3_config(info, _eagle3_layer(info), speculative_tokens=3, draft_vocab_size=64, taps=[2, 4, 5], dtype="bfloat16")
    assert list(cfg) == EAGLE3_KEYS
    assert list(cfg["transformer_layer_config"]) == [*LAYER_KEYS, "num_aux_hidden_states"]
    assert {k: v for k, v in cfg["speculators_config"].items() if k != "verifier"} == SPECULATORS_BLOCK
    assert list(cfg["speculators_config"]["verifier"]) == ["name_or_path", "architectures"]
    assert json.dumps(cfg["transformer_layer_config"]["rope_parameters"]) == '{"rope_type": "default", "rope_theta": 10000.0}'

    layer = {**_eagle3_layer(info).dump(), "attention_bias": True}
    cfg = eagle_config(info, layer, speculative_tokens=2)
    assert list(cfg) == ["architectures", *LAYER_KEYS[:1], *LAYER_KEYS[2:], "speculators_model_type", "speculators_version", "speculators_config",
                         "transformer_layer_config"]
    assert list(cfg["transformer_layer_config"]) == LAYER_KEYS and cfg["attention_bias"] is cfg["transformer_layer_config"]["attention_bias"] is True

    cfg = medusa_config(info, hidden_size=128, vocab_size=info.vocab_size, heads=3, layers_per_head=0, fc_bias=False, original_lm_head=True,
                        dtype="float16")
    assert list(cfg) == MEDUSA_KEYS
    assert list(cfg["transformer_layer_config"]) == MEDUSA_KEYS[1:8] and cfg["num_hidden_layers"] == 0
    from specfmt.algorithms import schema_violations

    assert schema_violations(cfg) == []


def test_a_block_dumps_what_it_was_given_in_that_order_and_no_defaults():
    layer = DecoderConfig.of({"vocab_size": 8, "model_type": "llama", "custom": [1], "hidden_size": 4, "intermediate_size": 8,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 10000})
    assert list(layer.dump()) == ["vocab_size", "model_type", "custom", "hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "rope_theta"]
    assert layer.dump()["rope_theta"] == 10000 and isinstance(layer.rope_theta, int)  # a JSON number keeps its form
    assert layer.head_dim is None and layer.head_width == 2 and not layer.has("head_dim")
    layer.head_dim = 4  # set later: written after what was given
    assert list(layer.dump())[-1] == "head_dim" and layer.value("custom") == [1]


def test_a_builder_refuses_a_value_of_the_wrong_type(info):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Eagle3Config.build(info, _eagle3_layer(info), speculative_tokens=3, draft_vocab_size=0, taps=[2, 4, 5], dtype="bfloat16")
    with pytest.raises(ValidationError):
        Eagle3Config.build(info, _eagle3_layer(info), speculative_tokens=3, draft_vocab_size=64, taps=[2, 4, 5], dtype="int8")


# --------------------------------------------------------------------------- the converters' field tables


#: the tables the converters checked research configs against before they were derived (issue 24's start)
DECODER_FIELDS_BEFORE = {
    "hidden_size": POSITIVE_INT, "intermediate_size": POSITIVE_INT, "num_attention_heads": POSITIVE_INT,
    "num_key_value_heads": POSITIVE_INT, "num_hidden_layers": POSITIVE_INT, "vocab_size": POSITIVE_INT, "head_dim": POSITIVE_INT,
    "max_position_embeddings": POSITIVE_INT, "rms_norm_eps": POSITIVE_REAL, "rope_theta": POSITIVE_REAL,
    "tie_word_embeddings": BOOL, "attention_bias": BOOL, "mlp_bias": BOOL, "model_type": STRING, "hidden_act": STRING,
    "torch_dtype": STRING, "dtype": STRING, "rope_scaling": OBJECT, "rope_parameters": OBJECT, "text_config": OBJECT,
    "architectures": STRINGS, "layer_types": STRINGS, "sliding_window": POSITIVE_INT, "use_sliding_window": BOOL,
    "max_window_layers": NON_NEGATIVE_INT,
}
EAGLE3_FIELDS_BEFORE = {**DECODER_FIELDS_BEFORE, "draft_vocab_size": POSITIVE_INT, "target_hidden_size": POSITIVE_INT, "norm_before_residual": BOOL,
                        "norm_before_fc": BOOL, "fc_norm": BOOL, "norm_output": BOOL, "use_aux_hidden_state": BOOL, "eagle_config": OBJECT,
                        "eagle_aux_hidden_state_layer_ids": INDEXES}
MEDUSA_FIELDS_BEFORE = {**DECODER_FIELDS_BEFORE, "medusa_num_heads": POSITIVE_INT, "medusa_num_layers": NON_NEGATIVE_INT,
                        "base_model_name_or_path": STRING, "num_heads": POSITIVE_INT, "truncated_vocab_size": POSITIVE_INT, "medusa_fc_bias": BOOL}


def test_the_converters_field_tables_come_from_the_typed_configs():
    from specfmt.converters import get
    from specfmt.converters.base import DECODER_FIELDS

    assert DECODER_FIELDS == DECODER_FIELDS_BEFORE
    assert get("eagle3").fields == EAGLE3_FIELDS_BEFORE
    # Medusa's num_hidden_layers is L, residual blocks per head (MedusaHeads): 0 is a valid value, as in the output
    assert get("medusa").fields == {**MEDUSA_FIELDS_BEFORE, "num_hidden_layers": NON_NEGATIVE_INT}
    assert MedusaConfig.model_fields["num_hidden_layers"].description == "residual blocks per head (L)."


def test_medusa_heads_without_residual_blocks_in_vllms_names_convert(info):
    """vLLM's Medusa names with ``num_hidden_layers: 0`` (heads that are a Linear each, no residual block:
    ``Narsil/mistral-medusa``'s structure): the shared decoder table used to refuse the 0 before the
    converter, which accepts it and writes it, could read it."""
    from test_architecture import _plan

    V, H = info.vocab_size, info.hidden_size
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": H, "vocab_size": V, "num_heads": 2, "num_hidden_layers": 0}
    plan = _plan("medusa", config, {f"lm_heads.{i}.weight": ((V, H), "F16") for i in range(2)})
    assert plan.layout == "vllm" and plan.config["num_hidden_layers"] == plan.config["transformer_layer_config"]["num_hidden_layers"] == 0
    from specfmt.algorithms import schema_violations

    assert schema_violations({**plan.config, "specfmt": {"format_version": 1, "specfmt_version": "0", "created": "2025-01-01T00:00:00Z",
                                                         "source": {"format": "medusa", "layout": "vllm", "files": {}}}}) == []


# --------------------------------------------------------------------------- the machinery


def test_types_become_schema_nodes_and_field_kinds():
    b = SchemaBuilder()
    assert b.type_node(PositiveInt) == {"type": "integer", "minimum": 1}
    assert b.type_node(PositiveNumber) == {"type": "number", "exclusiveMinimum": 0}
    assert b.type_node(Nullable[PositiveInt]) == {"type": ["integer", "null"], "minimum": 1}
    assert b.type_node(Unchecked[list[str]]) is None
    assert b.type_node(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert b.type_node(dict[str, int]) == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert [kind_of(t) for t in (PositiveInt, PositiveNumber, Nullable[PositiveInt], Unchecked[list[str]], bool, dict, str)] == [
        POSITIVE_INT, POSITIVE_REAL, POSITIVE_INT, STRINGS, BOOL, OBJECT, STRING]
    assert field_kinds(EagleLayerConfig, "model_type", "num_hidden_layers") == {"model_type": STRING, "num_hidden_layers": POSITIVE_INT}
    assert field_kinds(Eagle3Config, "eagle_aux_hidden_state_layer_ids", "target_hidden_size") == {
        "eagle_aux_hidden_state_layer_ids": INDEXES, "target_hidden_size": POSITIVE_INT}

    class Odd(ConfigModel):
        ratio: float

    with pytest.raises(TypeError, match="Odd.ratio"):
        field_kinds(Odd, "ratio")
    with pytest.raises(KeyError):
        field_kinds(Odd, "missing")


def test_each_algorithm_has_one_config_class_named_by_it():
    from specfmt.algorithms import get, names

    assert list(CONFIGS) == names()
    for name, cls in CONFIGS.items():
        assert get(name).config is cls and issubclass(cls, SpeculatorConfig) and cls.architecture
    assert issubclass(EagleConfig, EagleLayerConfig)  # EAGLE-1's top level is vLLM's native Llama config


def test_schema_branch_of_a_native_config_requires_what_vllm_reads_without_defaults():
    branch = json.loads(NEW.read_text())["$defs"]["eagle"]
    frozen = json.loads(FROZEN.read_text())["$defs"]["eagle"]
    assert sorted(branch["required"]) == sorted(frozen["required"])
    assert branch["properties"]["architectures"] == {"const": ["EagleLlamaForCausalLM"]}
