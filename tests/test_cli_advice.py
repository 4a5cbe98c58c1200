"""The command line's own words (issue 35, items 5 and 8): advice names only commands that exist, and every
command's ``--help`` reads whole at 80 columns. Both walk the typer app and the source, so a command or a hint
added later is held to the same rule."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from conftest import REPO, WORLD
from specfmt.cli import app
from specfmt.errors import InputError, SpecfmtError

QWEN3 = REPO / "examples" / "world-qwen3"

#: a command named in (single) backticks, as messages and help write one: `specfmt train eagle3 ...` -> "train eagle3"
#: (a docstring's ``specfmt train ALGORITHM`` is code markup with placeholders, not advice)
COMMAND = re.compile(r"(?<!`)`specfmt ((?:[a-z][a-z0-9-]*)(?: [a-z][a-z0-9-]*)?)")


@functools.lru_cache(maxsize=None)
def commands() -> dict[str, object]:
    """Every command path of the app (``convert``, ``train eagle3``, ...) -> its click command, walked from the app."""
    root = typer.main.get_command(app)
    found: dict[str, object] = {}

    def walk(group, prefix: str) -> None:
        for name, cmd in group.commands.items():
            path = f"{prefix}{name}"
            if hasattr(cmd, "commands"):
                walk(cmd, path + " ")
            else:
                found[path] = cmd

    walk(root, "")
    return found


def named_commands(text: str) -> list[str]:
    """The command each backticked ``specfmt ...`` in ``text`` names: its longest prefix that is a command or group."""
    paths = commands()
    groups = {p.split(" ")[0] for p in paths if " " in p}
    out = []
    for m in COMMAND.finditer(text):
        words = m.group(1).split(" ")
        out.append(" ".join(words[:2]) if words[0] in groups else words[0])
    return out


def assert_exist(text: str) -> None:
    paths = commands()
    groups = {p.split(" ")[0] for p in paths if " " in p}
    for named in named_commands(text):
        assert named in paths or named in groups, f"`specfmt {named}` in {text!r} is no command of the app"


# --------------------------------------------------------------------------- advice names commands that exist


def _sources() -> list[Path]:
    return sorted([*(REPO / "specfmt").rglob("*.py"), *(REPO / "converters").rglob("*.py")])


def test_every_command_a_message_names_exists():
    """Every `specfmt ...` written in a string of the package (errors, hints, notes, help) names a command the app
    has. A name built at run time (`specfmt train {x}`) cannot be read here: those are held by the tests below."""
    seen = 0
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert_exist(node.value)
                seen += len(named_commands(node.value))
            elif isinstance(node, ast.JoinedStr):  # an f-string: its literal parts, up to a placeholder
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
                assert_exist(text)
    assert seen > 20  # the scan reads the package's messages


def test_the_init_hint_names_only_commands_that_exist():
    """For every pair of registered algorithms (the --init draft's, the command's), the refusal and its hint name
    only existing commands. Before: `use specfmt train dflash` for a DFlash draft (no such command)."""
    from specfmt.algorithms import names, trainable
    from specfmt.training.pipeline import _check_init_algorithm

    asked_for = [None, *(a.name for a in trainable())]
    refused = 0
    for found in names():
        for asked in asked_for:
            try:
                _check_init_algorithm(found, asked, "--init")
            except InputError as e:
                refused += 1
                assert_exist(e.one_line())
                assert found in {a.name for a in trainable()} or f"specfmt train {found}" not in e.one_line()
    assert refused >= len(names())  # every untrainable algorithm, and every mismatch


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), terminal_width=200)
    if isinstance(r.exception, SpecfmtError):
        return r.exception.exit_code, r.output + r.exception.one_line()
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.output


@pytest.mark.parametrize("draft,source_format,title", [("dflash-speculators", "dflash", "DFlash"), ("peagle-speculators", "auto", "P-EAGLE")])
def test_training_an_untrainable_draft_is_refused_with_advice_that_works(tmp_path, draft, source_format, title):
    """Item 5: `train eagle3 --init world-qwen3/dflash-speculators --from dflash` said "use `specfmt train dflash`"
    and P-EAGLE "use `specfmt train peagle`"; neither command exists. Now the refusal says it is not trainable here,
    and names only commands that exist; `--from dflash` is refused before anything is read."""
    data = tmp_path / "data.txt"
    data.write_text("def f(x):\n    return x + 1\n")
    code, text = _cli("train", "eagle3", "-o", str(tmp_path / "out"), "--verifier", str(QWEN3 / "verifier"), "--init", str(QWEN3 / draft),
                      "--from", source_format, "--data", str(data), "--steps", "1", "--no-validate")
    assert code == 2, text
    from specfmt.algorithms import trainable

    own = {"DFlash": "dflash", "P-EAGLE": "peagle"}[title]
    if own in {a.name for a in trainable()}:  # trainable since (issue 38): the advice is its own train command
        assert f"use `specfmt train {own}`" in text and named_commands(text) == [f"train {own}"], text
    else:
        assert f"this specfmt does not train {title} drafts" in text, text
        assert named_commands(text) and all(n in ("train eagle3", "convert") for n in named_commands(text)), text
    assert_exist(text)  # every command the advice names exists
    assert not (tmp_path / "out").exists()


def test_train_offers_for_init_only_the_formats_it_trains():
    """Item 5: `train --help` offered --from dflash|dspark|dflash2|peagle for --init, which no train command takes."""
    from specfmt.algorithms import trainable
    from specfmt.converters import REGISTRY

    for algo in trainable():
        code, text = _cli("train", algo.name, "--help")
        assert code == 0
        offered = re.search(r"Format of --init \((.*?)\)\.", " ".join(text.split())).group(1)
        names = {n.split(" (")[0] for n in offered.split(", ")}
        writes = {name for name, c in REGISTRY.items() if c.algorithm in (None, algo.name)}
        assert names == writes | {"specfmt", "auto"}, (algo.name, offered)
        untrained = {name for name, c in REGISTRY.items() if c.algorithm not in (None, *(a.name for a in trainable()))}
        assert untrained and untrained.isdisjoint(names), (algo.name, untrained & names)  # dspark, dflash2, peagle: no train command


# --------------------------------------------------------------------------- --help at 80 columns


#: what help text must never show: a Sphinx role from a docstring, a type placeholder on a flag
RAW = re.compile(r":(func|mod|class|meth|attr|data|exc):`|<bool>")


@pytest.mark.parametrize("path", sorted(commands()))
def test_every_help_reads_whole_at_80_columns(path):
    """Item 8: at 80 columns rich cut option names (`--output,--out,--ou…`), showed `<bool>` on flags, and
    `serve-command --help` a raw ``:func:`` role. Every command's help, walked from the app: every name of every
    option appears whole, and no role or placeholder shows."""
    r = CliRunner().invoke(app, [*path.split(" "), "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    text = r.output
    assert "…" not in text, text
    assert not RAW.search(text), RAW.search(text).group(0)
    words = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))
    for param in commands()[path].params:
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert name in words, f"{path}: {name} is not shown whole in\n{text}"
    assert max(map(len, text.splitlines())) <= 80


def test_draft_vocab_help_says_what_chooses_the_ids():
    """Item 8: `--draft-vocab` said "the most frequent tokens of --data"; the default is now the verifier's top-1."""
    code, text = _cli("train", "eagle3", "--help")
    flat = " ".join(text.split())
    at = flat.index("--draft-vocab")
    assert "most frequent tokens of --data" not in flat and "top-1" in flat[at:at + 250], flat[at:at + 250]
