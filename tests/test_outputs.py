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
#: each command that writes: its arguments with {key} for each input, and which input each label names
COMMANDS = {
    "convert": (["convert", "--from", "eagle3", "{src}", "--verifier", "{ver}"], {"SRC": "src", "--verifier": "ver"}),
    "upgrade": (["upgrade", "{spec}", "--verifier", "{ver}"], {"SRC": "spec", "--verifier": "ver"}),
    "train eagle3": (["train", "eagle3", "--verifier", "{ver}", "--data", "{data}", "--prompts", "{prompts}", "--cache", "{cache}",
                      "--draft-vocab", "64", *TRAIN], {"--verifier": "ver", "--data": "data", "--prompts": "prompts", "--cache": "cache"}),
    "train medusa --init": (["train", "medusa", "--init", "{medusa}", "--verifier", "{ver}", "--dry-run", *TRAIN], {"--init": "medusa"}),
    "train fill": (["train", "fill", "{medusa}", "--verifier", "{ver}", "--data", "{data}", "--no-validate"],
                   {"SRC": "medusa", "--verifier": "ver", "--data": "data"}),
}
#: how OUT is placed against the input P (in its box B): (OUT, the input as given, the relation the error names)
RELATIONS = {
    "is": lambda ws, p: (p, p, "is"),
    "inside": lambda ws, p: (p / "sub", p, "lies inside"),
    "contains": lambda ws, p: (p.parent, p, "contains"),
    "is, through a link": lambda ws, p: (_link(ws / "links" / "out", p), p, "is"),
    "contains the target of a linked input": lambda ws, p: (p.parent, _link(ws / "links" / "in", p), "contains"),
    "contains the link of an input": lambda ws, p: (ws / "links", _link(ws / "links" / "in", p), "contains"),
}


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


CASES = [(cmd, label, rel) for cmd, (_, labels) in COMMANDS.items() for label in labels for rel in RELATIONS]


@pytest.mark.parametrize("command,label,relation", CASES, ids=[f"{c}|{l}|{r}" for c, l, r in CASES])
def test_out_never_overlaps_an_input(ws, command, label, relation):
    args, labels = COMMANDS[command]
    key = labels[label]
    out, given, words = RELATIONS[relation](ws, ws / INPUTS[key])
    paths = {k: ws / v for k, v in INPUTS.items()}
    paths[key] = given
    before = snapshot(ws)
    code, text = cli(*[a.format(**paths) for a in args], "-o", out, "--force")
    assert code == 2, text
    assert f"the output folder {words} {label} {given}" in text, text
    assert snapshot(ws) == before  # every input byte-identical; no OUT, no temporary folder


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
    train (the feature cache too), train fill."""
    o = ws / "outs"
    runs = {
        "convert": ["convert", "--from", "eagle3", ws / INPUTS["src"], "--verifier", ws / INPUTS["ver"]],
        "upgrade": ["upgrade", ws / INPUTS["spec"], "--verifier", ws / INPUTS["ver"]],
        "train": ["train", "eagle3", "--verifier", ws / INPUTS["ver"], "--data", ws / INPUTS["data"], "--cache", o / "cache", "--draft-vocab", "64", *TRAIN],
        "fill": ["train", "fill", ws / INPUTS["medusa"], "--verifier", ws / INPUTS["ver"], "--no-validate"],
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
