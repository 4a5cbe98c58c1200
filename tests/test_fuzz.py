"""Fuzzing with hypothesis: every command that reads a config or a folder, and the config readers under them.

* **Every command** (``tests/fuzz_targets.py``): ``inspect``, ``convert --from F`` for every F and
  ``auto``, ``validate``, ``upgrade``, ``push --dry-run`` and ``train ALGO --init``, in-process, on
  checkpoint folders of every layout with random edits (any JSON value at any path of config.json,
  deletions, unknown keys, raw bytes as config.json, files removed or truncated). Each answer is
  exit 0/1 or one ``specfmt: error:`` line with exit 2 -- never another exception --, a refusal
  leaves no output and no temporary file, and no input changes. Issue 35 added every entry point that
  reads a data file or a datagen folder, or runs a draft: ``validate --run`` on damaged drafts (a static
  failure stops it before the verifier's weights load), ``datagen`` on fuzzed ``--data`` and on damaged
  existing outputs (exit 0 leaves what a fresh run writes, no stale file kept), ``regenerate --data`` and
  ``train ALGO --hidden-states`` on damaged datagen folders; no model is loaded and no engine starts.
* **The readers**: specfmt configs through the schema, the semantic rules, the version check and
  the tensor list; verifier configs through ``VerifierInfo.from_config``.

**Nothing found once can be missed again.** The examples tried are fixed: a fixed seed (:data:`SEED`)
and exactly pinned hypothesis (pyproject.toml's ``test`` extra). Every crash ever found is an
explicit ``@example`` (:data:`FOUND`), run by every command's test. The example database in
``tests/fuzz-db/`` is replayed read-only (CI never writes it); ``SPECFMT_FUZZ_DB=write`` lets a
local run save what it finds there, ``SPECFMT_FUZZ_EXAMPLES=N`` tries N examples per command.
``benchmarks/fuzz_bench.py`` runs 10,000 examples per command and counts the outcomes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

from conftest import WORLD
from fuzz_targets import BASES, DATA, ENTRIES, Case, Fuzzer, describe, edited_config
from specfmt.errors import ConfigSchemaError, SpecfmtError

SEED = 23
DB_PATH = Path(__file__).parent / "fuzz-db"
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))


def database(test: str):
    """The saved examples of one test (``tests/fuzz-db/TEST``): read-only unless ``SPECFMT_FUZZ_DB=write``.

    One folder per test: hypothesis drops the saved examples that no longer fail the test that
    replays them, so tests sharing a folder (the commands share one inner function, hence one
    database key) would delete each other's finds."""
    db = DirectoryBasedExampleDatabase(DB_PATH / test.replace(" ", "_").replace("-", ""))
    return db if os.environ.get("SPECFMT_FUZZ_DB") == "write" else ReadOnlyDatabase(db)
#: examples per command in CI (each also runs every case of FOUND that fits it); train --init loads the verifier; the
#: entries of issue 35 (no models, but datasets written and read back) a third, the fuzz benchmark runs 10,000 each
PER_COMMAND = int(os.environ.get("SPECFMT_FUZZ_EXAMPLES", 0)) or 100
ISSUE_35 = ("validate --run", "datagen --data", "datagen OUT", "regenerate --data", "train --hidden-states")
EXAMPLES = {"specfmt config": 600, "verifier config": 200,
            **{name: PER_COMMAND // (2 if name == "train --init" else 3 if name in ISSUE_35 else 1) for name in ENTRIES}}
COUNTS = dict.fromkeys(EXAMPLES, 0)

#: every input that ever crashed a command, minimised by hand (the issue that found it)
FOUND = (
    # issue 23: speculators_config of another JSON type than an object, or its verifier (detect.py:57/67, upgrade's verifier lookup)
    Case("spec-eagle3", (("set", ("speculators_config",), [None]),)),
    Case("spec-eagle3", (("set", ("speculators_config",), "x"),)),
    Case("spec-eagle3", (("set", ("speculators_config",), True),)),
    Case("spec-eagle3", (("set", ("speculators_config",), None),)),
    Case("spec-eagle3", (("set", ("speculators_config",), 1),), 1),
    Case("spec-eagle3", (("set", ("speculators_config",), {"verifier": None}),)),
    Case("spec-eagle3-modelopt", (("set", ("speculators_config", "verifier"), [{}]),)),
    Case("specfmt-eagle3", (("set", ("speculators_config",), [None]),), 1),
    # issue 23: the provenance block's source not an object (detect.py:62)
    Case("specfmt-medusa", (("set", ("specfmt", "source"), [None]),)),
    Case("specfmt-medusa", (("set", ("specfmt", "source"), 4.5),)),
    Case("specfmt-eagle", (("set", ("specfmt", "source"), None),)),
    # issue 23: vocab_size null beside vLLM's Medusa names (converters/medusa.py:165)
    Case("specfmt-medusa", (("set", ("speculators_model_type",), {"": None}), ("set", ("vocab_size",), None))),
    Case("medusa-vllm", (("set", ("vocab_size",), None),)),
    # issue 23: push --no-validate of a folder without speculators_config (push.py: KeyError)
    Case("eagle-v0", (), 1),
    # issue 23: push --no-validate of a folder whose config breaks the schema: the model card read its fields (card.py:87)
    Case("specfmt-eagle3", (("set", ("architectures",), None), ("set", ("speculators_model_type",), None)), 1),
    # issue 23: a truncated model.safetensors in a specfmt folder given to train --init (draft.py: SafetensorError)
    Case("specfmt-eagle3", (("truncate", "model.safetensors", 0),)),
    # issue 23: NaN in a specfmt draft given to train --init (draft.py: RuntimeError "the trained draft is not what its config implies")
    Case("specfmt-eagle3", (("scribble", "model.safetensors", 500, 64),)),
    # issue 23 (fuzz benchmark): rope_parameters of another type than an object, or its rope_theta not a number,
    # in a specfmt draft given to train --init (algorithms/layers.py: float() of a dict, .get of a list)
    Case("specfmt-eagle3", (("set", ("transformer_layer_config", "rope_parameters"), [[None]]),)),
    Case("specfmt-eagle3", (("set", ("transformer_layer_config", "rope_parameters", "rope_theta"), {"x": {"y": 0}}),)),
    # issue 23 (fuzz benchmark): rms_norm_eps absent from a specfmt draft's transformer_layer_config (optional in the
    # schema; algorithms/eagle3.py read it with [...]); a sliding layer without its window
    Case("specfmt-eagle3", (("delete", ("transformer_layer_config", "rms_norm_eps")),)),
    Case("specfmt-eagle3", (("set", ("transformer_layer_config", "layer_types"), ["sliding_attention"]),
                            ("set", ("transformer_layer_config", "sliding_window"), None))),
    # issue 8: a list as max_position_embeddings, null as rms_norm_eps (research EAGLE-3 config)
    Case("eagle3", (("set", ("max_position_embeddings",), [0]),)),
    Case("eagle3", (("set", ("rms_norm_eps",), None),)),
    # issue 18: null in an EAGLE-1 decoder field; a list inside architectures
    Case("eagle", (("set", ("rope_theta",), None),)),
    Case("eagle", (("set", ("rms_norm_eps",), None),)),
    Case("eagle", (("set", ("architectures",), [[]]),)),
    # issue 35 (the new entries' fuzzing): a datagen manifest that is null or not of its types (layout.py: .get of None)
    Case("datagen", (("config-bytes", b"null"),)),
    Case("datagen", (("set", ("layers",), {}),)),
    # issue 35: a datagen folder's dataset damaged -- its data file removed or cut (FileNotFoundError, pyarrow's OSError), its
    # state.json another dataset's or not UTF-8 (KeyError '_data_files', UnicodeDecodeError) -- given to datagen or train --hidden-states
    Case("datagen", (("remove", "data-00000-of-00001.arrow"),)),
    Case("datagen", (("cut", "data-00000-of-00001.arrow", 763),)),
    Case("datagen", (("stray", "state.json", b"{}"),)),
    Case("datagen", (("swap", "hidden_states/hs_2.safetensors", "state.json"),)),
    # issue 35: token_freq.pt damaged or stale (train's torch.load UnpicklingError; datagen kept a stale one), a hidden-states
    # file cut (train: SafetensorError reading its shape)
    Case("datagen", (("scribble", "token_freq.pt", 53, 34),)),
    Case("datagen", (("stray", "token_freq.pt", b"stray"),)),
    Case("datagen", (("cut", "hidden_states/hs_0.safetensors", 47),)),
    # issue 35: stale hidden states kept by a resumed datagen: another row's file; a file beyond the dataset; a folder datagen did not make
    Case("datagen", (("swap", "hidden_states/hs_1.safetensors", "hidden_states/hs_0.safetensors"),)),
    Case("datagen", (("stray", "hidden_states/hs_99.safetensors", b"stray"),)),
    Case("eagle3", (("set", ("architectures",), None),)),
    # issue 35: regenerate's data not UTF-8 (jsonl_objects: UnicodeDecodeError), a turn's role a list (regenerate.py: unhashable)
    Case("data", (("content", ".jsonl", b"\x02\xbd\xb1\n"),)),
    Case("data", (("content", ".jsonl", b'{"messages": [{"role": "user", "content": "x"}, {"role": [], "content": "y"}]}\n'),), 1),
    # issue 35: validate --run -- speculators_config a number (run.py: .get of an int); a truncated or NaN weight file, which
    # loaded the verifier and ran the reference (a SafetensorError traceback after it, or 86 s of a meaningless run)
    Case("spec-eagle3", (("set", ("speculators_config",), 142),)),
    Case("specfmt-medusa", (("cut", "model.safetensors", 204),)),
    Case("specfmt-eagle3", (("cut", "model.safetensors", 500),)),
    Case("specfmt-eagle3", (("scribble", "model.safetensors", 500, 64),)),
    # issue 35 (fuzz benchmark, validate --run): a .bin whose first bytes are not a zip's is read as a legacy pickle, and
    # torch's weights-only unpickler met the damaged stream with an IndexError (checkpoint/reader.py; inspect, convert too)
    Case("eagle3", (("poke", "pytorch_model.bin", 0, b"r\xedW7"),)),
)


def fits(entry, case: Case) -> bool:
    """Whether ``entry`` reads ``case``'s kind of input: a data file, or a folder among those it is given."""
    if entry.data or case.base == DATA:
        return entry.data and case.base == DATA
    return case.base in entry.bases + (entry.any_bases or BASES)


def found(entry):
    """Every case of FOUND that fits ``entry``, as explicit examples."""
    def add(test):
        for case in reversed([c for c in FOUND if fits(entry, c)]):
            test = example(case=case)(test)
        return test
    return add


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory) -> Fuzzer:
    """The fuzzer, with torch on one thread while it runs: its tensors are tiny, and on a loaded machine a second thread
    makes ``train --hidden-states``' two steps 4x slower (OpenMP threads waiting for a core)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Fuzzer(tmp_path_factory.mktemp("fuzz"))
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_every_command_answers_fuzzed_inputs_cleanly(fuzzer, name):
    """A clean answer (see the module's docstring) from ``name`` on every generated input and on every input of FOUND."""
    entry = ENTRIES[name]

    @found(entry)
    @settings(FUZZ, max_examples=EXAMPLES[name], database=database(name))
    @seed(SEED)
    @given(case=fuzzer.strategy(entry))
    def run(case):
        COUNTS[name] += 1
        outcome = fuzzer.run(entry, case)
        assert outcome.clean, describe(entry, case, outcome)

    run()


def test_found_inputs_get_the_answer_meant_for_them(fuzzer):
    """The fixes behind FOUND answer at the field that crashed (not by an unrelated refusal earlier on)."""
    def answer(name: str, case: Case) -> str:
        outcome = fuzzer.run(ENTRIES[name], case)
        assert outcome.clean, describe(ENTRIES[name], case, outcome)
        return outcome.error if outcome.kind == "refused" else outcome.kind

    for value, kind in (([None], "a list"), ("x", "a string"), (True, "a boolean"), (None, "null")):
        got = answer("inspect", Case("spec-eagle3", (("set", ("speculators_config",), value),)))
        assert got.startswith(f"specfmt: error: speculators_config is {kind}, not an object"), got
    assert answer("inspect", Case("specfmt-medusa", (("set", ("specfmt", "source"), [None]),))) == "ok"
    assert "speculators_config is a list, not an object" in answer("upgrade", Case("specfmt-eagle3", (("set", ("speculators_config",), [None]),), 1))
    assert "vocab_size=None" in answer("convert --from medusa", Case("medusa-vllm", (("set", ("vocab_size",), None),)))
    assert "push uploads a draft in the speculators format; this folder is an EAGLE-1/2 research draft" in answer("push --dry-run", Case("eagle-v0", (), 1))
    assert "not a readable draft config: speculators_model_type must be a string" in answer(
        "push --dry-run", Case("specfmt-eagle3", (("set", ("architectures",), None), ("set", ("speculators_model_type",), None)), 1))
    assert "rope_parameters" in answer("train --init", Case("specfmt-eagle3", (("set", ("transformer_layer_config", "rope_parameters"), [[None]]),)))
    assert "not a valid safetensors file" in answer("train --init", Case("specfmt-eagle3", (("truncate", "model.safetensors", 0),)))
    assert "the draft is damaged: layers.0.mlp.down_proj.weight has 32 NaN/Inf values" in answer(
        "train --init", Case("specfmt-eagle3", (("scribble", "model.safetensors", 500, 64),)))
    assert "has 32 NaN/Inf value(s); the checkpoint is damaged" in answer("convert --from eagle3", Case("eagle3", (("scribble", "pytorch_model.bin", 500, 64),)))
    # issue 35
    assert "the datagen manifest is malformed (not a JSON object)" in answer("datagen OUT", Case("datagen", (("config-bytes", b"null"),)))
    assert "the datagen manifest is malformed (a wrong type: layers)" in answer("train --hidden-states", Case("datagen", (("set", ("layers",), {}),)))
    for name in ("datagen OUT", "train --hidden-states"):
        for ops in ((("remove", "data-00000-of-00001.arrow"),), (("cut", "data-00000-of-00001.arrow", 763),), (("stray", "state.json", b"{}"),)):
            assert "the preprocessed dataset does not load" in answer(name, Case("datagen", ops)), (name, ops)
    assert "token_freq.pt does not load as a torch-saved {token id: count} dict" in answer(
        "train --hidden-states", Case("datagen", (("scribble", "token_freq.pt", 53, 34),)))
    assert "sample 0: the hidden-states file does not open" in answer("train --hidden-states", Case("datagen", (("cut", "hidden_states/hs_0.safetensors", 47),)))
    # a stale token_freq.pt and another row's hidden states are made anew (ok: the output equals a fresh run's, judged by the entry)
    assert answer("datagen OUT", Case("datagen", (("stray", "token_freq.pt", b"stray"),))) == "ok"
    assert answer("datagen OUT", Case("datagen", (("swap", "hidden_states/hs_1.safetensors", "hidden_states/hs_0.safetensors"),))) == "ok"
    # a file no reader takes for data is left as it is (the entry judges that every file that opens is a row's)
    assert answer("datagen OUT", Case("datagen", (("stray", "hidden_states/hs_99.safetensors", b"stray"),))) == "ok"
    assert "the output folder is not empty and holds no datagen output (no specfmt_datagen.json)" in answer(
        "datagen OUT", Case("eagle3", (("set", ("architectures",), None),)))
    assert "is not UTF-8 text" in answer("regenerate --data", Case("data", (("content", ".jsonl", b"\x02\xbd\xb1\n"),)))
    assert "messages[1] needs a role" in answer("regenerate --data", Case(
        "data", (("content", ".jsonl", b'{"messages": [{"role": "user", "content": "x"}, {"role": [], "content": "y"}]}\n'),), 1))
    # validate --run: a static failure is a failed validation (exit 1) before the verifier's weights load (no "reached")
    for case in (Case("spec-eagle3", (("set", ("speculators_config",), 142),)), Case("specfmt-medusa", (("cut", "model.safetensors", 204),)),
                 Case("specfmt-eagle3", (("scribble", "model.safetensors", 500, 64),))):
        assert answer("validate --run", case) == "ok", case
    assert answer("validate --run", Case("specfmt-eagle3", (), 1)) == "reached"  # a sound draft gets there
    assert "cannot read the pickle: list index out of range" in answer("inspect", Case("eagle3", (("poke", "pytorch_model.bin", 0, b"r\xedW7"),)))


@pytest.fixture(scope="module")
def specfmt_config(tmp_path_factory) -> dict:
    from specfmt.convert import convert

    out = tmp_path_factory.mktemp("fuzz") / "out"
    return convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier")).config


def test_fuzzed_specfmt_configs_get_a_clean_answer(specfmt_config):
    from specfmt.algorithms import expected_tensors
    from specfmt.algorithms import schema_violations, validate_config
    from specfmt.format.versions import check_speculators_version

    @settings(FUZZ, max_examples=EXAMPLES["specfmt config"], database=database("specfmt config"))
    @seed(SEED)
    @given(st.data())
    def run(data):
        cfg = data.draw(edited_config(specfmt_config))
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


def test_fuzzed_verifier_configs_are_read_or_refused_cleanly():
    from specfmt.errors import InputError
    from specfmt.sources.verifier import VerifierInfo

    base = json.loads((WORLD / "verifier" / "config.json").read_text())

    @settings(FUZZ, max_examples=EXAMPLES["verifier config"], database=database("verifier config"))
    @seed(SEED)
    @given(st.data())
    def run(data):
        cfg = data.draw(edited_config(base))
        COUNTS["verifier config"] += 1
        try:
            v = VerifierInfo.from_config(cfg, "x/y", "config.json")
        except InputError:
            return
        assert v.hidden_size > 0 and v.vocab_size > 0 and v.num_hidden_layers > 0

    run()


def test_every_fuzz_test_tried_its_examples():
    """Runs after the tests above (file order): each tried at least its number of generated examples."""
    assert all(COUNTS[k] >= EXAMPLES[k] for k in EXAMPLES), COUNTS
