"""Errors as data: the Hub failures' classes and fields, a conversion error's tensors and config path,
and ``validate --run``'s likely causes taken from the checks' findings, never from their words.

The Hub cases run against the local stand-in for the Hub (``fakehub.FakeHub``), through the real
``huggingface_hub`` client, in one child process (huggingface_hub reads ``HF_ENDPOINT`` and
``HF_HUB_OFFLINE`` once, at import, and this session runs offline).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from builders import write_safeailab
from conftest import WORLD
from test_validate_run import broken
from fakehub import FakeHub
from specfmt.algorithms import get as get_algorithm
from specfmt import errors
from specfmt.convert import convert
from specfmt.errors import ConversionError, Finding, HubError, path_keys
from specfmt.validation.static import validate_static

TOKEN = "hf_errorsTestToken"


# --------------------------------------------------------------------------- Hub failures


#: run in a child process against the fake Hub: each case's error as ``{case: {class, classes, fields, line}}``
CHILD = r'''
import json, sys
from pathlib import Path

from huggingface_hub.utils._http import close_session

from specfmt.errors import HubError
from specfmt.hub.push import PushPlan, UploadFile
from specfmt.hub import transport
from specfmt.sources.failures import download_failure
from specfmt.sources.resolve import resolve

transport.RETRY_WAITS = (0.0, 0.0)


def plan(repo_id, *, revision=None, create_pr=False):
    data = b'{"note": "errors test"}\n'
    return PushPlan(folder=Path("."), repo_id=repo_id, revision=revision, create_pr=create_pr, private=False, verifier="meta/v",
                    files=[UploadFile("notes.json", len(data), content=data)], card="", card_origin="generated", commit_message="test")


def entry():
    from huggingface_hub import hf_hub_download
    try:
        hf_hub_download("me/public", "absent.json")
    except Exception as e:
        raise download_failure("me/public", None, e) from None


cases = {
    "repo not found": lambda: resolve("me/absent"),
    "gated": lambda: resolve("meta/gated"),
    "revision not found": lambda: resolve("me/public", revision="v9"),
    "entry not found": entry,
    "push 401": lambda: transport.push(plan("me/a401")),
    "push 403": lambda: transport.push(plan("meta/theirs")),
    "push pr on a missing repo": lambda: transport.push(plan("me/absent-pr", create_pr=True)),
    "push missing pr ref": lambda: transport.push(plan("me/public", revision="refs/pr/9")),
    "push 503": lambda: transport.push(plan("me/flaky")),
    "push dropped": lambda: transport.push(plan("me/dropped")),
    "push 404 on the commit": lambda: transport.push(plan("me/vanishing")),
}
only = sys.argv[1:]
out = {}
for name, fn in cases.items():
    if only and name not in only:
        continue
    close_session()  # each case on fresh connections, as each command runs
    try:
        fn()
        out[name] = None
    except HubError as e:
        out[name] = {"class": type(e).__name__, "classes": [c.__name__ for c in type(e).__mro__],
                     "fields": {k: getattr(e, k, None) for k in ("repo_id", "revision", "repo_type", "status", "attempts", "outcome")},
                     "line": e.one_line()}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def hub_errors() -> dict:
    with FakeHub(tokens={TOKEN: "me", "hf_otherToken": "meta"}) as hub:
        hub.seed("me/public", {"config.json": b"{}"})
        hub.seed("meta/gated", {"config.json": b"{}"}, gated=True)
        hub.seed("meta/theirs", {"config.json": b"{}"})
        hub.create("me/flaky")
        hub.fail("POST", "/api/models/me/flaky/commit/", 503, times=3)
        hub.create("me/dropped")
        hub.fail("POST", "/api/models/me/dropped/commit/", None, times=3)
        hub.create("me/vanishing")
        hub.fail("POST", "/api/models/me/vanishing/commit/", 404)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1", HF_TOKEN=TOKEN, HF_HUB_DISABLE_PROGRESS_BARS="1",
                   HF_HOME=os.environ["HF_HOME"] + "-errors")
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        found = json.loads(r.stdout.strip().splitlines()[-1])
        # a rejected token (401): another run, with a token the Hub does not know
        r = subprocess.run([sys.executable, "-c", CHILD, "push 401"], env={**env, "HF_TOKEN": "hf_wrongToken"}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        found.update(json.loads(r.stdout.strip().splitlines()[-1]))
    assert all(TOKEN not in json.dumps(v) and "hf_wrongToken" not in json.dumps(v) for v in found.values())
    return found


@pytest.mark.parametrize("case,cls,parents,fields,words", [
    ("repo not found", "HubRepoNotFoundError", [], {"repo_id": "me/absent", "revision": None, "repo_type": "model", "status": 404},
     "no Hub repo has that id"),
    ("gated", "HubGatedRepoError", ["HubRepoNotFoundError"], {"repo_id": "meta/gated", "revision": None, "repo_type": "model", "status": 403},
     "'meta/gated' is gated on the Hub"),
    ("revision not found", "HubRevisionNotFoundError", [], {"repo_id": "me/public", "revision": "v9", "repo_type": "model", "status": 404},
     "revision 'v9' not found in 'me/public'"),
    ("entry not found", "HubEntryNotFoundError", [], {"repo_id": "me/public", "revision": None, "repo_type": "model", "status": 404},
     "could not fetch 'me/public' from the Hub"),
    ("push 401", "HubAuthError", [], {"repo_id": "me/a401", "status": 401}, "rejected the token (401 Unauthorized)"),
    ("push 403", "HubPermissionError", [], {"repo_id": "meta/theirs", "status": 403}, "may not write to meta/theirs (403 Forbidden"),
    ("push pr on a missing repo", "HubRepoNotFoundError", [], {"repo_id": "me/absent-pr", "status": None},
     "me/absent-pr does not exist, so no pull request can be opened"),
    ("push missing pr ref", "HubRevisionNotFoundError", [], {"repo_id": "me/public", "revision": "refs/pr/9"}, "refs/pr/9 does not exist in me/public"),
    ("push 503", "HubUnavailableError", [], {"repo_id": "me/flaky", "status": 503, "attempts": 3}, "the Hub failed with 503"),
    ("push dropped", "HubUnavailableError", [], {"repo_id": "me/dropped", "status": None, "attempts": 3},
     "connection to the Hub dropped while uploading the commit after 3 attempts"),
    ("push 404 on the commit", "HubRepoNotFoundError", [], {"repo_id": "me/vanishing", "status": 404},
     "me/vanishing does not exist, or the token cannot see it (404)"),
])
def test_each_hub_failure_is_its_own_class_with_its_fields(hub_errors, case, cls, parents, fields, words):
    got = hub_errors[case]
    assert got is not None, f"{case}: no error"
    assert got["class"] == cls and all(p in got["classes"] for p in parents + ["HubError", "SpecfmtError"]), got
    assert {k: got["fields"][k] for k in fields} == fields, got
    assert words in got["line"], got["line"]


def test_a_failed_commit_says_what_it_left(hub_errors):
    """``outcome``: what a 5xx or a dropped connection left on the Hub, as data and in the line."""
    for case in ("push 503", "push dropped"):
        got = hub_errors[case]
        assert got["fields"]["outcome"].startswith("no commit was made (main is still at") and got["fields"]["outcome"] in got["line"]


def test_offline_download_and_push(tmp_path, monkeypatch):
    """This session runs with HF_HUB_OFFLINE and an empty cache: a Hub id is not there, and a push cannot start."""
    from specfmt.hub import transport
    from specfmt.hub.push import PushPlan
    from specfmt.sources.resolve import resolve

    with pytest.raises(errors.HubOfflineError) as e:
        resolve("me/never-cached", revision="v1")
    assert (e.value.repo_id, e.value.revision, e.value.status) == ("me/never-cached", "v1", None)
    assert "not in the local Hugging Face cache" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)

    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_anyToken")
    plan = PushPlan(folder=tmp_path, repo_id="me/offline", revision="dev", create_pr=False, private=False, verifier="meta/v",
                    files=[], card="", card_origin="generated", commit_message="test")
    with pytest.raises(errors.HubOfflineError) as e:
        transport.push(plan)
    assert (e.value.repo_id, e.value.revision) == ("me/offline", "dev") and "HF_HUB_OFFLINE is set; a push needs the network" in str(e.value)

    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(errors.HubAuthError) as e:
        transport.push(plan)
    assert e.value.repo_id == "me/offline" and e.value.status is None and "no Hugging Face token" in str(e.value)


def test_hub_error_keeps_the_one_line():
    e = errors.HubGatedRepoError("'a/b' is gated on the Hub", hint="accept its terms", repo_id="a/b", status=403)
    assert isinstance(e, errors.HubRepoNotFoundError) and isinstance(e, HubError)
    assert str(e) == "'a/b' is gated on the Hub; accept its terms" and (e.repo_id, e.revision, e.repo_type, e.status) == ("a/b", None, "model", 403)


# --------------------------------------------------------------------------- conversion errors


def test_a_conversion_error_lists_its_tensors(tmp_path, verifier):
    """Missing, mis-shaped and unknown tensors, each under its kind (output names; unknown: source names);
    the message is the one line it always was."""
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    del sd["midlayer.hidden_norm.weight"]
    sd["midlayer.mlp.up_proj.weight"] = torch.zeros(95, 64, dtype=torch.float16)
    sd["extra.weight"] = torch.zeros(2, dtype=torch.float16)
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError) as e:
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert e.value.tensors == {"unknown": ["extra.weight"], "missing": ["layers.0.hidden_norm.weight"], "misshaped": ["layers.0.mlp.up_proj.weight"]}
    assert e.value.config_path is None
    assert str(e.value) == ("the source does not hold the tensors its config implies -- not part of the eagle3 layout: extra.weight; "
                            "missing: layers.0.hidden_norm.weight; wrong shape: layers.0.mlp.up_proj.weight: [95, 64], expected [96, 64]; nothing was written")
    assert not (tmp_path / "out").exists()


def test_a_conversion_error_names_its_config_field(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src", vocab=512)
    with pytest.raises(ConversionError) as e:
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert e.value.config_path == "$.vocab_size" and e.value.tensors == {} and e.value.where == "config.json"
    assert "draft vocab_size 512 differs from the verifier's 256" in str(e.value)


def test_two_source_tensors_on_one_name_are_listed():
    from specfmt.checkpoint.reader import TensorInfo
    from specfmt.converters import get

    conv = get("eagle3")
    infos = {n: TensorInfo(n, (4,), "F16", "x.bin") for n in ("midlayer.input_layernorm.weight", "layers.0.input_layernorm.weight")}
    with pytest.raises(ConversionError) as e:
        conv.map_tensors(infos)
    assert e.value.tensors == {"conflicting": ["layers.0.input_layernorm.weight", "midlayer.input_layernorm.weight"]}


def test_conversion_error_tensor_kinds_are_a_closed_list():
    with pytest.raises(ValueError, match="unknown tensor kinds"):
        ConversionError("x", tensors={"lost": ["a"]})
    assert ConversionError("x", tensors={"missing": [], "unexpected": ["b"]}).tensors == {"unexpected": ["b"]}


# --------------------------------------------------------------------------- findings, and the causes taken from them


def test_path_keys():
    assert path_keys("$.speculators_config.proposal_methods[0].speculative_tokens") == ("speculators_config", "proposal_methods", "speculative_tokens")
    assert path_keys("$") == () and path_keys(None) == ()
    with pytest.raises(ValueError):
        path_keys("speculators_config.x")


def test_schema_findings_name_the_keys_their_rule_names(example):
    from specfmt.algorithms import schema_findings, schema_violations

    cfg = json.loads((WORLD / "eagle3-safeailab" / "config.json").read_text())  # a research config: not the format at all
    assert [(f.path, f.message) for f in schema_findings(cfg)] == schema_violations(cfg)
    good = json.loads((example / "config.json").read_text())
    del good["norm_before_residual"]
    good["eagle_aux_hidden_state_layer_ids"] = [1, "x", 5]
    found = schema_findings(good)
    assert [(f.path, f.kind) for f in found] == [("$", "required"), ("$.eagle_aux_hidden_state_layer_ids[1]", "type")]
    assert found[0].keys == ("norm_before_residual",) and found[1].keys == ("eagle_aux_hidden_state_layer_ids",)


def test_a_finding_keeps_a_configs_own_keys_that_no_path_can_spell(example):
    """A key that is empty or holds ``.`` or ``[`` prints as a path :func:`path_keys` cannot read back: the
    finding takes its keys from the error's own path (found by test_fuzz)."""
    from specfmt.algorithms import schema_findings, schema_violations

    cfg = json.loads((example / "config.json").read_text())
    cfg["specfmt"]["tensors"]["dropped"] = {"": 1, "a.b[0]": 2}
    found = [f for f in schema_findings(cfg) if f.path.startswith("$.specfmt.tensors.dropped")]
    assert [(f.path, f.message) for f in schema_findings(cfg)] == schema_violations(cfg)
    assert sorted(f.keys for f in found) == [("specfmt", "tensors", "dropped", ""), ("specfmt", "tensors", "dropped", "a.b[0]")]


def test_an_inconsistent_vocabulary_map_lists_the_map_tensors(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["t2d"][int((~sd["t2d"]).nonzero()[0])] = True  # one target id more than the draft has
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError) as e:
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert "the draft vocabulary map is inconsistent" in str(e.value) and e.value.tensors == {"inconsistent": ["d2t", "t2d"]}


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("errors") / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


def _reworded_required(monkeypatch):
    """jsonschema's ``required`` rule, its message reworded so that it names no key."""
    from jsonschema import Draft202012Validator, ValidationError

    def required(validator, required, instance, schema):
        if validator.is_type(instance, "object") and any(k not in instance for k in required):
            yield ValidationError("a property this object must have is absent")

    monkeypatch.setitem(Draft202012Validator.VALIDATORS, "required", required)


@pytest.mark.parametrize("key,cause", [("norm_before_residual", "norm order"), ("eagle_aux_hidden_state_layer_ids", "tap ids")])
def test_a_reworded_schema_message_keeps_its_cause(example, tmp_path, monkeypatch, key, cause):
    """The likely cause of an absent key comes from the finding's keys: a message that no longer names the
    key (a jsonschema release that words it otherwise) finds the same cause."""
    from specfmt.validation.run import validate_run

    _reworded_required(monkeypatch)
    res = validate_run(broken(example, tmp_path, cfg=lambda c: c.pop(key)), use_vllm=False, write=False)
    schema = next(c for c in res.report.checks if c.name == "schema")
    assert schema.status == "fail" and schema.details == ["$: a property this object must have is absent"]
    assert [f.keys for f in schema.findings] == [(key,)]
    assert res.causes == [cause]


def test_a_reworded_tensor_detail_keeps_its_cause(example, tmp_path, monkeypatch):
    from specfmt.validation import run, static

    monkeypatch.setattr(static, "_TENSOR_LABELS", {"missing": "absent", "unexpected": "extra", "misshaped": "shape"})
    rep = validate_static(broken(example, tmp_path, tensors=lambda t: t.pop("norm.weight")))
    tensors = next(c for c in rep.checks if c.name == "tensors")
    assert tensors.status == "fail" and tensors.details == ["absent: norm.weight"]
    assert [(f.kind, f.tensor) for f in tensors.findings] == [("missing", "norm.weight")]
    assert run._static_causes(rep, get_algorithm("eagle3")) == ["unloaded tensors"]


def test_a_reworded_verifier_problem_keeps_its_cause(example, tmp_path, monkeypatch):
    """Tap ids beyond the verifier's layers: the ``verifier`` check's finding is at the tap ids' path; its words
    do not matter (today's say "tap layers ..."; reworded, the cause is the same)."""
    from specfmt.algorithms.eagle3 import Eagle3
    from specfmt.validation import run

    folder = broken(example, tmp_path, cfg=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 4, 40]))
    rep = validate_static(folder)
    check = next(c for c in rep.checks if c.name == "verifier")
    assert check.status == "fail" and "tap layers [40]" in check.summary
    assert run._static_causes(rep, get_algorithm("eagle3")) == ["tap ids"]

    original = Eagle3.verifier_problems
    monkeypatch.setattr(Eagle3, "verifier_problems", lambda self, cfg, v: [dataclasses.replace(f, message="out of range") for f in original(self, cfg, v)])
    rep = validate_static(folder)
    check = next(c for c in rep.checks if c.name == "verifier")
    assert check.status == "fail" and check.summary == "out of range"
    assert run._static_causes(rep, get_algorithm("eagle3")) == ["tap ids"]


def test_findings_stay_out_of_the_json(example):
    """``validation.json`` and ``validate --json`` keep today's fields: the findings are for code, the details for people."""
    rep = validate_static(example)
    assert all(set(c) == {"name", "status", "summary", "details"} for c in rep.to_json()["checks"])
    assert Finding("m", path="$.a", keys=("a",)).message == str(Finding("m"))


def test_the_causes_a_finding_points_at_are_the_algorithms(example, tmp_path):
    """Which config key or check names which cause is declared by the algorithm (EAGLE-3's ``key_causes`` and
    ``check_causes``), not by validate --run: an algorithm that declares none gets none from the same findings."""
    from specfmt.algorithms.eagle3 import Eagle3
    from specfmt.validation import run

    rep = validate_static(broken(example, tmp_path, cfg=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 4, 40])))
    assert run._static_causes(rep, Eagle3()) == ["tap ids"]

    class Undeclared(Eagle3):
        key_causes, check_causes = {}, {}

    assert run._static_causes(rep, Undeclared()) == []
