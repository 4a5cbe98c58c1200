"""Hostile and broken inputs (issue 8): a corpus of malformed checkpoints, each refused with one
clear line and a non-zero exit, no output folder and no temporary folder left behind, the input
unchanged, and never a traceback (``invoke`` re-raises anything but a SpecfmtError).

The corpus is built here from the example world's drafts; ``CORPUS`` lists every case. Its size
is asserted (at least 30) and reported in docs/measured.md.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from conftest import WORLD, tree_digest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specfmt.cli import app
from specfmt.errors import SpecfmtError

runner = CliRunner()
VERIFIER = WORLD / "verifier"


def invoke(args: list[str]) -> tuple[int, str]:
    """``specfmt ARGS`` in-process with :func:`specfmt.cli.main`'s handling: a SpecfmtError is one
    line and exit 2; anything else escaping is a bug and fails the test with its traceback."""
    r = runner.invoke(app, [str(a) for a in args], terminal_width=400)
    if isinstance(r.exception, SpecfmtError):
        return r.exception.exit_code, r.output + "specfmt: error: " + r.exception.one_line()
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.output


# --------------------------------------------------------------------------- sources to break


def eagle3_bin(d: Path) -> Path:
    shutil.copytree(WORLD / "eagle3-safeailab", d)
    return d


def eagle3_sd(d: Path) -> dict:
    return torch.load(d / "pytorch_model.bin", weights_only=True)


def eagle3_st(d: Path) -> Path:
    """The same draft as model.safetensors."""
    d.mkdir()
    shutil.copy(WORLD / "eagle3-safeailab" / "config.json", d / "config.json")
    save_file(torch.load(WORLD / "eagle3-safeailab" / "pytorch_model.bin", weights_only=True), str(d / "model.safetensors"))
    return d


def converted(d: Path) -> Path:
    """A specfmt folder (for validate / upgrade cases)."""
    from specfmt.convert import convert

    convert("eagle3", str(WORLD / "eagle3-safeailab"), d, str(VERIFIER))
    return d


def edit_config(d: Path, fn: Callable[[dict], None], name: str = "config.json") -> None:
    cfg = json.loads((d / name).read_text())
    fn(cfg)
    (d / name).write_text(json.dumps(cfg))


def edit_tensors(d: Path, fn: Callable[[dict], None]) -> None:
    sd = eagle3_sd(d)
    fn(sd)
    torch.save(sd, d / "pytorch_model.bin")


def edit_st_header(d: Path, fn: Callable[[dict], None]) -> None:
    raw = (d / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    fn(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


class Boom:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@dataclass
class Case:
    """A broken input: ``build(folder)`` makes it and returns the command line after ``specfmt``
    (``{src}``, ``{out}`` and ``{verifier}`` filled in); ``expect`` is part of the error line."""

    id: str
    base: Callable[[Path], Path]
    breaks: Callable[[Path, Path], None]
    expect: str
    command: str = "convert --from eagle3 {src} -o {out} --verifier {verifier}"
    exit_code: int = 2


def _symlink_out(name: str):
    def brk(d: Path, tmp: Path) -> None:
        outside = tmp / f"outside-{name}"
        shutil.move(str(d / name), outside)
        (d / name).symlink_to(outside)
    return brk


def _truncate(name: str, keep: float):
    def brk(d: Path, tmp: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: int(len(data) * keep)])
    return brk


def _set(path: str, value):
    def fn(cfg: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            cfg = cfg[p]
        cfg[last] = value
    return lambda d, tmp: edit_config(d, fn)


def _nan(name: str, value: float):
    def fn(sd: dict) -> None:
        sd[name].view(-1)[7] = value
    return lambda d, tmp: edit_tensors(d, fn)


def _sharded_index(weight_map_file: str):
    def brk(d: Path, tmp: Path) -> None:
        names = list(load_file(str(d / "model.safetensors")))
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: weight_map_file for n in names}}))
    return brk


def _pkl_code(d: Path, tmp: Path) -> None:
    sd = eagle3_sd(d)
    sd["fc.weight"] = Boom(str(tmp / "MARKER"))
    torch.save(sd, d / "pytorch_model.bin")


CORPUS = [
    # pickles
    Case("pickle-runs-code", eagle3_bin, _pkl_code, "refused to load a pickle that is not plain tensors"),
    Case("pickle-truncated", eagle3_bin, _truncate("pytorch_model.bin", 0.5), "cannot read the pickle"),
    Case("pickle-empty", eagle3_bin, _truncate("pytorch_model.bin", 0.0), "cannot read the pickle"),
    Case("pickle-not-a-dict", eagle3_bin, lambda d, t: torch.save([torch.ones(2)], d / "pytorch_model.bin"), "not a flat state dict"),
    # safetensors
    Case("st-truncated", eagle3_st, _truncate("model.safetensors", 0.9), "not a valid safetensors file"),
    Case("st-empty", eagle3_st, _truncate("model.safetensors", 0.0), "shorter than the 8-byte header"),
    Case("st-header-past-end", eagle3_st, lambda d, t: (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),
         "runs past the end of the file"),
    Case("st-tensor-larger-than-file", eagle3_st,
         lambda d, t: edit_st_header(d, lambda h: h["fc.weight"].update(shape=[4096, 4096 * 64], data_offsets=[0, 4096 * 4096 * 64 * 2])),
         "declares bytes"),
    Case("st-header-not-json", eagle3_st, lambda d, t: (d / "model.safetensors").write_bytes(struct.pack("<Q", 8) + b"not json" + b"\0" * 64),
         "not a valid safetensors file"),
    Case("st-unknown-dtype", eagle3_st, lambda d, t: edit_st_header(d, lambda h: h["norm.weight"].update(dtype="X99")), "unsupported dtype X99"),
    Case("st-index-missing-shard", eagle3_st, _sharded_index("model-00002-of-00002.safetensors"), "names files that are not in the folder"),
    Case("st-index-escapes", eagle3_st, _sharded_index("../model.safetensors"), "names files that are not in the folder"),
    # config.json
    Case("config-missing", eagle3_bin, lambda d, t: (d / "config.json").unlink(), "config.json not found"),
    Case("config-invalid-json", eagle3_bin, lambda d, t: (d / "config.json").write_text('{"hidden_size": 128,'), "invalid JSON at line"),
    Case("config-not-object", eagle3_bin, lambda d, t: (d / "config.json").write_text("[1, 2]"), "expected a JSON object"),
    Case("config-not-utf8", eagle3_bin, lambda d, t: (d / "config.json").write_bytes(b'{"a": "\xff\xfe"}'), "not a UTF-8 text file"),
    Case("config-hidden-size-string", eagle3_bin, _set("hidden_size", "128"), "hidden_size"),
    Case("config-heads-zero", eagle3_bin, _set("num_attention_heads", 0), "num_attention_heads"),
    Case("config-vocab-negative", eagle3_bin, _set("vocab_size", -5), "vocab"),
    Case("config-draft-vocab-too-big", eagle3_bin, _set("draft_vocab_size", 10**9), "draft_vocab_size"),
    Case("config-shapes-disagree", eagle3_bin, _set("intermediate_size", 999), "wrong shape"),
    Case("config-taps-not-ints", eagle3_bin, _set("eagle_aux_hidden_state_layer_ids", "2,4,5"), "eagle_aux_hidden_state_layer_ids"),
    Case("config-tap-out-of-range", eagle3_bin, _set("eagle_aux_hidden_state_layer_ids", [2, 4, 99]), "99"),
    # tensors
    Case("tensor-nan", eagle3_bin, _nan("fc.weight", float("nan")), "NaN/Inf"),
    Case("tensor-inf", eagle3_bin, _nan("lm_head.weight", float("-inf")), "NaN/Inf"),
    Case("tensor-missing", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd.pop("norm.weight")), "missing: norm.weight"),
    Case("tensor-unknown", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd.update(extra=torch.ones(3))), "extra"),
    Case("d2t-outside-vocab", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd["d2t"].__setitem__(-1, 10**6)), "outside the verifier vocabulary"),
    Case("d2t-absolute-ids", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd.update(d2t=sd["d2t"] + torch.arange(len(sd["d2t"])))), "vocabulary map"),
    Case("d2t-float", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd.update(d2t=sd["d2t"].half())), "d2t"),
    Case("t2d-wrong-count", eagle3_bin, lambda d, t: edit_tensors(d, lambda sd: sd["t2d"].__setitem__(0, not bool(sd["t2d"][0]))), "t2d"),
    Case("no-weights", eagle3_bin, lambda d, t: (d / "pytorch_model.bin").unlink(), "no weight file"),
    # paths
    Case("symlink-weights-outside", eagle3_bin, _symlink_out("pytorch_model.bin"), "outside the checkpoint folder"),
    Case("symlink-config-outside", eagle3_bin, _symlink_out("config.json"), "outside the checkpoint folder"),
    Case("unknown-algorithm-flag", eagle3_bin, lambda d, t: None, "foo", command="convert --from foo {src} -o {out} --verifier {verifier}"),
    Case("bad-revision", eagle3_bin, lambda d, t: None, "not a valid revision",
         command="convert --from eagle3 {src} -o {out} --verifier {verifier} --revision ../../etc"),
    Case("bad-hub-id", eagle3_bin, lambda d, t: None, "neither an existing folder nor a valid Hub repo id",
         command="convert --from eagle3 bad..repo/x -o {out} --verifier {verifier}"),
    # specfmt folders: validate fails (exit 1), upgrade refuses (exit 2)
    Case("specfmt-unknown-algorithm", converted, _set("speculators_model_type", "foo"), "schema", command="validate {src}", exit_code=1),
    Case("specfmt-newer-version", converted, _set("speculators_version", "99.0.0"), "newer", command="validate {src}", exit_code=1),
    Case("specfmt-missing-config", converted, lambda d, t: (d / "config.json").unlink(), "config.json not found", command="validate {src}", exit_code=1),
    Case("specfmt-wrong-type-upgrade", converted, _set("norm_before_residual", "yes"), "norm_before_residual", command="upgrade {src} -o {out}"),
]


def test_the_corpus_has_at_least_30_cases():
    assert len(CORPUS) >= 30 and len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_broken_input_gives_one_line_and_leaves_nothing(case: Case, tmp_path: Path):
    src = case.base(tmp_path / "src")
    case.breaks(src, tmp_path)
    before = tree_digest(src) if src.is_dir() else {}
    out = tmp_path / "out"
    args = case.command.format(src=src, out=out, verifier=VERIFIER).split(" ")
    code, output = invoke(args)
    assert code == case.exit_code, output
    assert case.expect in output, output
    if code == 2:
        errors = [ln for ln in output.splitlines() if ln.startswith("specfmt: error:")]
        assert len(errors) == 1, output
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.specfmt")]
    assert (tree_digest(src) if src.is_dir() else {}) == before
    assert not (tmp_path / "MARKER").exists()  # the code in the hostile pickle never ran
