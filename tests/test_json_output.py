"""``--json`` on every command, one shape (issue 35): the test walks the typer app, so a command added later without
``--json``, or without a case here, fails it. Each case runs the command (cheaply: on success where that is quick,
on a user error where the command needs a model run) and reads stdout as one JSON object with the documented keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders import write_speculators_eagle3, write_verifier
from conftest import REPO, WORLD
from specfmt.cli import app
from specfmt.cli.common import JSON_KEYS
from specfmt.convert import convert
from test_cli_advice import commands

V = str(WORLD / "verifier")


def _cases(d: Path, draft: Path) -> dict[str, tuple[list[str], int]]:
    """command path -> (its arguments, the exit code expected); ``d`` a scratch folder, ``draft`` a converted draft."""
    upgradable = write_speculators_eagle3(d / "old", str(write_verifier(d / "verifier")), style="modelopt")
    cases = {
        "convert": (["--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(d / "conv"), "--verifier", V], 0),
        "upgrade": ([str(upgradable), "--dry-run"], 0),
        "validate": ([str(draft)], 0),
        "inspect": ([str(WORLD / "eagle3-safeailab")], 0),
        "export": ([str(draft), "--to", "sglang", "-o", str(d / "sglang")], 0),
        "serve-command": ([str(draft)], 0),
        "push": ([str(draft), "--repo-id", "me/draft", "--verifier-id", "meta/tiny", "--dry-run", "--no-validate"], 0),
        "datagen": (["-o", str(d / "dg"), "--verifier", str(d / "no-verifier"), "--data", str(WORLD / "prompts.jsonl")], 2),
        "regenerate": (["--verifier", str(d / "no-verifier"), "--data", str(WORLD / "prompts.jsonl"), "-o", str(d / "r.jsonl")], 2),
        "compare": (["ngram", "--verifier", str(d / "no-verifier"), "--no-vllm"], 2),
        "pad-vocab": ([str(d / "no-draft"), "--verifier", V, "-o", str(d / "padded")], 2),
        "train fill": ([str(draft), "-o", str(d / "fill"), "--verifier", str(d / "no-verifier")], 2),
    }
    from specfmt.algorithms import trainable

    for algo in trainable():
        cases[f"train {algo.name}"] = (["-o", str(d / "t"), "--verifier", str(d / "no-verifier"), "--data", str(WORLD / "prompts.jsonl")], 2)
    return cases


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("json") / "draft"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, V)
    return out


def test_every_command_has_json_and_a_case_here(draft, tmp_path):
    cases = _cases(tmp_path, draft)
    assert set(cases) == set(commands()), f"commands without a --json case: {set(commands()) ^ set(cases)}"
    for path, cmd in commands().items():
        assert any("--json" in p.opts for p in cmd.params), f"`specfmt {path}` has no --json"


@pytest.mark.parametrize("path", sorted(commands()))
def test_json_output_is_one_object_of_the_documented_shape(draft, tmp_path, path):
    args, code = _cases(tmp_path, draft)[path]
    r = CliRunner().invoke(app, [*path.split(" "), *args, "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == code, r.output
    data = json.loads(r.stdout)  # stdout is the object alone
    assert isinstance(data, dict) and tuple(data)[:3] == JSON_KEYS, list(data)
    assert data["command"] == path and data["ok"] is (code == 0)
    if code:
        assert set(data["error"]) == {"type", "message", "where", "hint", "exit_code"} and data["error"]["exit_code"] == code
        assert r.stderr.startswith("specfmt: error: ")  # the one error line, as without --json
    else:
        assert data["error"] is None and len(data) > 3  # the command's own fields follow


def test_the_shape_is_documented_once():
    """docs/commands/index.md holds the one description of the shape: its keys are the code's."""
    text = (REPO / "docs" / "commands" / "index.md").read_text()
    section = text[text.index("## JSON output"):]
    for key in JSON_KEYS:
        assert f"`{key}`" in section
    for key in ("type", "message", "where", "hint", "exit_code"):
        assert f"`{key}`" in section
