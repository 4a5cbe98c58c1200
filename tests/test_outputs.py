"""What every command that writes does with OUT: the overlap rule, the file modes, and provenance kept by upgrade.

* **One rule** (:func:`specfmt.checkpoint.output.check_output`): OUT is never an input, never
  inside one and never contains one -- for ``convert``, ``upgrade``, ``train``, ``train fill``,
  against each of their inputs (SRC, ``--verifier``, ``--init``, ``--data``, ``--prompts``,
  ``--cache``, a Hub id's folder in the cache), given directly or through symlinks, always with
  ``--force``. A refused run exits 2 with one line naming the input, and leaves the whole
  workspace as it was: every input byte-identical, no OUT, no temporary folder.
* **Modes**: what is written gets ``0666 & ~umask`` (files) and ``0777 & ~umask`` (folders).
* **Provenance**: ``upgrade`` of a folder specfmt wrote keeps the original conversion's record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from conftest import WORLD
from safetensors.torch import load_file
from typer.testing import CliRunner

from specfmt.cli import app
from specfmt.errors import SpecfmtError

runner = CliRunner()
#: a few hundred tokens of the text the example verifier was trained on
CORPUS = Path(argparse.__file__).read_text(encoding="utf-8")[:3000]


def cli(*args) -> tuple[int, str]:
    """``specfmt ARGS`` in-process: ``(exit code, stdout + stderr + the error line)``; a bug's exception is re-raised."""
    r = runner.invoke(app, [str(a) for a in args], terminal_width=400)
    if isinstance(r.exception, SpecfmtError):
        return r.exception.exit_code, r.output + r.exception.one_line()
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.output


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file by its sha256, a symlink by its target, a folder as such."""
    seen = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            key = str(p.relative_to(root))
            if p.is_symlink():
                seen[key] = "-> " + os.readlink(p)
            elif p.is_dir():
                seen[key] = "folder"
            else:
                seen[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return seen


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The example EAGLE-3 draft in the specfmt format (the input of ``upgrade``)."""
    out = tmp_path_factory.mktemp("converted") / "eagle3"
    code, text = cli("convert", "--from", "eagle3", WORLD / "eagle3-safeailab", "-o", out, "--verifier", WORLD / "verifier")
    assert code == 0, text
    return out


@pytest.fixture
def ws(tmp_path, converted) -> Path:
    """A workspace with every input in a box of its own (so that a box holds exactly one input)."""
    boxes = tmp_path / "boxes"
    shutil.copytree(WORLD / "verifier", boxes / "ver" / "V")
    shutil.copytree(WORLD / "eagle3-safeailab", boxes / "src" / "eagle3")
    shutil.copytree(converted, boxes / "spec" / "draft")
    shutil.copytree(WORLD / "medusa-legacy", boxes / "medusa" / "heads")
    (boxes / "data").mkdir()
    (boxes / "data" / "corpus.txt").write_text(CORPUS)
    (boxes / "prompts").mkdir()
    (boxes / "prompts" / "prompts.jsonl").write_text("".join((WORLD / "prompts.jsonl").read_text().splitlines(keepends=True)[:2]))
    (boxes / "cache" / "features").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    return tmp_path


#: where each input lives in the workspace
INPUTS = {"src": "boxes/src/eagle3", "ver": "boxes/ver/V", "spec": "boxes/spec/draft", "medusa": "boxes/medusa/heads",
          "data": "boxes/data/corpus.txt", "prompts": "boxes/prompts/prompts.jsonl", "cache": "boxes/cache/features"}
TRAIN = ["--steps", "1", "--batch-size", "1", "--seq-len", "16", "--no-validate", "--device", "cpu"]


# --------------------------------------------------------------------------- every command that writes, from the app


def commands(group, words: tuple[str, ...] = ()):
    """``(words, command)`` for every command of a typer/click command tree (``("train", "fill")``)."""
    if hasattr(group, "commands"):  # typer vendors click: a group is whatever has sub-commands
        for name, cmd in group.commands.items():
            yield from commands(cmd, (*words, name))
    else:
        yield words, group


def writers(typer_app) -> list[tuple[str, object, object]]:
    """``(command words, click command, declaration or None)`` for every command of ``typer_app`` with an output
    option (``-o``); the declaration is what :func:`specfmt.cli.output.writes` put on its callback."""
    import typer.main

    from specfmt.cli.output import declaration

    return [(" ".join(words), cmd, declaration(cmd.callback)) for words, cmd in commands(typer.main.get_command(typer_app))
            if any("-o" in p.opts for p in cmd.params)]


WRITERS = writers(app)


@pytest.fixture(scope="module")
def built():
    import typer.main

    return typer.main.get_command(app)


@pytest.fixture
def prebuilt(monkeypatch, built):
    """``runner.invoke(app)`` with the click command built once per module (typer builds the whole tree, ~40 ms, on every invoke)."""
    import typer.testing

    real = typer.testing._get_command
    monkeypatch.setattr(typer.testing, "_get_command", lambda a: built if a is app else real(a))


def test_every_command_with_an_output_option_goes_through_the_output_mechanism():
    """A command added with ``-o`` but without ``@writes`` fails here; its OUT would be checked against nothing."""
    names = [name for name, _, _ in WRITERS]
    assert {"convert", "upgrade", "datagen", "regenerate", "train eagle3", "train fill"} <= set(names), names
    assert [name for name, _, spec in WRITERS if spec is None] == []
    for name, cmd, spec in WRITERS:  # the declaration names the command's own -o, and every path-typed parameter is an input
        out = next(p for p in cmd.params if "-o" in p.opts)
        assert spec.out == out.name, name
        paths = {p.name for p in cmd.params if _is_path(p) and p.name != out.name}
        assert paths <= set(spec.inputs), (name, paths - set(spec.inputs))


def test_the_walk_finds_a_writer_that_does_not_declare_its_output():
    import typer

    from specfmt.cli.output import writes

    demo, sub = typer.Typer(), typer.Typer()

    @demo.command()
    @writes("output", inputs=("src",))
    def declared(src: str = typer.Argument(...), output: Path = typer.Option(..., "-o")) -> None:
        pass

    @sub.command()
    def forgot(src: str = typer.Argument(...), output: Path = typer.Option(..., "-o")) -> None:
        pass

    @demo.command()
    def reads(src: str = typer.Argument(...)) -> None:
        pass

    demo.add_typer(sub, name="group")
    found = {name: spec for name, _, spec in writers(demo)}
    assert set(found) == {"declared", "group forgot"} and found["group forgot"] is None
    assert found["declared"].inputs == {"src": "SRC"} and found["declared"].out_label == "-o"


def _types(param) -> set:
    """The types a parameter's annotation names (``Optional[list[Path]]`` -> ``{Optional, list, Path, None}``)."""
    from typing import get_args

    seen, todo = set(), [param.type_descriptor.annotation]  # typer keeps each parameter's annotation
    while todo:
        t = todo.pop()
        seen.add(t)
        todo += get_args(t)
    return seen


def _is_path(param) -> bool:
    return Path in _types(param)


def _dummy(param) -> list[str]:
    """A value click accepts for a required parameter that is neither OUT nor an input (the refusal comes first)."""
    return ["1"] if _types(param) & {int, float} else ["x"]


def _argv(cmd, spec, values: dict[str, list[Path]], out: Path) -> list[str]:
    """The command line of ``cmd``: every input given (``values``), each other required parameter a dummy, ``-o OUT``, and
    ``--force`` where the command has it (it never lifts the rule)."""
    argv: list[str] = []
    for p in cmd.params:
        if p.name == spec.out:
            given = [str(out)]
        elif p.name in values:
            given = [str(v) for v in values[p.name]]
        elif p.required:
            given = _dummy(p)
        elif p.name == spec.force:
            argv.append(p.opts[0])
            continue
        else:
            continue
        flag = [] if p.param_type_name == "argument" else [p.opts[0]]
        argv += [a for v in given for a in (*flag, v)]
    return argv


def _repeatable(name: str) -> set[str]:
    _, cmd, _ = next(w for w in WRITERS if w[0] == name)
    return {p.name for p in cmd.params if getattr(p, "multiple", False)}


def _inputs(name: str, spec) -> list[tuple[str, int]]:
    """``(parameter, k)`` for value k of every input: a repeatable option is given two values, each tried."""
    return [(param, k) for param in spec.inputs for k in range(2 if param in _repeatable(name) else 1)]


def _place(ws: Path, name: str, spec, form: str) -> dict[str, list[Path]]:
    """Every input of command ``name`` in a box of its own, as a folder holding a file, or as a file (``form``)."""
    values: dict[str, list[Path]] = {}
    for param, k in _inputs(name, spec):
        p = ws / "boxes" / f"{param}{k}" / "input"
        p.parent.mkdir(parents=True)
        if form == "folder":
            p.mkdir()
            (p / "f").write_text("x")
        else:
            p.write_text("x")
        values.setdefault(param, []).append(p)
    return values


#: how OUT is placed against the input P (in its box): (OUT, the input as given, the relation the error names)
RELATIONS = {
    "is": lambda ws, p: (p, p, "is"),
    "inside": lambda ws, p: (p / "sub", p, "lies inside"),
    "contains": lambda ws, p: (p.parent, p, "contains"),
    "is, through a link": lambda ws, p: (_link(ws / "links" / "out", p), p, "is"),
    "contains the target of a linked input": lambda ws, p: (p.parent, _link(ws / "links" / "in", p), "contains"),
    "contains the link of an input": lambda ws, p: (ws / "links", _link(ws / "links" / "in", p), "contains"),
}
#: the relations also tried with inputs that are files (all of them with folders)
FILE_RELATIONS = ("is", "inside", "contains")


def _link(link: Path, target: Path) -> Path:
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


def _refused(ws: Path, name: str, param: str, k: int, form: str, place) -> None:
    """Run command ``name`` with OUT placed by ``place(ws, P)`` against value k of input ``param`` (P), which returns
    ``(OUT, the input as given, the words of the refusal)``: exit 2, one line naming that input, and the whole workspace
    as it was: every input byte-identical, no OUT, no temporary file."""
    _, cmd, spec = next(w for w in WRITERS if w[0] == name)
    values = _place(ws, name, spec, form)
    out, given, words = place(ws, values[param][k])
    values[param][k] = given
    before = snapshot(ws)
    r = runner.invoke(app, [*name.split(), *_argv(cmd, spec, values, out)], terminal_width=400)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith(f"specfmt: error: {words} {spec.inputs[param]} {given}"), r.output  # a linked input: its target follows
    assert lines[0].endswith(f"[{out}]; choose an -o outside every input; no option (--force included) lets a command write into one"), r.output
    assert snapshot(ws) == before


CASES = [(name, param, k, rel, form) for name, _, spec in WRITERS if spec for param, k in _inputs(name, spec)
         for rel in RELATIONS for form in ("folder", "file") if form == "folder" or rel in FILE_RELATIONS]


@pytest.mark.parametrize("command,param,k,relation,form", CASES, ids=[f"{c}|{p}{k or ''}|{r}|{f}" for c, p, k, r, f in CASES])
def test_out_never_overlaps_an_input(tmp_path, prebuilt, command, param, k, relation, form):
    """Every command with ``-o``, found in the app: OUT is each input, inside it or around it (also through symlinks),
    with ``--force`` where the command has it. The refusal comes before the command's body, so the inputs need not be
    models: nothing is loaded."""
    spec = next(w[2] for w in WRITERS if w[0] == command)

    def place(ws, p):
        out, given, words = RELATIONS[relation](ws, p)
        return out, given, f"the output {spec.kind} {words}"

    _refused(tmp_path, command, param, k, form, place)


BESIDE = [(name, param, k, suffix) for name, _, spec in WRITERS if spec for suffix in spec.beside for param, k in _inputs(name, spec)]


@pytest.mark.parametrize("command,param,k,suffix", BESIDE, ids=[f"{c}|{p}{k or ''}|{s}" for c, p, k, s in BESIDE])
def test_what_is_written_beside_out_never_overlaps_an_input(tmp_path, prebuilt, command, param, k, suffix):
    """``OUT.train-state`` (train), ``OUT.provenance.json`` (regenerate): an input at that path is refused too."""

    def place(ws, p):
        renamed = p.with_name(f"in{suffix}")
        p.rename(renamed)
        return p.with_name("in"), renamed, f"in{suffix}, written beside the output, is"

    _refused(tmp_path, command, param, k, "folder", place)


def _hub_repo(cache: Path, repo_id: str, folder: Path) -> Path:
    """``folder`` as the Hugging Face cache keeps a download of ``repo_id``: blobs by sha256, a
    snapshot of symlinks into them, ``refs/main``. Returns the snapshot folder."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (root / "blobs").mkdir()
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)
    for p in folder.iterdir():
        data = p.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (root / "blobs" / digest).write_bytes(data)
        (snap / p.name).symlink_to(f"../../blobs/{digest}")
    return snap


HUB_COMMANDS = {
    ("convert", "--verifier"): ["convert", "--from", "eagle3", "{src}", "--verifier", "{ver}"],
    ("convert", "SRC"): ["convert", "--from", "eagle3", "{src}", "--verifier", "{ver}"],
    ("train fill", "SRC"): ["train", "fill", "{src}", "--verifier", "{ver}", "--no-validate"],
    ("train eagle3", "--verifier"): ["train", "eagle3", "--verifier", "{ver}", "--data", "{data}", "--draft-vocab", "64", *TRAIN],
}
#: OUT against a Hub id's files in the cache: the snapshot, inside it, the repo folder (``models--OWNER--NAME``), inside
#: that, its blobs, the whole cache
HUB_PLACES = {"snapshot": lambda snap: snap, "inside the snapshot": lambda snap: snap / "sub", "the repo folder": lambda snap: snap.parents[1],
              "inside the repo folder": lambda snap: snap.parents[1] / "refs" / "sub", "the blobs": lambda snap: snap.parents[1] / "blobs",
              "the whole cache": lambda snap: snap.parents[2]}
HUB_CASES = [(c, l, p) for (c, l) in HUB_COMMANDS for p in HUB_PLACES]


@pytest.mark.parametrize("command,label,place", HUB_CASES, ids=[f"{c}|{l}|{p}" for c, l, p in HUB_CASES])
def test_out_never_overlaps_a_hub_input_in_the_cache(ws, monkeypatch, command, label, place):
    from huggingface_hub import constants

    cache = ws / "hf" / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    ids = {"ver": "me/verifier", "src": "me/eagle3"}
    snaps = {"ver": _hub_repo(cache, ids["ver"], WORLD / "verifier"), "src": _hub_repo(cache, ids["src"], WORLD / "eagle3-safeailab")}
    key = "ver" if label == "--verifier" else "src"
    paths = {"ver": ids["ver"], "src": ids["src"], "data": ws / INPUTS["data"]}
    if command == "train fill":
        snaps["src"] = _hub_repo(cache, "me/medusa", WORLD / "medusa-legacy")
        paths["src"] = "me/medusa"
    out = HUB_PLACES[place](snaps[key])
    before = snapshot(ws)
    code, text = cli(*[a.format(**paths) for a in HUB_COMMANDS[(command, label)]], "-o", out, "--force")
    assert code == 2, text
    # the whole cache holds every Hub input of the command (SRC and --verifier; train eagle3 has no SRC): the line names one
    # of them, the one the command checks first; elsewhere OUT meets the case's input, and that one is named
    held = [f"{lab} {paths[k]}" for lab, k in (("SRC", "src"), ("--verifier", "ver")) if "{" + k + "}" in HUB_COMMANDS[(command, label)]]
    named = [f"{label} {paths[key]}"] if place != "the whole cache" else held
    others = [f"{lab} {paths[k]}" for lab, k in (("SRC", "src"), ("--verifier", "ver"))] + ["SRC me/eagle3"]
    assert "the output folder" in text and any(n in text for n in named), text
    assert not any(n in text for n in others if n not in named), text  # nothing OUT does not hold, nothing of another command
    assert snapshot(ws) == before


def test_an_input_linked_out_of_its_folder_is_protected_too(ws):
    """A verifier whose weights are a symlink to a file elsewhere: OUT may not be, or contain, that file's folder."""
    ver = ws / "boxes" / "ver" / "V"
    store = ws / "store"
    store.mkdir()
    (ver / "model.safetensors").rename(store / "weights.safetensors")
    (ver / "model.safetensors").symlink_to(store / "weights.safetensors")
    before = snapshot(ws)
    code, text = cli("convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ver, "-o", store, "--force")
    assert code == 2 and f"the output folder contains {store / 'weights.safetensors'}, the target of the link model.safetensors in --verifier {ver}" in text, text
    assert snapshot(ws) == before


def test_a_neighbour_of_an_input_is_not_an_overlap(ws):
    """Paths are compared by their parts, not as strings: V2 beside V, and V's parent's sibling, may be written."""
    for out in (ws / "boxes" / "ver" / "V2", ws / "boxes" / "ver-out"):
        code, text = cli("convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ws / INPUTS["ver"], "-o", out)
        assert code == 0, text
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in (ws / "boxes" / "ver").iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_out_under_a_file_is_one_line(ws):
    code, text = cli("convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ws / INPUTS["ver"], "-o", ws / "boxes" / "ver" / "V" / "config.json" / "x")
    assert code == 2 and "--verifier" in text and "Traceback" not in text, text
    (ws / "plain").write_text("x")
    code, text = cli("convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ws / INPUTS["ver"], "-o", ws / "plain" / "x")
    assert code == 2 and "the output path lies under a file" in text, text


# --------------------------------------------------------------------------- file modes


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder.parent)): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _want(folder: Path, mask: int) -> dict[str, int]:
    return {str(p.relative_to(folder.parent)): (0o777 if p.is_dir() else 0o666) & ~mask for p in [folder, *folder.rglob("*")]}


def test_every_output_follows_the_umask(ws, umask):
    """Files 0666 & ~umask, folders 0777 & ~umask, as open() and mkdir() make them: convert, upgrade,
    train (the feature cache too), train fill, datagen (the transformers engine; the vLLM engine's files:
    tests/test_datagen_vllm.py). regenerate: tests/test_regenerate.py."""
    o = ws / "outs"
    runs = {
        "convert": ["convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ws / INPUTS["ver"]],
        "upgrade": ["upgrade", ws / INPUTS["spec"], "--verifier", ws / INPUTS["ver"]],
        "train": ["train", "eagle3", "--verifier", ws / INPUTS["ver"], "--data", ws / INPUTS["data"], "--cache", o / "cache", "--draft-vocab", "64", *TRAIN],
        "fill": ["train", "fill", ws / INPUTS["medusa"], "--verifier", ws / INPUTS["ver"], "--no-validate"],
        "datagen": ["datagen", "--verifier", ws / INPUTS["ver"], "--data", ws / INPUTS["data"], "--engine", "transformers", "--seq-len", "16"],
    }
    for name, args in runs.items():
        code, text = cli(*args, "-o", o / name)
        assert code == 0, text
        assert _modes(o / name) == _want(o / name, umask), name
    assert (o / "cache" / "shard-00000.safetensors").is_file()
    assert _modes(o / "cache") == _want(o / "cache", umask)


# --------------------------------------------------------------------------- provenance through upgrade


@pytest.mark.parametrize("algo,name", [("eagle3", "eagle3-safeailab"), ("eagle", "eagle-safeailab")])  # upgrade reads these two
def test_upgrade_keeps_the_original_provenance(tmp_path, algo, name):
    """An upgrade that changes nothing writes the original config again, provenance included; one that
    changes something keeps the original record and adds an ``upgrades`` entry for itself."""
    from specfmt.checkpoint.files import sha256_file
    from specfmt.algorithms import validate_config

    first = tmp_path / "first"
    code, text = cli("convert", "--from", algo, WORLD / name, "-o", first, "--verifier", WORLD / "verifier")
    assert code == 0, text
    original = json.loads((first / "config.json").read_text())

    code, text = cli("upgrade", first, "-o", tmp_path / "same")
    assert code == 0 and "0 change(s) (already current)" in text, text
    assert json.loads((tmp_path / "same" / "config.json").read_text()) == original
    a, b = load_file(str(first / "model.safetensors")), load_file(str(tmp_path / "same" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)

    other = tmp_path / "verifier-copy"
    shutil.copytree(WORLD / "verifier", other)
    code, text = cli("upgrade", tmp_path / "same", "-o", tmp_path / "moved", "--verifier", other)
    assert code == 0 and "1 change(s)" in text, text
    cfg = json.loads((tmp_path / "moved" / "config.json").read_text())
    validate_config(cfg, where="upgraded")
    prov = cfg["specfmt"]
    assert {k: v for k, v in prov.items() if k != "upgrades"} == original["specfmt"]  # the first conversion, as recorded
    (step,) = prov["upgrades"]
    assert step["source"]["name_or_path"] == str(tmp_path / "same") and step["source"]["format"] == "speculators"
    assert step["source"]["files"] == {f: sha256_file(tmp_path / "same" / f) for f in ("config.json", "model.safetensors")}
    assert step["changes"] == [f'~ $.speculators_config.verifier.name_or_path: "{WORLD / "verifier"}" -> "{other}"']
    assert sorted(step["tensors"]["kept"]) == sorted(list_tensors(first)) and not step["tensors"]["renamed"]

    code, text = cli("upgrade", tmp_path / "moved", "-o", tmp_path / "again", "--verifier", WORLD / "verifier")
    assert code == 0, text
    again = json.loads((tmp_path / "again" / "config.json").read_text())["specfmt"]
    assert again["upgrades"][0] == step and again["upgrades"][1]["source"]["name_or_path"] == str(tmp_path / "moved")
    assert again["source"] == original["specfmt"]["source"]


def list_tensors(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        return list(f.keys())


def test_upgrade_refuses_a_broken_provenance_block(tmp_path, converted):
    src = tmp_path / "src"
    shutil.copytree(converted, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["specfmt"]["source"] = "somewhere"
    (src / "config.json").write_text(json.dumps(cfg))
    code, text = cli("upgrade", src, "-o", tmp_path / "out")
    assert code == 2 and "specfmt provenance block is not valid ($.specfmt.source" in text, text
    assert not (tmp_path / "out").exists()


def test_a_draft_saved_again_keeps_its_upgrades(tmp_path, converted):
    """``train`` from an upgraded folder keeps the upgrades between the source and the training."""
    from specfmt.draft import read_draft, save_draft

    shutil.copytree(WORLD / "verifier", tmp_path / "v2")
    code, text = cli("upgrade", converted, "-o", tmp_path / "up3", "--verifier", tmp_path / "v2")
    assert code == 0, text
    draft = read_draft(tmp_path / "up3")
    save_draft(tmp_path / "saved", draft, train={"algorithm": "eagle3"})
    prov = json.loads((tmp_path / "saved" / "config.json").read_text())["specfmt"]
    assert prov["upgrades"] == draft.config["specfmt"]["upgrades"] and len(prov["upgrades"]) == 1
    assert prov["source"] == json.loads((converted / "config.json").read_text())["specfmt"]["source"]
