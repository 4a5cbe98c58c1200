"""The ``Algorithm`` contract split by concern: optional parts, an algorithm's own train options (its
command offers them and nothing of other algorithms, its objective receives them as one typed object),
the misreading causes declared with the readings, and a variant written as a subclass."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
import torch
from typer.testing import CliRunner

from builders import _spec_block
from conftest import WORLD
from specfmt.algorithms import causes, get, trainable
from specfmt.algorithms.base import REGISTRY, Algorithm, AlgorithmOptions, Card, Reference, Training, Variant, flag_names, option, register
from specfmt.algorithms.eagle3 import Eagle3, Eagle3Options
from specfmt.algorithms.eagle3_nn import Eagle3Draft
from specfmt.algorithms.reference import VerifierStates
from specfmt.cli import app
from specfmt.cli.train import train_command
from specfmt.errors import InputError, SpecfmtError
from specfmt.format.versions import SPECULATORS_VERSION
from specfmt.training.loop import TrainOptions, fit
from specfmt.training.pipeline import TrainRequest, check_request
from specfmt.validation.run import CAUSES

runner = CliRunner()


def _cli(*args) -> tuple[int, str]:
    r = runner.invoke(app, [str(a) for a in args], terminal_width=200)
    if isinstance(r.exception, SpecfmtError):
        return r.exception.exit_code, r.output + r.exception.one_line()
    return r.exit_code, r.output


def _flags(help_text: str) -> set[str]:
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))


def _declared(name: str) -> set[str]:
    # a boolean option on by default is offered in both forms (``--norm-output/--no-norm-output``)
    return {flag for f in get(name).training.train_options.declared() for flag in flag_names(f)}


# --------------------------------------------------------------------------- the parts


def test_an_algorithm_is_asked_for_its_parts_and_each_but_the_format_is_optional():
    for name in ("eagle3", "eagle", "medusa", "dflash"):
        algo = get(name)
        assert algo.reference is algo and algo.training is algo and algo.card is algo

    class FormatOnly(Algorithm):
        name = "format-only-test"
        title = "format only"

    bare = FormatOnly()
    assert bare.reference is None and bare.training is None and bare.card is None
    register(FormatOnly)
    try:
        assert [a.name for a in trainable()] == ["eagle3", "eagle", "medusa", "dflash"]  # no training part, no `specfmt train`
        with pytest.raises(InputError, match="unknown algorithm 'format-only-test'; train eagle3, eagle, medusa or dflash"):
            check_request(TrainRequest(out="o", verifier="v", algorithm="format-only-test"))
        with pytest.raises(InputError, match="format-only-test drafts cannot be trained"):
            fit("format-only-test", None, None, None, TrainOptions())
    finally:
        del REGISTRY["format-only-test"]


# --------------------------------------------------------------------------- train options per algorithm


def test_train_help_offers_the_algorithms_own_options_and_no_other_algorithms(monkeypatch):
    # rich cuts long option names to its column (``--speculative-tok…``) at a width that depends on the table: wide
    # enough, every name shows whole and the algorithms' shared options read alike
    monkeypatch.setattr("typer.rich_utils.MAX_WIDTH", 400)
    shared = _flags(_cli("train", "eagle3", "--help")[1]) - _declared("eagle3")
    for name in ("eagle3", "eagle", "medusa", "dflash"):
        code, text = _cli("train", name, "--help")
        assert code == 0, text
        others = set().union(*(_declared(o) for o in ("eagle3", "eagle", "medusa", "dflash") if o != name)) - _declared(name)
        assert _declared(name) <= _flags(text) and not _flags(text) & others, (name, _flags(text) & others)
        assert _flags(text) == shared | _declared(name)  # the same shared options everywhere
    assert "--ttt-steps" not in _flags(_cli("train", "medusa", "--help")[1])
    assert "--ttt-steps" in _flags(_cli("train", "eagle3", "--help")[1])
    assert {"--heads", "--head-layers", "--train-all"} == _declared("medusa")
    assert {"--noise", "--layers"} == _declared("eagle")


@pytest.mark.parametrize("name,args,owner", [
    ("medusa", ["--ttt-steps", "2"], "EAGLE-3"),
    ("eagle", ["--draft-vocab=10"], "EAGLE-3"),
    ("eagle3", ["--train-all"], "Medusa"),
    ("eagle3", ["--noise", "0.1"], "EAGLE-1/2"),
])
def test_an_option_of_another_algorithm_is_a_usage_error_naming_it(tmp_path, name, args, owner):
    code, text = _cli("train", name, "-o", tmp_path / "out", "--verifier", WORLD / "verifier", *args)
    assert code == 2 and owner in text and args[0].split("=")[0] in text, text
    assert not (tmp_path / "out").exists()
    # through the Python API the same request is refused before anything is read
    key = args[0].split("=")[0][2:].replace("-", "_")
    with pytest.raises(InputError, match=f"applies to {re.escape(owner)} drafts, not {name}"):
        check_request(TrainRequest(out=str(tmp_path / "out"), verifier="v", algorithm=name, options={key: 1}))


def test_the_algorithms_options_reach_it_as_one_typed_object(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr("specfmt.cli.train._run", lambda req, opts: seen.append((req, opts)))
    code, text = _cli("train", "eagle3", "-o", tmp_path / "o", "--verifier", "v", "--ttt-steps", "2", "--aux-layers", "1,3,5", "--steps", "7")
    assert code == 0, text
    req, opts = seen[0]
    assert opts.steps == 7 and not hasattr(opts, "ttt_steps") and not hasattr(opts, "noise")
    options = get("eagle3").training.parse_options(req.options, init=False)
    assert options == Eagle3Options(ttt_steps=2, taps=[1, 3, 5])
    # the objective unrolls the options' ttt_steps: one figure per drafting step
    algo = get("eagle3")
    cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": 50, "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
           "norm_before_residual": False, "target_hidden_size": None, "speculators_version": SPECULATORS_VERSION,
           "speculators_config": _spec_block("eagle3", "verifier", k=3),
           "transformer_layer_config": {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5}}
    module = algo.module(cfg)
    ids = torch.randint(0, 50, (1, 9))
    head = torch.nn.Linear(32, 50, bias=False)
    for steps in (1, 4):
        opts_s = Eagle3Options(ttt_steps=steps)
        loss, correct, counted = algo.loss(module, embed=torch.randn(50, 32), head=head, ids=ids, aux=torch.randn(1, 9, 96),
                                           last=torch.randn(1, 9, 32), options=opts_s, generator=None, subset=None)
        assert len(correct) == len(counted) == steps == algo.train_positions(module, opts_s)


def test_the_algorithms_options_are_checked_before_anything_is_read(tmp_path):
    with pytest.raises(InputError, match="--ttt-steps must be at least 1"):
        check_request(TrainRequest(out="o", verifier="v", algorithm="eagle3", ttt_steps=0))
    with pytest.raises(InputError, match="--draft-vocab and --aux-layers shape a new draft"):
        check_request(TrainRequest(out="o", verifier="v", algorithm="eagle3", init="d", draft_vocab=8, taps=[1, 2, 3]))
    with pytest.raises(InputError, match="--head-layers shapes a new draft"):
        check_request(TrainRequest(out="o", verifier="v", algorithm="medusa", init="d", head_layers=2))
    with pytest.raises(InputError, match="no draft decoder-layer family 'gpt2'"):
        check_request(TrainRequest(out="o", verifier="v", algorithm="eagle3", draft_layer="gpt2"))
    with pytest.raises(TypeError):
        TrainRequest(out="o", verifier="v", options=Eagle3Options(), ttt_steps=2)
    assert check_request(TrainRequest(out="o", verifier="v", algorithm="medusa", heads=5)).heads == 5
    code, text = _cli("train", "eagle3", "-o", tmp_path / "o", "--verifier", "v", "--ttt-steps", "0")
    assert code == 2 and "--ttt-steps must be at least 1" in text and not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- causes


def test_every_cause_a_reading_names_is_declared_by_its_algorithm():
    tlc = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5}
    configs = {"eagle3": {"speculators_model_type": "eagle3", "draft_vocab_size": 32, "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
                          "transformer_layer_config": tlc},
               "eagle": {"speculators_model_type": "eagle", **tlc}, "medusa": {"speculators_model_type": "medusa"}}
    for name, cfg in configs.items():
        algo = get(name)
        readings = algo.readings(cfg, 8)
        assert readings[0].cause is None and readings[0].cfg is cfg
        named = {v.cause for v in readings[1:]}
        assert named <= set(algo.causes) and all(algo.explain(c) for c in named)
        assert all(CAUSES[c] == algo.explain(c) for c in named)
    assert set(get("eagle3").causes) == {"tap ids", "norm order", "vocab mapping", "q/k norms"} == {v.cause for v in get("eagle3").readings(configs["eagle3"], 8)[1:]}
    from specfmt.validation.run import STATIC_CAUSES, WEAK_DRAFT

    assert list(CAUSES)[:len(causes()) + 1] == ["unloaded tensors", *causes()]
    assert set(CAUSES) == {"unloaded tensors", *causes(), *WEAK_DRAFT, *(c for c, _ in STATIC_CAUSES.values()), "verifier not reachable"}


def test_a_new_algorithms_cause_needs_no_entry_outside_it():
    class Probe(Eagle3):
        name = "probe-test"
        causes = {**Eagle3.causes, "mask token": "the mask token id is not the one the draft was trained with"}

    assert "mask token" not in CAUSES
    register(Probe)
    try:
        assert CAUSES["mask token"] == "the mask token id is not the one the draft was trained with" and "mask token" in list(CAUSES)
        assert CAUSES.get("tap ids") == Eagle3.causes["tap ids"]
    finally:
        del REGISTRY["probe-test"]
    assert "mask token" not in CAUSES


def test_validate_run_explains_a_misreading_by_its_algorithms_declaration(tmp_path, monkeypatch):
    """A reading whose cause only its algorithm declares (here EAGLE-3's tap misreadings renamed) is
    reported with the algorithm's explanation; there is no table elsewhere to forget."""
    from safetensors.torch import load_file, save_file

    from specfmt.convert import convert
    from specfmt.validation.run import validate_run

    src = tmp_path / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), src, str(WORLD / "verifier"))
    out = tmp_path / "broken"
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(load_file(str(src / "model.safetensors")), str(out / "model.safetensors"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:4]) + "\n")
    readings = Eagle3.readings
    monkeypatch.setattr(Eagle3, "causes", {**Eagle3.causes, "tap layers (new)": "a cause only this algorithm declares"})
    monkeypatch.setattr(Eagle3, "readings", lambda self, c, n: [Variant("tap layers (new)" if v.cause == "tap ids" else v.cause, v.label, v.cfg, v.extra)
                                                                for v in readings(self, c, n)])
    res = validate_run(out, prompts=str(prompts), max_tokens=16, use_vllm=False, write=False)
    check = next(c for c in res.report.checks if c.name == "variants")
    assert check.status == "fail" and res.causes[0] == "tap layers (new)", res.causes
    assert any(d.startswith("tap layers (new):") and d.endswith("(a cause only this algorithm declares)") for d in check.details), check.details


# --------------------------------------------------------------------------- a variant is a subclass


def test_a_variant_is_a_subclass_that_states_only_what_differs():
    """P-EAGLE is EAGLE-3 plus ``mask_hidden`` [1, 1, n_aux·H] and a mask token (speculators ``models/peagle``):
    written as subclasses of EAGLE-3's options, draft module and algorithm, everything else is inherited."""

    @dataclass
    class PEagleOptions(Eagle3Options):
        mask_token_id: int | None = option(None, "--mask-token-id", "The token id the parallel positions read.")

    class PEagleDraft(Eagle3Draft):
        def __init__(self, cfg):
            super().__init__(cfg)
            H = cfg["transformer_layer_config"]["hidden_size"]
            self.mask_hidden = torch.nn.Parameter(torch.zeros(1, 1, len(self.taps) * H))

    class PEagle(Eagle3):
        name = "peagle-test"
        title = "P-EAGLE (test)"
        train_options = PEagleOptions

        def module_class(self) -> type:
            return PEagleDraft

    algo = PEagle()
    cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": 50, "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
           "norm_before_residual": False, "target_hidden_size": None, "speculators_version": SPECULATORS_VERSION,
           "speculators_config": _spec_block("eagle3", "verifier", k=3),
           "transformer_layer_config": {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5}}
    module = algo.module(cfg)
    assert isinstance(module, PEagleDraft) and "mask_hidden" in module.state_dict()
    tensors = {n: t.clone() for n, t in module.state_dict().items()}
    states = VerifierStates([torch.randn(5, 32) for _ in range(4)], torch.randn(5, 50))
    assert len(algo.proposer(algo.readings(cfg, 4)[0], tensors, torch.randn(50, 32), None)([3, 4, 5, 6, 7, 8], states, 3)) == 3
    with pytest.raises(RuntimeError, match="mask_hidden"):  # its proposer reads its own module: EAGLE-3's tensors lack mask_hidden
        algo.proposer(algo.readings(cfg, 4)[0], {n: t for n, t in tensors.items() if n != "mask_hidden"}, torch.randn(50, 32), None)
    assert algo.parse_options({"mask_token_id": 7, "ttt_steps": 2}, init=False) == PEagleOptions(ttt_steps=2, mask_token_id=7)
    assert algo.causes == Eagle3.causes and algo.expected_tensors(cfg) == get("eagle3").expected_tensors(cfg)  # the rest is EAGLE-3's
    params = {p.name for p in train_command(algo).__signature__.parameters.values()}
    assert {"mask_token_id", "ttt_steps", "draft_vocab", "output", "steps"} <= params and "heads" not in params
    assert isinstance(algo, (Reference, Training, Card)) and issubclass(PEagleOptions, AlgorithmOptions)


def test_draft_modules_are_importable_classes_and_importing_specfmt_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, specfmt.algorithms, specfmt.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
    from specfmt.algorithms.eagle_nn import Eagle1Draft
    from specfmt.algorithms.medusa_nn import MedusaHeads

    assert get("eagle3").module_class() is Eagle3Draft and get("eagle").module_class() is Eagle1Draft
    assert get("medusa").module_class() is MedusaHeads
    assert Eagle3Draft.__module__ == "specfmt.algorithms.eagle3_nn" and issubclass(Eagle3Draft, torch.nn.Module)
