"""One tensor stream (issue 24): a conversion plan and a draft in memory both become a
:class:`~specfmt.checkpoint.stream.TensorStream`, and writing (``convert``), loading
(``load_draft``) and saving a trained draft (``save_draft``) consume it: the same tensors, the
same checks, one safetensors writer."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import eagle1_config, eagle1_tensors, eagle3_config, eagle3_tensors, write_eagle1, write_safeailab
from specfmt.checkpoint.dtypes import ST_DTYPES
from specfmt.checkpoint.stream import OutTensor, Refusals, TensorStream, load_stream, write_stream
from specfmt.checkpoint.writer import save_file_order
from specfmt.convert import convert, load_draft, open_plan
from specfmt.converters import Options
from specfmt.draft import draft_stream, save_draft
from specfmt.errors import ConversionError

# --------------------------------------------------------------------------- sources


def eagle1_fold(folder: Path) -> tuple[Path, Options]:
    """EAGLE-1 with an ``fc.bias``: the q/k/v biases are derived (the fold), fp16."""
    return write_eagle1(folder), Options()


def eagle3_plain(folder: Path) -> tuple[Path, Options]:
    """EAGLE-3 in SafeAILab's layout: every tensor copied from its byte range, d2t/t2d checked together."""
    return write_safeailab(folder), Options()


def eagle3_cast(folder: Path) -> tuple[Path, Options]:
    """The same, cast to float32 (``--dtype``): every float tensor read and cast through torch."""
    return write_safeailab(folder), Options(dtype="float32")


def eagle3_d2t_int32(folder: Path) -> tuple[Path, Options]:
    """EAGLE-3 with an int32 ``d2t`` and no ``t2d``: both map tensors derived, then checked together."""
    folder.mkdir(parents=True)
    sd = eagle3_tensors()
    sd["d2t"] = sd["d2t"].to(torch.int32)
    del sd["t2d"]
    torch.save(sd, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(eagle3_config()))
    return folder, Options()


SOURCES = {"eagle": eagle1_fold, "eagle3": eagle3_plain}
CASES = [("eagle", eagle1_fold), ("eagle3", eagle3_plain), ("eagle3", eagle3_cast), ("eagle3", eagle3_d2t_int32)]


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def header_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file in header (= data) order."""
    raw = path.read_bytes()
    return [n for n in json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]) if n != "__metadata__"]


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    """Same names, dtypes, shapes and bytes (NaN-safe, exact)."""
    assert sorted(a) == sorted(b), what
    for n in a:
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, (what, n)
        assert _raw(a[n]) == _raw(b[n]), (what, n)


# --------------------------------------------------------------------------- the same tensors


@pytest.mark.parametrize("fmt,make", CASES, ids=[c[1].__name__ for c in CASES])
def test_writing_and_loading_a_plan_stream_give_the_same_tensors(tmp_path, verifier, fmt, make):
    src, opts = make(tmp_path / "src")
    with open_plan(fmt, str(src), str(verifier), opts=opts) as opened:
        plan, reader = opened.plan, opened.reader
        write_stream(tmp_path / "w.safetensors", plan.stream(reader))
        loaded = load_stream(plan.stream(reader))
    assert header_names(tmp_path / "w.safetensors") == [m.dst for m in plan.written] + [d.dst for d in plan.derived]  # file order
    assert_same_tensors(load_file(tmp_path / "w.safetensors"), loaded, "written vs loaded")
    assert plan.derived or fmt == "eagle3"  # the fold and the int32 d2t derive tensors


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_convert_load_draft_and_save_draft_agree(tmp_path, verifier, fmt):
    """``convert`` writes, ``load_draft`` loads, ``save_draft`` writes back what was loaded: the
    same tensors each time, and the saved file is byte for byte what safetensors' ``save_file`` makes."""
    src, _ = SOURCES[fmt](tmp_path / "src")
    convert(fmt, str(src), tmp_path / "out", str(verifier))
    draft = load_draft(str(src), source_format=fmt, verifier=str(verifier))
    converted = load_file(tmp_path / "out" / "model.safetensors")
    assert_same_tensors(converted, draft.tensors, "convert vs load_draft")
    save_draft(tmp_path / "saved", draft, train={"algorithm": draft.algorithm})
    saved = tmp_path / "saved" / "model.safetensors"
    assert_same_tensors(load_file(saved), draft.tensors, "save_draft vs load_draft")
    save_file(dict(draft.tensors), str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    assert saved.read_bytes() == (tmp_path / "lib.safetensors").read_bytes()


def test_the_writer_makes_the_file_save_file_makes_for_every_dtype(tmp_path):
    """Every dtype specfmt writes (float8 is read, never written), scalars and empty tensors included,
    in safetensors' own order."""
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, (code, (name, _)) in enumerate(sorted((c, v) for c, v in ST_DTYPES.items() if not c.startswith("F8"))):
        dtype = getattr(torch, name)
        base = torch.randn(3, 5, generator=g) * 4
        t = base > 0 if dtype == torch.bool else base.to(dtype)
        tensors[f"{chr(ord('z') - i)}.{code}"] = t
        tensors[f"a{i}.{code}.scalar"] = t[0, 0].clone()
        tensors[f"m{i}.{code}.empty"] = t[:0]
    layout = save_file_order([(n, code, tuple(t.shape)) for n, t in tensors.items() for code in [n.split(".")[1]]])
    stream = TensorStream([OutTensor(n, c, s, (lambda t=tensors[n]: t)) for n, c, s in layout], Refusals())
    write_stream(tmp_path / "ours.safetensors", stream)
    save_file(tensors, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "lib.safetensors").read_bytes()


def test_a_draft_in_memory_streams_in_save_file_order(tmp_path):
    """Whatever order the draft holds its tensors in (names and dtypes disagreeing here), its stream
    is in the order ``save_file`` writes, so ``save_draft`` makes the file ``save_file`` makes."""
    tensors = {"c.bool": torch.ones(2, dtype=torch.bool), "b.float": torch.zeros(3), "a.half": torch.zeros(2, dtype=torch.float16),
               "d.int": torch.arange(3)}
    save_file(tensors, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    stream = draft_stream({"speculators_model_type": "eagle3"}, tensors, Refusals())
    assert [t.name for t in stream.tensors] == header_names(tmp_path / "lib.safetensors") == ["d.int", "b.float", "a.half", "c.bool"]


# --------------------------------------------------------------------------- the same checks


class Recorded(Refusals):
    def __init__(self):
        self.seen: list[tuple] = []

    def nonfinite(self, tensor, count):
        self.seen.append(("nonfinite", tensor.name, count))

    def inconsistent(self, problems):
        self.seen.append(("inconsistent", tuple(problems)))


def test_a_copied_range_is_checked_on_its_bits_and_never_decoded_when_written(tmp_path):
    """The byte-range path: the NaN/Inf bit test counts what ``torch.isfinite`` rejects, the bytes
    land as they are, and ``compute`` is not called; loading the same stream computes it, with the same count."""
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t[1, 2], t[2, 3] = float("nan"), float("-inf")
    (tmp_path / "src.bin").write_bytes(b"\x00" * 24 + _raw(t))
    calls = []

    def compute():
        calls.append(1)
        return t.clone()

    item = OutTensor("w", "F32", (3, 4), compute, copy_from=(tmp_path / "src.bin", 24), shared=True)
    rec = Recorded()
    write_stream(tmp_path / "out.safetensors", TensorStream([item], rec))
    assert calls == [] and rec.seen == [("nonfinite", "w", 2)]
    assert _raw(load_file(tmp_path / "out.safetensors")["w"]) == _raw(t)
    rec2 = Recorded()
    loaded = load_stream(TensorStream([item], rec2))
    assert calls == [1] and rec2.seen == rec.seen and _raw(loaded["w"]) == _raw(t)


def test_tensors_checked_together_are_kept_as_they_pass_and_checked_once(tmp_path):
    ints = torch.arange(4, dtype=torch.int64)
    (tmp_path / "src.bin").write_bytes(_raw(ints))
    items = [OutTensor("f", "F32", (2,), lambda: torch.ones(2)),
             OutTensor("d2t", "I64", (4,), lambda: ints, copy_from=(tmp_path / "src.bin", 0), array=lambda: np.arange(4)),
             OutTensor("t2d", "BOOL", (3,), lambda: torch.tensor([True, False, True]))]
    for consume in (lambda s: write_stream(tmp_path / "o.safetensors", s), load_stream):
        got = []
        rec = Recorded()
        consume(TensorStream(items, rec, together=("d2t", "t2d", "absent"), check_together=lambda kept: got.append(kept) or ["bad map"]))
        assert len(got) == 1 and sorted(got[0]) == ["d2t", "t2d"]
        assert np.array_equal(np.asarray(got[0]["d2t"]), np.arange(4)) and np.asarray(got[0]["t2d"]).tolist() == [True, False, True]
        assert rec.seen == [("inconsistent", ("bad map",))]


def _overflowing_fold(src: Path) -> Path:
    """An EAGLE-1 checkpoint whose fc.bias fold overflows float16: the derived q_proj.bias is ±Inf."""
    sd = eagle1_tensors()
    sd["fc.bias"] = torch.full((64,), 3.0e4, dtype=torch.float16)
    sd["layers.0.self_attn.q_proj.weight"] = torch.full((64, 64), 0.5, dtype=torch.float16)
    src.mkdir()
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle1_config()))
    return src


def _nothing_left(tmp_path: Path, out: str) -> bool:
    return not (tmp_path / out).exists() and not list(tmp_path.glob(f".{out}.specfmt-*"))


def test_a_nan_in_a_derived_tensor_is_refused_by_all_three(tmp_path, verifier):
    src = _overflowing_fold(tmp_path / "src")
    with pytest.raises(ConversionError) as by_convert:
        convert("eagle", str(src), tmp_path / "out", str(verifier))
    assert _nothing_left(tmp_path, "out")
    with pytest.raises(ConversionError) as by_load:
        load_draft(str(src), source_format="eagle", verifier=str(verifier))
    line = by_convert.value.one_line()
    assert line == by_load.value.one_line()
    assert "derived tensor layers.0.self_attn.q_proj.bias" in line and "NaN/Inf value(s) after the cast" in line and "--dtype float32" in line
    # the same tensor of a draft in memory (as a trainer that diverged would leave it)
    good = load_draft(str(write_eagle1(tmp_path / "good")), source_format="eagle", verifier=str(verifier))
    good.tensors["layers.0.self_attn.q_proj.bias"][[0, 7]] = float("inf")
    with pytest.raises(RuntimeError, match=r"^the trained draft is not what its config implies: layers\.0\.self_attn\.q_proj\.bias has 2 NaN/Inf values$"):
        save_draft(tmp_path / "saved", good, train={"algorithm": "eagle"})
    assert _nothing_left(tmp_path, "saved")


def test_an_inconsistent_vocabulary_map_is_refused_by_all_three(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle3_tensors()
    first_unused = int((~sd["t2d"]).nonzero()[0])
    sd["t2d"][first_unused] = True  # t2d now marks 129 ids for 128 draft ids
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle3_config()))
    with pytest.raises(ConversionError) as by_convert:
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert _nothing_left(tmp_path, "out")
    with pytest.raises(ConversionError) as by_load:
        load_draft(str(src), source_format="eagle3", verifier=str(verifier))
    line = by_convert.value.one_line()
    assert line == by_load.value.one_line() and "the draft vocabulary map is inconsistent: t2d marks 129 target ids" in line
    good = load_draft(str(write_safeailab(tmp_path / "good")), source_format="eagle3", verifier=str(verifier))
    good.tensors["t2d"][first_unused] = True
    with pytest.raises(RuntimeError, match="t2d marks 129 target ids, but the draft vocabulary has 128"):
        save_draft(tmp_path / "saved", good, train={"algorithm": "eagle3"})
    assert _nothing_left(tmp_path, "saved")


def test_a_trained_draft_refusal_lists_every_problem_in_the_drafts_order(tmp_path, verifier):
    """A conversion stops at the first problem; a trained draft's refusal (a specfmt bug) lists them all:
    missing tensors, then NaN/Inf counts in the draft's own tensor order, then the map check."""
    draft = load_draft(str(write_safeailab(tmp_path / "src")), source_format="eagle3", verifier=str(verifier))
    names = list(draft.tensors)
    # the draft holds lm_head before the layer (the source's midlayer.* sorts after lm_head); the file the other way round
    assert names.index("lm_head.weight") < names.index("layers.0.mlp.down_proj.weight")
    draft.tensors["layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    draft.tensors["lm_head.weight"][:3, 0] = float("inf")
    draft.tensors["t2d"][:] = True
    del draft.tensors["norm.weight"]
    with pytest.raises(RuntimeError) as e:
        save_draft(tmp_path / "saved", draft, train={"algorithm": "eagle3"})
    assert str(e.value) == ("the trained draft is not what its config implies: missing: norm.weight; lm_head.weight has 3 NaN/Inf values; "
                            "layers.0.mlp.down_proj.weight has 1 NaN/Inf values; t2d marks 256 target ids, but the draft vocabulary has 128")
    assert _nothing_left(tmp_path, "saved")
