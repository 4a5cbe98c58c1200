"""Fuzzing of config parsing and schema validation (issue 8), with hypothesis.

Every generated config must give a clean answer: a list of violations, or a SpecfmtError, and
never another exception. Three families, derandomized so CI runs the same examples each time:

* specfmt configs: the converted example's config.json with random edits (values of any JSON
  type at any path, deletions, unknown keys) through the schema, the semantic rules, the
  version check and the tensor list;
* research EAGLE-3 config.json files (random edits, and random bytes) through a dry-run
  ``convert`` against the example's real weights;
* verifier configs through ``VerifierInfo.from_config``;
* every other converter's config (issue 18): EAGLE-1 (SafeAILab layout and vLLM V0's wrapper,
  whose nested ``model`` is edited too), HASS, Medusa (v0.1 and vLLM's names) and speculators
  (eagle3 and eagle), each through a dry-run ``convert`` with its own ``--from`` and ``auto``.

``COUNTS`` records how many configs each family tried; the last test asserts the total
(at least 1,000) and docs/measured.md reports it.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from conftest import WORLD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfmt.errors import ConfigSchemaError, SpecfmtError

COUNTS = {"specfmt config": 0, "research config": 0, "research config bytes": 0, "verifier config": 0, "eagle config": 0, "medusa config": 0,
          "speculators config": 0}
EXAMPLES = {"specfmt config": 600, "research config": 300, "research config bytes": 100, "verifier config": 200, "eagle config": 150,
            "medusa config": 100, "speculators config": 100}
FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


def paths(obj, prefix=()) -> list[tuple]:
    """Every key path (dict keys and list indices) in a JSON value."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,))
    return out


@st.composite
def edited(draw, base: dict) -> dict:
    """``base`` with 1-4 random edits: set a path to any JSON value, delete it, or add an unknown key."""
    cfg = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        all_paths = paths(cfg)
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "add" or not all_paths:
            cfg[draw(st.text(max_size=10))] = draw(values)
            continue
        path = draw(st.sampled_from(all_paths))
        parent = cfg
        for k in path[:-1]:
            parent = parent[k]
        if action == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(values)
    return cfg


@pytest.fixture(scope="module")
def specfmt_config(tmp_path_factory) -> dict:
    from specfmt.convert import convert

    out = tmp_path_factory.mktemp("fuzz") / "out"
    return convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier")).config


@pytest.fixture(scope="module")
def research_source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("fuzz-src") / "src"
    shutil.copytree(WORLD / "eagle3-safeailab", src)
    return src


def test_fuzzed_specfmt_configs_get_a_clean_answer(specfmt_config):
    from specfmt.algorithms import expected_tensors
    from specfmt.algorithms import schema_violations, validate_config
    from specfmt.format.versions import check_speculators_version

    @settings(FUZZ, max_examples=EXAMPLES["specfmt config"])
    @given(st.data())
    def run(data):
        cfg = data.draw(edited(specfmt_config))
        COUNTS["specfmt config"] += 1
        violations = schema_violations(cfg)
        assert isinstance(violations, list)
        try:
            validate_config(cfg, where="fuzz")
        except ConfigSchemaError as e:
            assert violations and e.violations == violations
        else:
            assert violations == []
            expected_tensors(cfg)  # a valid config always yields its tensor list
        try:
            check_speculators_version(cfg.get("speculators_version"))
        except SpecfmtError:
            pass

    run()


def test_fuzzed_research_configs_convert_or_refuse_cleanly(research_source):
    from specfmt.convert import convert

    base = json.loads((WORLD / "eagle3-safeailab" / "config.json").read_text())

    @settings(FUZZ, max_examples=EXAMPLES["research config"])
    @given(st.data())
    def run(data):
        cfg = data.draw(edited(base))
        COUNTS["research config"] += 1
        (research_source / "config.json").write_text(json.dumps(cfg))
        try:
            convert("eagle3", str(research_source), None, str(WORLD / "verifier"), dry_run=True)
        except SpecfmtError:
            pass

    run()

    @settings(FUZZ, max_examples=EXAMPLES["research config bytes"])
    @given(st.binary(max_size=200))
    def run_bytes(raw):
        COUNTS["research config bytes"] += 1
        (research_source / "config.json").write_bytes(raw)
        with pytest.raises(SpecfmtError):
            convert("eagle3", str(research_source), None, str(WORLD / "verifier"), dry_run=True)

    run_bytes()


def test_fuzzed_verifier_configs_are_read_or_refused_cleanly():
    from specfmt.errors import InputError
    from specfmt.sources.verifier import VerifierInfo

    base = json.loads((WORLD / "verifier" / "config.json").read_text())

    @settings(FUZZ, max_examples=EXAMPLES["verifier config"])
    @given(st.data())
    def run(data):
        cfg = data.draw(edited(base))
        COUNTS["verifier config"] += 1
        try:
            v = VerifierInfo.from_config(cfg, "x/y", "config.json")
        except InputError:
            return
        assert v.hidden_size > 0 and v.vocab_size > 0 and v.num_hidden_layers > 0

    run()


def _sources(root: Path, verifier: Path) -> dict[str, list[tuple[Path, str]]]:
    """One source folder per layout, by COUNTS family: ``[(folder, --from)]``."""
    import torch
    from builders import write_eagle1, write_speculators_eagle, write_speculators_eagle3
    from builders_medusa import write_v01
    from test_layouts import write_v0_wrapper, write_vllm_medusa

    return {
        "eagle config": [(write_eagle1(root / "eagle1", dtype=torch.float32), "eagle"), (write_eagle1(root / "hass", dtype=torch.float32), "hass"),
                         (write_v0_wrapper(root / "v0", fc_bias=True, prefix="model."), "eagle")],
        "medusa config": [(write_v01(root / "medusa-v01"), "medusa"), (write_vllm_medusa(root / "medusa-vllm"), "medusa")],
        "speculators config": [(write_speculators_eagle3(root / "spec-eagle3", str(verifier)), "speculators"),
                               (write_speculators_eagle(root / "spec-eagle", str(verifier)), "speculators")],
    }


@pytest.mark.parametrize("family", ["eagle config", "medusa config", "speculators config"])
def test_fuzzed_configs_of_every_converter_convert_or_refuse_cleanly(family, tmp_path):
    """Random edits of each layout's config.json (nested objects included), through ``--from`` its
    converter and ``--from auto``: a plan or a SpecfmtError, never another exception."""
    from builders import write_verifier

    from specfmt.convert import convert

    verifier = write_verifier(tmp_path / "verifier")
    sources = _sources(tmp_path, verifier)[family]
    bases = [json.loads((src / "config.json").read_text()) for src, _ in sources]

    @settings(FUZZ, max_examples=EXAMPLES[family])
    @given(st.data())
    def run(data):
        i = data.draw(st.integers(0, len(sources) - 1))
        src, frm = sources[i]
        cfg = data.draw(edited(bases[i]))
        COUNTS[family] += 1
        (src / "config.json").write_text(json.dumps(cfg))
        for source_format in (frm, "auto"):
            try:
                convert(source_format, str(src), None, str(verifier), dry_run=True)
            except SpecfmtError:
                pass

    run()


def test_at_least_1000_configs_were_tried():
    """Runs after the tests above (file order); docs/measured.md reports these counts."""
    assert all(COUNTS[k] >= EXAMPLES[k] for k in EXAMPLES), COUNTS
    assert sum(COUNTS.values()) >= 1000
