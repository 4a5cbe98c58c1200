"""What the fuzzer feeds specfmt's commands, and how it judges each answer.

Shared by ``tests/test_fuzz.py`` (CI: a fixed seed, a few dozen examples per command, the saved
example database and every crash ever found) and ``benchmarks/fuzz_bench.py`` (10,000 examples per
command, counted).

**Inputs.** A :class:`Case` is one of the :data:`BASES` checkpoint folders (research layouts of every
converter, older speculators checkpoints, specfmt outputs) changed by a few :data:`Op` edits: a
config.json value set to any JSON value at any path (nested objects and lists too), deleted or
added; config.json replaced by raw bytes; a file removed, truncated or overwritten in part with 0xFF bytes
(NaN in the tensors, or a broken pickle).

**Commands** (:data:`ENTRIES`): every one that reads a config or a folder -- ``inspect``,
``convert --from F`` for every F and ``auto``, ``validate``, ``upgrade``, ``push --dry-run`` and
``train ALGO --init``. Each runs in-process (the typer app, as the console script runs it) with
the mutated folder as its input and an output folder that must not exist yet.

**Judgement** (:meth:`Fuzzer.run`, an :class:`Outcome`): the command ends with exit 0, exit 1 (a
failed validation) or a refusal (exit 2 with exactly one ``specfmt: error:`` line); any other
exception is *uncaught*. After a refusal nothing is left behind: no output folder, nothing beside
it, no temporary file or folder. Whatever the ending, no input (the checkpoint, the verifier, the
data file) has changed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

from conftest import WORLD
from vllm_releases import fake_hub

VERIFIER = WORLD / "verifier"
#: the verifier's Hub id in push's --verifier-id, cached offline by :class:`Fuzzer`
HUB_VERIFIER = "specfmt-fuzz/verifier"
#: the example verifier's sizes, so the built drafts match it and reach the deep checks
W1 = {"hidden": 128, "vocab": 2048, "inter": 384, "heads": 4, "kv_heads": 2}

RESEARCH = ("eagle3", "eagle", "hass", "eagle-v0", "medusa", "medusa-v01", "medusa-vllm")
SPECULATORS = ("spec-eagle3", "spec-eagle3-modelopt", "spec-eagle")
SPECFMT = ("specfmt-eagle3", "specfmt-eagle", "specfmt-medusa")
BASES = RESEARCH + SPECULATORS + SPECFMT


def build_bases(root: Path) -> dict[str, Path]:
    """Every base folder, written under ``root`` (once per session; seconds)."""
    import torch
    from builders import write_eagle1, write_speculators_eagle, write_speculators_eagle3
    from builders_medusa import write_v01
    from test_layouts import write_v0_wrapper, write_vllm_medusa

    from specfmt.convert import convert

    v = str(VERIFIER.resolve())
    out = {
        "eagle3": shutil.copytree(WORLD / "eagle3-safeailab", root / "eagle3"),
        "eagle": shutil.copytree(WORLD / "eagle-safeailab", root / "eagle"),
        "hass": write_eagle1(root / "hass", fmt="safetensors", dtype=torch.float32, seed=5, **W1),
        "eagle-v0": write_v0_wrapper(root / "eagle-v0", fc_bias=True, prefix="model.", **W1),
        "medusa": shutil.copytree(WORLD / "medusa-legacy", root / "medusa"),
        "medusa-v01": write_v01(root / "medusa-v01", hidden=128, vocab=2048, dtype=torch.float32, config_heads=2, heads=3, seed=1),
        "medusa-vllm": write_vllm_medusa(root / "medusa-vllm", hidden=128, vocab=2048),
        "spec-eagle3": write_speculators_eagle3(root / "spec-eagle3", v, style="trainer-0.8", draft_vocab=1024, **W1),
        "spec-eagle3-modelopt": write_speculators_eagle3(root / "spec-eagle3-modelopt", v, style="modelopt", draft_vocab=1024, **W1),
        "spec-eagle": write_speculators_eagle(root / "spec-eagle", v, **W1),
    }
    for name, src in (("specfmt-eagle3", "eagle3"), ("specfmt-eagle", "eagle"), ("specfmt-medusa", "medusa")):
        convert(src.split("-")[0], str(out[src]), root / name, v)
        out[name] = root / name
    assert set(out) == set(BASES)
    return {k: Path(p) for k, p in out.items()}


# --------------------------------------------------------------------------- cases

#: ``("set", path, value)``, ``("delete", path)``, ``("add", key, value)`` edit config.json (path: keys
#: and list indices from the top); ``("config-bytes", raw)`` replaces it; ``("remove", file)``,
#: ``("truncate", file, n)`` and ``("scribble", file, permille, n)`` (n bytes 0xFF -- NaN in any float
#: dtype -- written ``permille``/1000 of the way into the file) act on any file of the folder
Op = tuple


@dataclass(frozen=True)
class Case:
    """A base folder and the edits made to it (see :data:`Op`); ``variant`` picks the command's options
    (:attr:`Entry.variants`)."""

    base: str
    ops: tuple = ()
    variant: int = 0


def apply_ops(cfg: Any, ops: tuple) -> Any:
    """config.json's value after the JSON edits of ``ops`` (the others are ignored here)."""
    cfg = copy.deepcopy(cfg)
    for op in ops:
        if op[0] == "add" and isinstance(cfg, dict):
            cfg[op[1]] = copy.deepcopy(op[2])
        elif op[0] in ("set", "delete"):
            parent, path = cfg, op[1]
            for k in path[:-1]:
                parent = parent[k]
            if op[0] == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(op[2])
    return cfg


def paths(obj, prefix=()) -> list[tuple]:
    """Every key path (dict keys and list indices) in a JSON value."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,))
    return out


scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


@st.composite
def edited_config(draw, base: dict) -> dict:
    """``base`` with 1-4 random edits: a path set to any JSON value, deleted, or an unknown key added."""
    cfg = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        all_paths = paths(cfg)
        kind = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if kind == "add" or not all_paths:
            op = ("add", draw(st.text(max_size=10)), draw(values))
        else:
            path = draw(st.sampled_from(all_paths))
            op = ("delete", path) if kind == "delete" else ("set", path, draw(values))
        cfg = apply_ops(cfg, (op,))
    return cfg


@st.composite
def cases(draw, entry: "Entry", configs: dict[str, Any], files: dict[str, list[str]]) -> Case:
    """A :class:`Case` for ``entry``: one of its preferred bases or any base, then 1-4 edits
    (mostly of config.json's values; sometimes its bytes or the folder's files)."""
    base = draw(st.one_of(st.sampled_from(entry.bases), st.sampled_from(BASES)))
    cfg = configs[base]
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set"] * 6 + ["delete"] * 2 + ["add", "bytes", "file"]))
        all_paths = paths(cfg) if isinstance(cfg, (dict, list)) else []
        if kind == "bytes":
            ops.append(("config-bytes", draw(st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"{", b"[]", b"null", b"\xff\xfe{}"])))))
            cfg = None
        elif kind == "file":
            name = draw(st.sampled_from(files[base]))
            ops.append(draw(st.one_of(st.just(("remove", name)), st.tuples(st.just("truncate"), st.just(name), st.integers(0, 4096)),
                                      st.tuples(st.just("scribble"), st.just(name), st.integers(0, 999), st.integers(1, 64)))))
        elif kind == "add" or not all_paths:
            if not isinstance(cfg, dict):
                continue
            ops.append(("add", draw(st.text(max_size=10)), draw(values)))
            cfg = apply_ops(cfg, ops[-1:])
        else:
            path = draw(st.sampled_from(all_paths))
            ops.append(("delete", path) if kind == "delete" else ("set", path, draw(values)))
            cfg = apply_ops(cfg, ops[-1:])
    return Case(base, tuple(ops), draw(st.integers(0, len(entry.variants) - 1)))


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Entry:
    """A command the fuzzer runs.

    Attributes:
        argv: ``argv(src, out, verifier, data) -> [...]`` (without ``specfmt``), ``variant`` options appended.
        bases: the bases it reads in normal use (the fuzzer also gives it any other).
        variants: option lists; a case picks one.
        writes: whether it writes ``out``.
    """

    name: str
    argv: Callable[[Path, Path, Path, Path], list]
    bases: tuple[str, ...]
    variants: tuple[tuple[str, ...], ...] = ((),)
    writes: bool = False


def _convert(fmt: str, bases: tuple[str, ...]) -> Entry:
    return Entry(f"convert --from {fmt}", lambda s, o, v, d: ["convert", s, "--from", fmt, "-o", o, "--verifier", v], bases, writes=True)


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("inspect", lambda s, o, v, d: ["inspect", s], BASES, ((), ("--json",))),
    _convert("auto", BASES),
    _convert("eagle3", ("eagle3",)),
    _convert("eagle", ("eagle", "eagle-v0")),
    _convert("hass", ("hass", "eagle")),
    _convert("medusa", ("medusa", "medusa-v01", "medusa-vllm")),
    _convert("speculators", SPECULATORS + SPECFMT),
    Entry("validate", lambda s, o, v, d: ["validate", s], SPECFMT + SPECULATORS, (("--json",), ("--verifier", str(VERIFIER)), ())),
    Entry("upgrade", lambda s, o, v, d: ["upgrade", s, "-o", o], SPECULATORS + SPECFMT, (("--verifier", str(VERIFIER)), ()), writes=True),
    Entry("push --dry-run", lambda s, o, v, d: ["push", s, "--repo-id", "me/draft", "--dry-run"], SPECFMT,
          (("--verifier-id", HUB_VERIFIER), ("--verifier-id", HUB_VERIFIER, "--no-validate"), ()), ),
    Entry("train --init", lambda s, o, v, d: ["train", "{algo}", "-o", o, "--verifier", v, "--init", s, "--data", d, "--dry-run", "--no-validate"],
          SPECFMT + ("eagle3", "eagle", "medusa"), (("eagle3",), ("eagle",), ("medusa",)), writes=True),
)}


def argv_of(entry: Entry, case: Case, src: Path, out: Path, verifier: Path, data: Path) -> list[str]:
    """The command line of ``entry`` on ``case`` (train's variant is the algorithm, not options)."""
    argv = [str(a) for a in entry.argv(src, out, verifier, data)]
    variant = entry.variants[case.variant % len(entry.variants)]
    if "{algo}" in argv:
        return [variant[0] if a == "{algo}" else a for a in argv]
    return argv + list(variant)


# --------------------------------------------------------------------------- judging


@dataclass
class Outcome:
    """How one command ended. ``kind``: ``ok`` (exit 0 or 1), ``refused`` (exit 2, one error line) or
    ``uncaught`` (anything else: an exception, a traceback, several error lines, another exit code)."""

    kind: str
    exit_code: int | None
    error: str = ""
    left_behind: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.kind != "uncaught" and not self.left_behind and not self.modified


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file under ``folder``: size, mtime and (files up to 1 MiB) sha256; folders too."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st_ = p.lstat()
        rel = str(p.relative_to(folder))
        if p.is_file() and not p.is_symlink():
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if st_.st_size <= 2**20 else None
            out[rel] = (st_.st_size, st_.st_mtime_ns, digest)
        else:
            out[rel] = ("dir" if p.is_dir() else "other",)
    return out


class Fuzzer:
    """Runs :class:`Case` s through :data:`ENTRIES` in this process, in a private work folder."""

    def __init__(self, root: Path):
        import typer

        from specfmt.cli import app

        self.root = root
        # torch's compile cache would otherwise appear in the temporary folder watched below
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "torchinductor"))
        self.command = typer.main.get_command(app)
        self.pristine = build_bases(root / "pristine")
        self.configs = {b: json.loads((p / "config.json").read_text()) for b, p in self.pristine.items()}
        self.files = {b: sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.is_file()) for b, p in self.pristine.items()}
        self.work = root / "work"
        self.outs = root / "outs"
        self.tmp = root / "tmp"
        for d in (self.work, self.outs, self.tmp):
            d.mkdir()
        self.verifier = root / "verifier"
        shutil.copytree(VERIFIER, self.verifier)
        self.data = root / "data.txt"
        self.data.write_text("".join(json.loads(line)["prompt"] + "\n" for line in (WORLD / "prompts.jsonl").read_text().splitlines()))
        self.inputs_before = {"verifier": snapshot(self.verifier), "data": self.data.stat().st_mtime_ns}
        # push's --verifier-id HUB_VERIFIER resolves offline (conftest's private HF_HOME), so its validation reaches the verifier check
        fake_hub(Path(os.environ["HF_HOME"]), HUB_VERIFIER, VERIFIER)
        self.n = 0
        self._dirty: dict[str, set[str]] = {}  # base -> files its work copy may differ in from the pristine one

    def strategy(self, entry: Entry):
        return cases(entry, self.configs, self.files)

    def _prepare(self, case: Case) -> Path:
        """The base in the work folder as pristine, then ``case``'s edits. Only the files the last case
        of this base changed are copied back (a whole new copy when a command changed its input)."""
        src, pristine = self.work / case.base, self.pristine[case.base]
        dirty = self._dirty.pop(case.base, None)
        if dirty is None:
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(pristine, src)
        else:
            for name in dirty:
                shutil.copyfile(pristine / name, src / name)
        self._dirty[case.base] = {"config.json", *(op[1] for op in case.ops if op[0] in ("remove", "truncate", "scribble"))}
        cfg: Any = self.configs[case.base]
        for op in case.ops:  # in order, on disk
            if op[0] == "config-bytes":
                (src / "config.json").write_bytes(op[1])
                cfg = None
            elif op[0] in ("remove", "truncate", "scribble"):
                p = src / op[1]
                if op[0] == "remove":
                    p.unlink(missing_ok=True)
                elif p.is_file():
                    with open(p, "r+b") as f:
                        if op[0] == "truncate":
                            f.truncate(min(op[2], p.stat().st_size))
                        else:  # 0xFF bytes (NaN in any float dtype) from op[2]/1000 of the way in
                            f.seek(p.stat().st_size * op[2] // 1000)
                            f.write(b"\xff" * op[3])
                if op[1] == "config.json":
                    cfg = None
            elif cfg is not None:  # a JSON edit of a config that is still JSON
                cfg = apply_ops(cfg, (op,))
                (src / "config.json").write_text(json.dumps(cfg))
        return src

    def run(self, entry: Entry, case: Case) -> Outcome:
        """Run ``entry`` on ``case`` and judge it (see the module's docstring)."""
        self.n += 1
        src = self._prepare(case)
        before = snapshot(src)
        out = self.outs / f"out-{self.n}"
        argv = argv_of(entry, case, src, out, self.verifier, self.data)
        stdout, stderr = io.StringIO(), io.StringIO()
        saved_tmp = tempfile.tempdir
        tempfile.tempdir = str(self.tmp)  # every temporary file of the command lands here
        exc: BaseException | None = None
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = self.command.main(args=argv, prog_name="specfmt", standalone_mode=False)
        except SystemExit as e:  # not raised with standalone_mode=False; a bug if it is
            exc, code = e, None
        except Exception as e:  # noqa: BLE001 - what escapes the command is the finding
            exc, code = e, None
        finally:
            tempfile.tempdir = saved_tmp
        code = 0 if code is None and exc is None else code
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.startswith("specfmt: error:")]
        if exc is not None:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            kind, error = "uncaught", f"{type(exc).__name__}: {exc}"[:2000] + f" (at {os.path.relpath(frame.filename)}:{frame.lineno})"
        elif code in (0, 1) and not lines:
            kind, error = "ok", ""
        elif code == 2 and len(lines) == 1 and "Traceback" not in stderr.getvalue():
            kind, error = "refused", lines[0]
        else:
            kind, error = "uncaught", f"exit {code}: {stderr.getvalue()[-2000:]}"
        left = []
        if kind == "refused":
            left = [str(p) for p in self.outs.iterdir()]
        left += [str(p) for p in self.tmp.iterdir()]
        modified = []
        if snapshot(src) != before:
            modified.append(f"{case.base}: {sorted(set(snapshot(src).items()) ^ set(before.items()))[:4]}")
            self._dirty.pop(case.base, None)  # copied anew next time
        if snapshot(self.verifier) != self.inputs_before["verifier"]:
            modified.append("verifier")
            shutil.rmtree(self.verifier)
            shutil.copytree(VERIFIER, self.verifier)
            self.inputs_before["verifier"] = snapshot(self.verifier)
        if self.data.stat().st_mtime_ns != self.inputs_before["data"]:
            modified.append("data")
        for p in list(self.outs.iterdir()) + list(self.tmp.iterdir()):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        return Outcome(kind, code, error, left, modified)


def describe(entry: Entry, case: Case, outcome: Outcome) -> str:
    return f"{entry.name} on {case}: {outcome.kind} (exit {outcome.exit_code}) {outcome.error} left={outcome.left_behind} modified={outcome.modified}"
