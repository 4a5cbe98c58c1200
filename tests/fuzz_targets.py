"""What the fuzzer feeds specfmt's commands, and how it judges each answer.

Shared by ``tests/test_fuzz.py`` (CI: a fixed seed, a few dozen examples per command, the saved
example database and every crash ever found) and ``benchmarks/fuzz_bench.py`` (10,000 examples per
command, counted).

**Inputs.** A :class:`Case` is one of the :data:`BASES` checkpoint folders (research layouts of every
converter, older speculators checkpoints, specfmt outputs) changed by a few :data:`Op` edits: a
config.json value set to any JSON value at any path (nested objects and lists too), deleted or
added; config.json replaced by raw bytes; a file removed, truncated or overwritten in part with 0xFF bytes
(NaN in the tensors, or a broken pickle).

**Data and datagen folders** (issue 35): a ``--data`` file (:func:`data_cases`: jsonl lines of every shape the
commands read -- ``text``, ``prompt``, chat ``messages``, ShareGPT ``conversations`` --, edited like configs, with raw
bytes, JSON values that are not objects and blank lines among them; or a text file of any text or bytes), and
:data:`DATAGEN`, a ``specfmt datagen`` output folder (its manifest ``specfmt_datagen.json`` is the JSON edited;
files removed, cut at any point, overwritten in part with 0xFF or any bytes, or swapped with another of the folder,
and stray files added).

**Commands** (:data:`ENTRIES`): every one that reads a config, a folder or a data file -- ``inspect``,
``convert --from F`` for every F and ``auto``, ``validate``, ``upgrade``, ``push --dry-run``,
``train ALGO --init``, ``validate --run``, ``datagen`` (its ``--data``, and an existing OUT),
``regenerate --data`` and ``train ALGO --hidden-states``. Each runs in-process (the typer app, as the console
script runs it) with the mutated folder or file as its input and an output that must not exist yet (``datagen
OUT``: the mutated folder is the output). No model is loaded and no engine starts (:attr:`Entry.stubs`): datagen's
engine is :class:`FakeEngine`, regenerate's completer :class:`FakeCompleter`, and ``validate --run`` stops where it
would load the verifier's weights (:class:`ModelLoadReached`), after the static checks that must stop it first.

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
import re
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
#: a ``specfmt datagen`` output (:func:`build_datagen`): datagen's OUT, and ``train --hidden-states``' input
DATAGEN = ("datagen",)
#: the base of a fuzzed data file (:func:`data_cases`)
DATA = "data"
#: the JSON file a base's JSON edits act on (default config.json)
MAIN_JSON = {"datagen": "specfmt_datagen.json"}
#: a chat template for the verifier copy that reads chat data (``{chat-verifier}``)
CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")
#: the data the datagen base is made from (``{data}``), and other data (``{data2}``)
DATAGEN_ROWS = [{"text": f"def f{i}(x):\n    return x * {i}\n" * (i + 1)} for i in range(6)]
OTHER_ROWS = [{"text": "import os\nprint(os.getcwd())\n"}, {"text": "Sort a list."}]
#: ``datagen``'s options every datagen entry shares (the base is made with them)
DATAGEN_ARGS = ("--engine", "transformers", "--seq-len", "64")


def main_json(base: str) -> str:
    return MAIN_JSON.get(base, "config.json")


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


# --------------------------------------------------------------------------- what stands in for models and engines


class ModelLoadReached(BaseException):
    """Raised where ``validate --run`` would load the verifier's weights (:func:`stubs_validate_run`): the fuzzer
    stops there. A BaseException, so that no ``except Exception`` of the command takes it for a failure."""


class FakeEngine:
    """A :class:`specfmt.datagen.engine.HiddenStateEngine` that loads no model: each sample's ``hidden_states``
    [T, len(layers), H] is a function of its token ids and the layer ids (finite, deterministic), written as the
    transformers engine writes (beside, then ``os.replace``)."""

    name = "fuzz"

    def __init__(self, hidden: int):
        self.hidden = hidden

    def extract(self, samples, layers, folder):
        import torch
        from safetensors.torch import save_file

        from specfmt.datagen.engine import sample_path

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for index, ids in samples:
            t = torch.tensor(list(ids), dtype=torch.int64)
            hs = ((t[:, None, None] % 97).float() / 97 + torch.tensor(layers, dtype=torch.float32)[None, :, None] / 10
                  + torch.arange(self.hidden, dtype=torch.float32)[None, None, :] / 1000)
            path = sample_path(folder, index)
            tmp = path.with_name(path.name + ".tmp")
            try:
                save_file({"hidden_states": hs.contiguous(), "token_ids": t}, str(tmp))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            yield index, path

    def close(self) -> None:
        pass


class FakeCompleter:
    """Stands in for regenerate's :class:`~specfmt.datagen.regenerate.VLLMCompleter` (same arguments): three
    fixed tokens per prompt, no engine."""

    def __init__(self, verifier, settings, max_model_len, tensor_parallel_size=1, dtype="auto"):
        self.max_tokens = settings.max_tokens

    def __call__(self, prompts):
        return [([40, 41, 42][:self.max_tokens], self.max_tokens <= 3) for _ in prompts]


@contextlib.contextmanager
def stubs_datagen():
    """``datagen``'s engine is :class:`FakeEngine` (whatever ``--engine`` says)."""
    from specfmt.datagen import pipeline

    real = pipeline.make_engine
    pipeline.make_engine = lambda name, verifier, *a, **k: (FakeEngine(verifier.info.hidden_size), [])
    try:
        yield
    finally:
        pipeline.make_engine = real


@contextlib.contextmanager
def stubs_regenerate():
    """``regenerate``'s completer is :class:`FakeCompleter`."""
    from specfmt.datagen import regenerate

    real = regenerate.VLLMCompleter
    regenerate.VLLMCompleter = FakeCompleter
    try:
        yield
    finally:
        regenerate.VLLMCompleter = real


@contextlib.contextmanager
def stubs_validate_run():
    """``Verifier.load_model`` raises :class:`ModelLoadReached`: no weights are loaded."""
    from specfmt.sources.verifier import Verifier

    real = Verifier.load_model

    def reached(self, *a, **k):
        raise ModelLoadReached()

    Verifier.load_model = reached
    try:
        yield
    finally:
        Verifier.load_model = real


def build_datagen(out: Path, verifier: Path, data: list[Path], seq_len: int = 64) -> Path:
    """``specfmt datagen``'s output for ``data`` (through the command's pipeline, :class:`FakeEngine` as the engine)."""
    from specfmt.datagen.pipeline import DatagenRequest, run_datagen

    with stubs_datagen():
        run_datagen(DatagenRequest(verifier=str(verifier), data=[str(d) for d in data], output=str(out), seq_len=seq_len,
                                   engine="transformers"))
    return out


def datagen_problems(out: Path, reference: Path | None = None, max_samples: int | None = None) -> list[str]:
    """What is wrong with a datagen output that ``datagen`` answered with exit 0: a row without its hidden-states file
    or with one that does not check (:func:`specfmt.datagen.layout.check_sample`), ``token_freq.pt`` other than the
    rows' counts, a manifest that disagrees with the files; and, given the ``reference`` output of a fresh run on the
    same inputs, what a reader would take for data and that differs from it: the rows, the manifest's account of the
    data, a hidden-states file that opens but is no row's (a stale file kept). Files of other names (a note, another
    tool's file, a temporary file) are no data to any reader and are not judged here.

    With a ``reference`` (an existing folder continued), the files kept are checked as a resumed run checks them:
    the header, the token ids and the shape, not the values (a resume does not read every hidden state again;
    ``train --hidden-states`` checks each file it reads, :func:`~specfmt.datagen.layout.check_sample`). With
    ``max_samples`` (``--max-samples``) only the first rows have their files."""
    import torch
    from safetensors import safe_open

    from specfmt.datagen import layout

    problems: list[str] = []
    try:
        rows = layout.read_preprocessed(out)
        manifest = layout.read_manifest(out)
        freq = torch.load(out / layout.TOKEN_FREQ, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to read it back is the finding
        return [f"the output does not read back: {type(e).__name__}: {str(e)[:200]}"]
    if manifest is None:
        return ["no manifest"]
    if freq != layout.token_frequencies(rows):
        problems.append("token_freq.pt is not the rows' token counts")
    folder = layout.hidden_states_folder(out)
    made = len(rows) if max_samples is None else min(max_samples, len(rows))
    for i, row in enumerate(rows[:made]):
        path = layout.sample_path(folder, i)
        try:
            if reference is None:
                layout.check_sample(path, i, row.input_ids, len(manifest.layers), manifest.hidden_size)
            else:
                with safe_open(str(path), framework="pt") as f:
                    shape, ids = f.get_slice("hidden_states").get_shape(), f.get_tensor("token_ids").tolist()
                if ids != list(row.input_ids) or list(shape) != [len(row), len(manifest.layers), manifest.hidden_size]:
                    problems.append(f"row {i}: hs_{i}.safetensors holds {len(ids)} other token ids or the shape {list(shape)}: a stale file")
        except Exception as e:  # noqa: BLE001
            problems.append(f"row {i}: {str(e)[:200]}")
    placed = layout.existing_samples(folder)
    if placed != list(range(made)):
        problems.append(f"hidden-states files that open: {placed}, for {made} rows (a stale file kept, or one missing)")
    if (manifest.samples, manifest.files) != (len(rows), len(placed)):
        problems.append(f"the manifest says {manifest.samples} samples and {manifest.files} files")
    if reference is not None and not problems:
        if rows != layout.read_preprocessed(reference):
            problems.append("the rows differ from a fresh run's")
        fresh = layout.read_manifest(reference)
        account = ("verifier", "layers", "hidden_size", "seq_len", "dtype", "samples", "tokens", "files", "bytes")
        if [getattr(manifest, k) for k in account] != [getattr(fresh, k) for k in account]:
            problems.append("the manifest's account of the data differs from a fresh run's")
    return problems


# --------------------------------------------------------------------------- cases

#: ``("set", path, value)``, ``("delete", path)``, ``("add", key, value)`` edit config.json (path: keys
#: and list indices from the top; a datagen folder's manifest, :data:`MAIN_JSON`); ``("config-bytes", raw)`` replaces it;
#: ``("remove", file)``, ``("truncate", file, n)`` and ``("scribble", file, permille, n)`` (n bytes 0xFF -- NaN in any
#: float dtype -- written ``permille``/1000 of the way into the file) act on any file of the folder. The entries added
#: in issue 35 also draw ``("cut", file, permille)`` (the file cut ``permille``/1000 of the way in), ``("poke", file,
#: permille, raw)`` (those bytes written there), ``("swap", a, b)`` (b's bytes replaced by a's: a stale file) and
#: ``("stray", name, raw)`` (a file the folder did not hold). A data file's case is ``("content", suffix, raw)``.
Op = tuple
#: the kinds of edit :func:`cases` draws, each as often as it is listed (:attr:`Entry.op_kinds`)
CONFIG_KINDS = ("set",) * 6 + ("delete",) * 2 + ("add", "bytes", "file")
#: damage to the files rather than to the JSON (``validate --run``'s weights, a datagen folder)
FILE_KINDS = ("set",) * 2 + ("delete", "add", "bytes") + ("file",) * 3 + ("damage",) * 3 + ("swap", "stray")
#: an existing datagen output continued: mostly what a crash, a disk or another run leaves (files removed, cut, stale,
#: stray), seldom an edited manifest (which is refused)
OUT_KINDS = ("set", "delete", "bytes") + ("file",) * 4 + ("damage",) * 2 + ("swap",) * 2 + ("stray",) * 3


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
    if entry.any_bases:  # issue 35's entries: their own bases three times in four
        base = draw(st.sampled_from(entry.bases if draw(st.integers(0, 3)) else entry.any_bases))
    else:
        base = draw(st.one_of(st.sampled_from(entry.bases), st.sampled_from(BASES)))
    cfg = configs[base]
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(list(entry.op_kinds or CONFIG_KINDS)))
        if kind == "damage":
            name = draw(st.sampled_from(files[base]))
            ops.append(draw(st.one_of(st.tuples(st.just("cut"), st.just(name), st.integers(0, 999)),
                                      st.tuples(st.just("poke"), st.just(name), st.integers(0, 999), st.binary(min_size=1, max_size=16)))))
            continue
        if kind == "swap":
            ops.append(("swap", draw(st.sampled_from(files[base])), draw(st.sampled_from(files[base]))))
            continue
        if kind == "stray":
            name = draw(st.sampled_from(STRAYS + tuple(f + ".tmp" for f in files[base][:3])))
            ops.append(("stray", name, draw(st.sampled_from([b"", b"{}", b"\x00" * 8, b"stray"]))))
            continue
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


#: files :func:`cases` may add to a folder ("stray"): names a datagen output or a checkpoint could hold
STRAYS = ("notes.txt", "token_freq.pt", "state.json", "specfmt_datagen.json", "hidden_states/hs_99.safetensors",
          "hidden_states/hs_0.safetensors.tmp", ".preprocessed.4194304.tmp", "config.json", "model.safetensors")

#: the lines a fuzzed jsonl data file starts from: every shape ``--data`` takes
DATA_LINES = (
    {"text": "def f(x):\n    return x + 1\n"},
    {"prompt": "Sort a list."},
    {"id": "q1", "prompt": "Reverse a string."},
    {"messages": [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."},
                  {"role": "assistant", "content": "Use sorted(xs)."}, {"role": "user", "content": "In place?"},
                  {"role": "assistant", "content": "xs.sort()"}]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
)


@st.composite
def data_cases(draw, entry: "Entry") -> Case:
    """A data file: mostly jsonl, 0-5 lines, each one of :data:`DATA_LINES` as it is or edited (:func:`edited_config`),
    any JSON value, raw bytes or a blank line; else a text file (any text, or bytes) under another suffix."""
    suffix = draw(st.sampled_from([".jsonl"] * 5 + [".txt", ".json", ""]))
    if suffix == ".jsonl" or draw(st.booleans()):
        lines = []
        for _ in range(draw(st.integers(0, 5))):
            kind = draw(st.sampled_from(["line"] * 3 + ["edited"] * 3 + ["json", "bytes", "blank"]))
            if kind in ("line", "edited"):
                line = draw(st.sampled_from(DATA_LINES))
                lines.append(json.dumps(draw(edited_config(line)) if kind == "edited" else line).encode())
            elif kind == "json":
                lines.append(json.dumps(draw(values)).encode())
            elif kind == "bytes":
                lines.append(draw(st.binary(max_size=24)))
            else:
                lines.append(draw(st.sampled_from([b"", b"  ", b"\t"])))
        raw = b"\n".join(lines) + draw(st.sampled_from([b"\n", b"", b"\r\n"]))
    else:
        raw = draw(st.one_of(st.text(max_size=200).map(lambda t: t.encode("utf-8")), st.binary(max_size=200)))
    return Case(DATA, (("content", suffix, raw),), draw(st.integers(0, len(entry.variants) - 1)))


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Entry:
    """A command the fuzzer runs.

    Attributes:
        argv: ``argv(src, out, verifier, data) -> [...]`` (without ``specfmt``), ``variant`` options appended;
            ``{verifier}``, ``{chat-verifier}``, ``{data}`` and ``{data2}`` in them are the fuzzer's (:meth:`Fuzzer.places`).
        bases: the bases it reads in normal use (the fuzzer also gives it any other: ``any_bases``, default :data:`BASES`).
        variants: option lists; a case picks one.
        writes: whether it writes ``out``.
        data: its input is a data file (:func:`data_cases`), not a folder.
        op_kinds: the edits drawn (default :data:`CONFIG_KINDS`).
        stubs: a context manager that stands in for the models and engines (no model loads, no engine starts).
        src_is_out: the input folder is the command's output (``datagen -o`` an existing folder): a refusal leaves it
            as it was; exit 0 may change it (``check`` judges the result).
        src_outputs: files the command writes into its input by design (``validate --run``'s validation.json).
        check: ``check(fuzzer, entry, case, src, out, outcome) -> [problems]``, what else must hold.
    """

    name: str
    argv: Callable[[Path, Path, Path, Path], list]
    bases: tuple[str, ...]
    variants: tuple[tuple[str, ...], ...] = ((),)
    writes: bool = False
    data: bool = False
    any_bases: tuple[str, ...] = ()
    op_kinds: tuple[str, ...] = ()
    stubs: Callable[[], Any] | None = None
    src_is_out: bool = False
    src_outputs: tuple[str, ...] = ()
    check: Callable[..., list[str]] | None = None


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
    # issue 35: the entry points that read a data file, a datagen folder, or run a draft
    Entry("validate --run", lambda s, o, v, d: ["validate", s, "--run", "--no-vllm", "--max-tokens", "4"], SPECFMT + SPECULATORS,
          ((), ("--json",), ("--verifier", "{verifier}")), op_kinds=FILE_KINDS, stubs=stubs_validate_run, src_outputs=("validation.json",),
          check=lambda *a: check_validate_run(*a)),
    Entry("datagen --data", lambda s, o, v, d: ["datagen", "--data", s, "-o", o, *DATAGEN_ARGS], (),
          (("--verifier", "{verifier}"), ("--verifier", "{chat-verifier}"), ("--verifier", "{chat-verifier}", "--seq-len", "8"),
           ("--verifier", "{verifier}", "--max-samples", "2")), writes=True, data=True, stubs=stubs_datagen,
          check=lambda *a: check_datagen(*a)),
    Entry("datagen OUT", lambda s, o, v, d: ["datagen", "-o", s, *DATAGEN_ARGS], DATAGEN,
          (("--verifier", "{verifier}", "--data", "{data}"), ("--verifier", "{verifier}", "--data", "{data}"),
           ("--verifier", "{verifier}", "--data", "{data2}"), ("--verifier", "{chat-verifier}", "--data", "{data}")),
          writes=True, any_bases=BASES + DATAGEN, op_kinds=OUT_KINDS,
          stubs=stubs_datagen, src_is_out=True, check=lambda *a: check_datagen(*a)),
    Entry("regenerate --data", lambda s, o, v, d: ["regenerate", "--data", s, "-o", f"{o}.jsonl"], (),
          (("--verifier", "{verifier}"), ("--verifier", "{chat-verifier}"), ("--verifier", "{chat-verifier}", "--limit", "2", "--batch-size", "1"),
           ("--verifier", "{verifier}", "--temperature", "0.8", "--seed", "3", "--max-tokens", "2")), writes=True, data=True, stubs=stubs_regenerate),
    Entry("train --hidden-states", lambda s, o, v, d: ["train", "{algo}", "-o", o, "--verifier", v, "--hidden-states", s, "--steps", "2",
                                                       "--batch-size", "4", "--seq-len", "32", "--no-validate"],
          DATAGEN, (("eagle3",), ("eagle3", "--heldout", "0.34"), ("eagle",)), writes=True, any_bases=BASES + DATAGEN, op_kinds=FILE_KINDS),
)}


def check_validate_run(fuzzer: "Fuzzer", entry: Entry, case: Case, src: Path, out: Path, outcome: "Outcome") -> list[str]:
    """``validate --run`` reached the verifier's weights only if every static check passed (a static failure stops the
    run before the verifier loads)."""
    if outcome.kind != "reached":
        return []
    from specfmt.validation.static import validate_static

    variant = entry.variants[case.variant % len(entry.variants)]
    rep = validate_static(src, str(fuzzer.verifier) if "--verifier" in variant else None)
    failed = [c.name for c in rep.checks if c.status == "fail"]
    return [f"the verifier's weights were loaded although the static checks {failed} failed"] if not rep.ok else []


def check_datagen(fuzzer: "Fuzzer", entry: Entry, case: Case, src: Path, out: Path, outcome: "Outcome") -> list[str]:
    """``datagen`` that ended with exit 0 leaves a consistent output (:func:`datagen_problems`); into an existing
    folder (``datagen OUT``), the output a fresh run on the same inputs writes, nothing kept beside it."""
    if outcome.kind != "ok":
        return []
    if not entry.src_is_out:
        opts = list(entry.variants[case.variant % len(entry.variants)])
        return datagen_problems(out, max_samples=int(opts[opts.index("--max-samples") + 1]) if "--max-samples" in opts else None)
    return datagen_problems(src, fuzzer.datagen_reference(case.variant % len(entry.variants)))


def argv_of(entry: Entry, case: Case, src: Path, out: Path, verifier: Path, data: Path, places: dict[str, Path] | None = None) -> list[str]:
    """The command line of ``entry`` on ``case`` (train's variant is the algorithm, then options); ``places`` fills in
    the placeholders of :attr:`Entry.argv` and the variants."""
    argv = [str(a) for a in entry.argv(src, out, verifier, data)]
    variant = list(entry.variants[case.variant % len(entry.variants)])
    if "{algo}" in argv:
        argv, variant = [variant[0] if a == "{algo}" else a for a in argv], variant[1:]
    return [str((places or {}).get(a, a)) for a in argv + variant]


# --------------------------------------------------------------------------- judging


@dataclass
class Outcome:
    """How one command ended. ``kind``: ``ok`` (exit 0 or 1), ``refused`` (exit 2, one error line), ``reached``
    (``validate --run`` got to the verifier's weights, :class:`ModelLoadReached`) or ``uncaught`` (anything else: an
    exception, a traceback, several error lines, another exit code)."""

    kind: str
    exit_code: int | None
    error: str = ""
    left_behind: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    #: what the entry's own judgement (:attr:`Entry.check`) found wrong
    wrong: list[str] = field(default_factory=list)
    #: the temporary files of a killed run (``NAME.PID.tmp``) a refusal removed from an existing output (``datagen OUT``):
    #: counted, not a fault (they are never data); any other change a refusal makes there is ``left_behind``
    removed: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.kind != "uncaught" and not self.left_behind and not self.modified and not self.wrong


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
        # issue 35: a verifier with a chat template, data files, and a datagen output made from them
        self.inputs = root / "inputs"
        self.inputs.mkdir()
        self.chat_verifier = shutil.copytree(VERIFIER, self.inputs / "chat-verifier")
        tok = json.loads((VERIFIER / "tokenizer_config.json").read_text())
        (self.chat_verifier / "tokenizer_config.json").write_text(json.dumps({**tok, "chat_template": CHAT_TEMPLATE}))
        self.datagen_data = self.inputs / "datagen.jsonl"
        self.datagen_data.write_text("".join(json.dumps(r) + "\n" for r in DATAGEN_ROWS))
        self.other_data = self.inputs / "other.jsonl"
        self.other_data.write_text("".join(json.dumps(r) + "\n" for r in OTHER_ROWS))
        self.pristine["datagen"] = build_datagen(root / "pristine" / "datagen", self.verifier, [self.datagen_data])
        self.configs["datagen"] = json.loads((self.pristine["datagen"] / main_json("datagen")).read_text())
        self.files["datagen"] = sorted(str(f.relative_to(self.pristine["datagen"])) for f in self.pristine["datagen"].rglob("*") if f.is_file())
        self.inputs_before["inputs"] = snapshot(self.inputs)
        self._references: dict[int, Path] = {}

    def places(self) -> dict[str, Path]:
        """The placeholders of :attr:`Entry.argv` and the variants."""
        return {"{verifier}": self.verifier, "{chat-verifier}": self.chat_verifier, "{data}": self.datagen_data,
                "{data2}": self.other_data}

    def datagen_reference(self, variant: int) -> Path:
        """A fresh ``datagen`` output for ``datagen OUT``'s variant (its verifier and data), made once."""
        if variant not in self._references:
            entry = ENTRIES["datagen OUT"]
            places = self.places()
            opts = list(entry.variants[variant])
            verifier, data = places[opts[opts.index("--verifier") + 1]], places[opts[opts.index("--data") + 1]]
            out = self.root / "references" / f"datagen-{variant}"
            out.parent.mkdir(exist_ok=True)
            self._references[variant] = build_datagen(out, verifier, [data])
        return self._references[variant]

    def strategy(self, entry: Entry):
        return data_cases(entry) if entry.data else cases(entry, self.configs, self.files)

    def _prepare(self, case: Case) -> Path:
        """The base in the work folder as pristine, then ``case``'s edits. Only the files the last case
        of this base changed are copied back (a whole new copy when a command changed its input)."""
        if case.base == DATA:  # a data file, alone in its folder
            (_, suffix, raw), = case.ops
            folder = self.work / DATA
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            src = folder / f"input{suffix}"
            src.write_bytes(raw)
            return src
        src, pristine = self.work / case.base, self.pristine[case.base]
        dirty = self._dirty.pop(case.base, None)
        if dirty is None:
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(pristine, src)
        else:
            for name in dirty:
                if (pristine / name).is_file():
                    shutil.copyfile(pristine / name, src / name)
                else:  # a stray file
                    (src / name).unlink(missing_ok=True)
        config = main_json(case.base)
        self._dirty[case.base] = {config, *(op[2] if op[0] == "swap" else op[1] for op in case.ops
                                            if op[0] in ("remove", "truncate", "scribble", "cut", "poke", "swap", "stray"))}
        cfg: Any = self.configs[case.base]
        for op in case.ops:  # in order, on disk
            if op[0] == "config-bytes":
                (src / config).write_bytes(op[1])
                cfg = None
            elif op[0] in ("remove", "truncate", "scribble", "cut", "poke", "swap", "stray"):
                name = op[2] if op[0] == "swap" else op[1]
                p = src / name
                if op[0] == "remove":
                    p.unlink(missing_ok=True)
                elif op[0] == "swap":
                    if (src / op[1]).is_file() and op[1] != op[2]:
                        p.write_bytes((src / op[1]).read_bytes())
                elif op[0] == "stray":
                    p.parent.mkdir(parents=True, exist_ok=True)
                    if not p.is_dir():
                        p.write_bytes(op[2])
                elif p.is_file():
                    with open(p, "r+b") as f:
                        size = p.stat().st_size
                        if op[0] == "truncate":
                            f.truncate(min(op[2], size))
                        elif op[0] == "cut":
                            f.truncate(size * op[2] // 1000)
                        else:  # scribble: 0xFF bytes (NaN in any float dtype) from op[2]/1000 of the way in; poke: op[3]
                            f.seek(size * op[2] // 1000)
                            f.write(b"\xff" * op[3] if op[0] == "scribble" else op[3])
                if name == config:
                    cfg = None
            elif cfg is not None:  # a JSON edit of a config that is still JSON
                cfg = apply_ops(cfg, (op,))
                (src / config).write_text(json.dumps(cfg))
        return src

    def run(self, entry: Entry, case: Case) -> Outcome:
        """Run ``entry`` on ``case`` and judge it (see the module's docstring)."""
        self.n += 1
        src = self._prepare(case)
        watched = src.parent if entry.data else src  # a data file: its folder
        before = snapshot(watched)
        out = self.outs / f"out-{self.n}"
        argv = argv_of(entry, case, src, out, self.verifier, self.data, self.places())
        stdout, stderr = io.StringIO(), io.StringIO()
        saved_tmp = tempfile.tempdir
        tempfile.tempdir = str(self.tmp)  # every temporary file of the command lands here
        exc: BaseException | None = None
        reached = False
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), (entry.stubs or contextlib.nullcontext)():
                code = self.command.main(args=argv, prog_name="specfmt", standalone_mode=False)
        except ModelLoadReached:
            reached, code = True, None
        except SystemExit as e:  # not raised with standalone_mode=False; a bug if it is
            exc, code = e, None
        except Exception as e:  # noqa: BLE001 - what escapes the command is the finding
            exc, code = e, None
        finally:
            tempfile.tempdir = saved_tmp
        code = 0 if code is None and exc is None and not reached else code
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.startswith("specfmt: error:")]
        if reached:
            kind, error = "reached", ""
        elif exc is not None:
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
        modified, removed = [], []
        after = snapshot(watched)
        if after != before:
            self._dirty.pop(case.base, None)  # copied anew next time
            changed = sorted({k for k, v in set(after.items()) ^ set(before.items())})
            if entry.src_is_out:  # the input is the output: a refusal leaves it as it was, but for a dead run's temporary files
                gone_tmp = [c for c in changed if c not in after and re.fullmatch(r".*\.\d+\.tmp", c.rsplit("/", 1)[-1])]
                if kind == "refused" and [c for c in changed if c not in gone_tmp]:
                    left.append(f"{case.base}: a refusal changed the output folder: {changed[:4]}")
                elif kind == "refused":
                    removed = gone_tmp
            elif [c for c in changed if c not in entry.src_outputs]:
                modified.append(f"{case.base}: {sorted(set(after.items()) ^ set(before.items()))[:4]}")
        wrong = entry.check(self, entry, case, src, out, Outcome(kind, code, error)) if entry.check and kind != "uncaught" else []
        if snapshot(self.verifier) != self.inputs_before["verifier"]:
            modified.append("verifier")
            shutil.rmtree(self.verifier)
            shutil.copytree(VERIFIER, self.verifier)
            self.inputs_before["verifier"] = snapshot(self.verifier)
        if self.data.stat().st_mtime_ns != self.inputs_before["data"]:
            modified.append("data")
        if snapshot(self.inputs) != self.inputs_before["inputs"]:
            modified.append("the chat verifier or the data files")
        for p in list(self.outs.iterdir()) + list(self.tmp.iterdir()):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        return Outcome(kind, code, error, left, modified, wrong, removed)


def describe(entry: Entry, case: Case, outcome: Outcome) -> str:
    return (f"{entry.name} on {case}: {outcome.kind} (exit {outcome.exit_code}) {outcome.error} left={outcome.left_behind} "
            f"modified={outcome.modified} wrong={outcome.wrong}")
