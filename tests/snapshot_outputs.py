"""Snapshot every folder the tests write, to prove a refactor leaves outputs byte-identical.

Usage (from the repository root)::

    python3 tests/snapshot_outputs.py record before.json          # default: the conversion tests
    python3 tests/snapshot_outputs.py record after.json -- tests/test_layouts.py -k safeailab
    python3 tests/snapshot_outputs.py compare before.json after.json
    python3 tests/snapshot_outputs.py scan before.json /tmp/specfmt-snapshot-XXXX [TREE]  # an earlier record's basetemp
    python3 tests/snapshot_outputs.py corpus tests/data/configs-v1-corpus.json before.json /tmp/specfmt-snapshot-XXXX

``record`` runs pytest with a fresh ``--basetemp``, then walks it for every folder whose
``config.json`` carries specfmt's provenance block (converted drafts, trained drafts, upgrades,
the planned outputs of the real-config corpus) and records, per folder (its path under the
basetemp, which pytest derives from the test's name):

* ``config.json`` parsed, with what legitimately differs between two runs taken out: the
  provenance timestamp (``specfmt.created``), the specfmt version, and the basetemp prefix
  of absolute paths;
* the sha256 of ``config.json``'s text with the same values blanked (``config_sha256``): the parsed
  config compares equal whatever its key order, the text does not;
* the sha256 of every other file (``model.safetensors``, ``validation.json`` with its wall-time
  fields taken out, ...).

``compare`` prints every folder and file that differs, and exits 1 when anything does. It is a
tool for the person refactoring, not a test: the two snapshots come from two trees.

``corpus`` writes the distinct configs of snapshots as a test corpus (``tests/test_config_types.py``
validates them): the blanked provenance times and versions get fixed placeholders, the basetemp
prefix becomes ``/basetemp`` (``<repo>``: ``/repo``), so every config is whole again. Beside them it keeps the speculators
configs without provenance (``inputs``): the repository's (``examples/``, ``tests/data/real_configs``)
and those the tests wrote as inputs under the basetemps given. Each config goes with the answer of
the specfmt imported (``specfmt.algorithms.schema_violations``: the v1 schema, then the rules):
``configs`` and ``inputs`` validate, ``refused`` holds the rest with their violations (``on_main``).
Record main's answer: run it with main's tree first on ``PYTHONPATH``::

    git archive MAIN | tar -x -C /tmp/main && PYTHONPATH=/tmp/main python3 tests/snapshot_outputs.py corpus ...
"""

from __future__ import annotations

import hashlib
import os
import shutil
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the tests that write conversions: each layout and option, the real-config corpus, upgrades,
#: trained drafts and the shipped worlds
DEFAULT_TESTS = [
    "tests/test_convert_eagle3.py", "tests/test_convert_eagle.py", "tests/test_convert_medusa.py", "tests/test_layouts.py",
    "tests/test_real_configs.py", "tests/test_upgrade.py", "tests/test_fast_copy.py", "tests/test_hostile.py",
    "tests/test_train.py", "tests/test_example_world.py", "tests/test_world_qwen3.py", "tests/test_qwen3_layer.py",
]

#: keys whose values are wall-clock measurements or run-specific (dropped before comparing)
VOLATILE = {"created", "specfmt_version", "seconds", "wall_seconds", "tokens_per_second", "elapsed", "timestamp", "date"}


def _scrub(obj, base: str, repo: str = str(REPO)):
    """``obj`` without volatile keys, with the basetemp and the tree's own path (in keys and values) as
    ``<basetemp>``/``<repo>``: two trees recorded in two folders compare equal."""
    if isinstance(obj, dict):
        return {_scrub(k, base, repo): _scrub(v, base, repo) for k, v in obj.items()
                if k not in VOLATILE and not k.endswith("_seconds") and not k.endswith("_s")}
    if isinstance(obj, list):
        return [_scrub(v, base, repo) for v in obj]
    if isinstance(obj, str):
        return obj.replace(base, "<basetemp>").replace(repo, "<repo>")
    return obj


def _digest(path: Path) -> str:
    """sha256 of a file read in 16 MiB blocks (the real-config corpus writes sparse files of
    published size, up to tens of GB: never read one whole into memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 << 20):
            h.update(block)
    return h.hexdigest()


#: a volatile key's value in config.json's text (one line each: specfmt writes it with indent=2)
_VOLATILE_TEXT = re.compile(r'("(?:' + "|".join(sorted(VOLATILE)) + r')": )("[^"]*"|[0-9.eE+-]+)')


def _scrub_text(text: str, base: str, repo: str = str(REPO)) -> str:
    """config.json's text with the volatile values blanked and the basetemp and the tree's path replaced."""
    return _VOLATILE_TEXT.sub(r"\1null", text).replace(base, "<basetemp>").replace(repo, "<repo>")


def snapshot(base: Path, repo: str = str(REPO)) -> dict:
    """``{folder under base: {"config": scrubbed config, "files": {name: sha256}}}``."""
    real = str(base.resolve())
    out = {}
    for cfg_path in sorted(base.rglob("config.json")):
        folder = cfg_path.parent
        if any(part.startswith(".") for part in folder.relative_to(base).parts):
            continue  # temporary folders of interrupted writes
        try:
            text = cfg_path.read_text()
            cfg = json.loads(text)
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict) or "specfmt" not in cfg:
            continue  # a source or a verifier the test built, not something specfmt wrote
        files = {}
        for p in sorted(folder.iterdir()):
            if not p.is_file() or p.name == "config.json":
                continue
            if p.suffix == ".json":
                try:
                    files[p.name] = _scrub(json.loads(p.read_text()), real, repo)
                    if p.name == "validation.json" and isinstance(files[p.name].get("files"), dict):
                        files[p.name]["files"].pop("config.json", None)  # the digest of a config whose timestamp is volatile
                    continue
                except ValueError:
                    pass
            files[p.name] = _digest(p)
        out[str(folder.relative_to(base))] = {"config": _scrub(cfg, real, repo), "files": files,
                                              "config_sha256": hashlib.sha256(_scrub_text(text, real, repo).encode()).hexdigest()}
    return out


def record(path: Path, pytest_args: list[str]) -> int:
    """Run the tests with a kept basetemp and snapshot it. With ``SNAPSHOT_BASETEMP=/some/path`` the
    basetemp is that folder (emptied first): record both trees with the same one, and the sources the
    tests write (whose configs hold absolute paths under it) hash the same in both."""
    fixed = os.environ.get("SNAPSHOT_BASETEMP")
    if fixed:
        shutil.rmtree(fixed, ignore_errors=True)
    base = Path(fixed) if fixed else Path(tempfile.mkdtemp(prefix="specfmt-snapshot-"))
    args = pytest_args or DEFAULT_TESTS
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base}", *args], cwd=REPO)
    snap = snapshot(base)
    path.write_text(json.dumps({"pytest_exit": r.returncode, "folders": snap}, indent=1, sort_keys=True))
    print(f"{len(snap)} folders recorded in {path} (pytest exit {r.returncode}; basetemp {base})")
    return 0


def compare(a_path: Path, b_path: Path) -> int:
    a, b = (json.loads(p.read_text())["folders"] for p in (a_path, b_path))
    bad = 0
    for folder in sorted(a.keys() | b.keys()):
        if folder not in a or folder not in b:
            print(f"{folder}: only in {'before' if folder in a else 'after'}")
            bad += 1
            continue
        if a[folder]["config"] != b[folder]["config"]:
            print(f"{folder}/config.json differs")
            bad += 1
        elif a[folder].get("config_sha256", "") != b[folder].get("config_sha256", "") and "config_sha256" in a[folder] and "config_sha256" in b[folder]:
            print(f"{folder}/config.json: same content, different text (key order or number format)")
            bad += 1
        fa, fb = a[folder]["files"], b[folder]["files"]
        for name in sorted(fa.keys() | fb.keys()):
            if fa.get(name) != fb.get(name):
                print(f"{folder}/{name} differs" if name in fa and name in fb else f"{folder}/{name}: only in {'before' if name in fa else 'after'}")
                bad += 1
    print(f"{len(a)} folders before, {len(b)} after, {bad} difference(s)")
    return 1 if bad else 0


#: what a snapshot blanked, put back as fixed values (the provenance block requires them)
PLACEHOLDERS = {"created": "2025-01-01T00:00:00Z", "specfmt_version": "0.1.0"}


def _whole(cfg: dict) -> dict:
    cfg = json.loads(json.dumps(cfg).replace("<basetemp>", "/basetemp").replace("<repo>", "/repo").replace(json.dumps(str(REPO))[1:-1], "/repo"))
    prov = cfg.get("specfmt")
    if isinstance(prov, dict):
        for block in [prov, *[u for u in prov.get("upgrades", []) if isinstance(u, dict)]]:
            for key, val in PLACEHOLDERS.items():
                block.setdefault(key, val)
    return cfg


def _answer(cfg) -> list[list[str]]:
    """What validating ``cfg`` reports with the specfmt imported (run with main's tree first on
    ``PYTHONPATH`` to record main's answer): the schema's violations, else the rules'; sorted."""
    from specfmt.algorithms import schema_violations

    return sorted({tuple(v) for v in schema_violations(cfg)})


def _inputs(basetemps: list[Path]) -> list[tuple[str, dict]]:
    """``(where, config)`` of every speculators config.json without specfmt's provenance block: the
    repository's (``examples/**``, ``tests/data/real_configs``) and those the tests wrote as inputs
    under each basetemp (older speculators checkpoints, upgrade sources)."""
    out = []
    for p in sorted((REPO / "examples").rglob("config.json")):
        out.append((str(p.relative_to(REPO)), json.loads(p.read_text())))
    for p in sorted((REPO / "tests" / "data" / "real_configs").glob("*.json")):
        out.append((str(p.relative_to(REPO)), json.loads(p.read_text())["config"]))
    for base in basetemps:
        real = str(base.resolve())
        for p in sorted(base.rglob("config.json")):
            try:
                cfg = json.loads(p.read_text().replace(real, "/basetemp").replace(str(REPO), "/repo"))
            except (OSError, ValueError):
                continue
            if isinstance(cfg, dict) and "specfmt" not in cfg:
                out.append(("<basetemp>/" + str(p.parent.relative_to(base)), cfg))
    return [(w, c) for w, c in out if isinstance(c, dict) and "speculators_model_type" in c]


def corpus(out: Path, snapshots: list[Path], basetemps: list[Path]) -> int:
    """Write the corpus: the distinct configs specfmt wrote in the snapshots' folders and the distinct
    speculators configs of :func:`_inputs`, with the answer of the specfmt imported (:func:`_answer`):
    ``configs`` (written, valid), ``inputs`` (not written by specfmt, valid), ``refused`` (the rest,
    each with ``where`` and ``on_main``, its violations)."""
    seen, folders, written = set(), 0, []
    kept: dict[str, list] = {"configs": [], "inputs": [], "refused": []}
    for snap in snapshots:
        snap_folders = json.loads(snap.read_text())["folders"]
        folders += len(snap_folders)
        written += [(f"{snap.name}:{f}", _whole(snap_folders[f]["config"])) for f in sorted(snap_folders)]
    for kind, items in (("configs", written), ("inputs", _inputs(basetemps))):
        for where, cfg in items:
            key = json.dumps(cfg, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            answer = _answer(cfg)
            if answer:
                kept["refused"].append({"where": where, "config": cfg, "on_main": answer})
            else:
                kept[kind].append(cfg if kind == "configs" else {"where": where, "config": cfg})
    how = (f"configs: the distinct config.json files specfmt wrote in the {folders} folders of {', '.join(s.name for s in snapshots)} "
           "(tests/snapshot_outputs.py record), provenance times and versions replaced by placeholders, that validate before issue 24; "
           "inputs: the distinct speculators config.json files of examples/, tests/data/real_configs and the tests' inputs that do; "
           "refused: the rest, with what validation reported on main (schema_violations: the v1 schema, then the rules)")
    parts = [f'"{k}": [\n' + ",\n".join(json.dumps(c) for c in v) + "\n]" for k, v in kept.items()]
    out.write_text(f'{{"how": {json.dumps(how)},\n' + ",\n".join(parts) + "}\n")
    print(f"{out}: " + ", ".join(f"{len(v)} {k}" for k, v in kept.items()))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) in (3, 4) and argv[0] == "scan":  # snapshot a basetemp an earlier `record` left behind (and its tree)
        snap = snapshot(Path(argv[2]), *(argv[3:] or [str(REPO)]))
        Path(argv[1]).write_text(json.dumps({"pytest_exit": None, "folders": snap}, indent=1, sort_keys=True))
        return 0
    if len(argv) >= 2 and argv[0] == "record":
        rest = argv[2:]
        return record(Path(argv[1]), rest[1:] if rest[:1] == ["--"] else rest)
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    if len(argv) >= 3 and argv[0] == "corpus":  # OUT SNAPSHOT.json... [BASETEMP...]
        paths = [Path(a) for a in argv[2:]]
        return corpus(Path(argv[1]), [p for p in paths if p.is_file()], [p for p in paths if p.is_dir()])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
