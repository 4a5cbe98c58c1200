"""The copy path of ``convert`` (issue 7): zip pickles indexed without torch, tensors copied byte
for byte with the NaN/Inf bit test, and torch left unimported where no tensor needs it.

Speed and memory are measured by ``benchmarks/convert_bench.py``, not here.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import WORLD, tree_digest

from specfmt.checkpoint import CheckpointReader
from specfmt.checkpoint.finite import NONFINITE_BITS, NonfiniteCounter
from specfmt.convert import convert
from specfmt.errors import ConversionError, InputError
from specfmt.checkpoint.torchzip import NotPlain, read_index


def state_dict() -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    sd = {
        "f16": base.half(), "bf16": base.bfloat16(), "f32": base, "f64": base.double()[:2],
        "i64": torch.arange(-5, 5), "bool": torch.rand(7, generator=g) > 0.5, "u8": torch.arange(9, dtype=torch.uint8),
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
    }
    shared = torch.randn(10, 4, generator=g).half()
    sd["view_rows"] = shared[3:7]  # a view with a storage offset: contiguous, still a plain range
    sd["view_t"] = shared[:4].t()  # transposed: not one range
    sd["param"] = torch.nn.Parameter(torch.randn(3, generator=g))
    return sd


def test_zip_index_matches_torch_load_byte_for_byte(tmp_path):
    sd = state_dict()
    torch.save(sd, tmp_path / "w.bin")
    refs = read_index(tmp_path / "w.bin")
    assert set(refs) == set(sd)
    raw = (tmp_path / "w.bin").read_bytes()
    for name, t in sd.items():
        t = t.detach()
        ref = refs[name]
        assert ref.shape == tuple(t.shape) and ref.stride == tuple(t.stride()), name
        assert ref.contiguous == t.is_contiguous(), name
        if ref.contiguous:
            assert raw[ref.offset: ref.offset + ref.nbytes] == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), name
    with CheckpointReader(tmp_path, pickle_names=["w.bin"]) as reader:
        for name, t in sd.items():
            assert torch.equal(reader.get(name), t.detach()), name  # views too, without torch.load
        assert reader.raw("view_t") is None and reader.raw("view_rows") is not None
    # an OrderedDict at the top (torch.save of a module's state_dict()) reads the same
    torch.save(torch.nn.Linear(4, 3).state_dict(), tmp_path / "m.bin")
    assert set(read_index(tmp_path / "m.bin")) == {"weight", "bias"}


class _Boom:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "x": _Boom(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(NotPlain, match="posix.system|os.system"):
        read_index(tmp_path / "pytorch_model.bin")
    with pytest.raises(InputError, match="refused to load a pickle that is not plain tensors"):
        CheckpointReader(tmp_path)
    assert not marker.exists()
    # a forged tuple shaped like a tensor is not a tensor either
    buf = pickle.dumps({"w": ("tensor", "0", 0, (2,), (1,))}, protocol=2)
    with zipfile.ZipFile(tmp_path / "forged.bin", "w") as z:
        z.writestr("forged/data.pkl", buf)
    with pytest.raises(NotPlain, match="not a flat dict"):
        read_index(tmp_path / "forged.bin")


@pytest.mark.parametrize("dtype,code", [(torch.float16, "F16"), (torch.bfloat16, "BF16"), (torch.float32, "F32"), (torch.float64, "F64"),
                                        (torch.float8_e5m2, "F8_E5M2"), (torch.float8_e4m3fn, "F8_E4M3")])
def test_the_bit_test_counts_exactly_what_isfinite_rejects(dtype, code):
    g = torch.Generator().manual_seed(1)
    t = (torch.randn(5000, generator=g) * 4).to(dtype)
    info = torch.finfo(dtype)
    t[:6] = torch.tensor([info.max, -info.max, info.tiny, -info.tiny, 0.0, -0.0], dtype=torch.float64).to(dtype)  # extremes stay finite
    t[6] = info.smallest_normal / 4  # a subnormal
    assert NonfiniteCounter(code)(memoryview(t.view(torch.uint8).numpy())) == 0
    idx = torch.randperm(5000, generator=g)[:37] + 0
    specials = [float("nan"), float("inf"), float("-inf")] if code != "F8_E4M3" else [float("nan")]
    for j, i in enumerate(idx.tolist()):
        t[i] = specials[j % len(specials)]
    want = int((~torch.isfinite(t.to(torch.float64))).sum())
    assert want == 37
    assert NonfiniteCounter(code)(memoryview(t.view(torch.uint8).numpy())) == want
    assert code in NONFINITE_BITS


def _eagle3_pickle_source(tmp_path: Path) -> Path:
    """The example EAGLE-3 draft as a fresh folder (its research layout, a zip pickle)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(WORLD / "eagle3-safeailab", src)
    return src


def test_a_nan_found_by_the_copy_stops_the_conversion_with_nothing_written(tmp_path):
    src = _eagle3_pickle_source(tmp_path)
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["fc.weight"][3, 5] = float("nan")
    sd["fc.weight"][0, 0] = float("inf")
    torch.save(sd, src / "pytorch_model.bin")
    before = tree_digest(src)
    with pytest.raises(ConversionError, match=r"tensor fc.weight has 2 NaN/Inf value\(s\)"):
        convert("eagle3", str(src), tmp_path / "out", str(WORLD / "verifier"))
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert tree_digest(src) == before


def test_non_contiguous_pickle_tensors_convert_through_torch(tmp_path):
    src = _eagle3_pickle_source(tmp_path)
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    w = sd["midlayer.mlp.down_proj.weight"]
    sd["midlayer.mlp.down_proj.weight"] = w.t().contiguous().t()  # same values, column-major strides
    torch.save(sd, src / "pytorch_model.bin")
    assert not read_index(src / "pytorch_model.bin")["midlayer.mlp.down_proj.weight"].contiguous
    convert("eagle3", str(src), tmp_path / "out", str(WORLD / "verifier"))
    from safetensors.torch import load_file

    out = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(out["layers.0.mlp.down_proj.weight"], w)
    assert all(torch.equal(out["layers.0." + k[len("midlayer."):]] if k.startswith("midlayer.") else out[k], v) for k, v in sd.items())


def _modules_after(code: str) -> set[str]:
    r = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_help_inspect_and_a_plain_conversion_never_import_torch(tmp_path):
    """What keeps start-up under 0.5 s and a conversion near copy speed: torch (about 1 s to
    import) is loaded only by what needs it -- casts, folds, legacy pickles, training, running."""
    run = "from typer.testing import CliRunner\nfrom specfmt.cli import app\nr = CliRunner().invoke(app, {args!r})\nassert r.exit_code == 0, r.output\n"
    assert "torch" not in _modules_after(run.format(args=["--help"]))
    assert "torch" not in _modules_after(run.format(args=["inspect", str(WORLD / "eagle3-safeailab")]))
    out = tmp_path / "out"
    mods = _modules_after(run.format(args=["convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(out), "--verifier", str(WORLD / "verifier")]))
    assert "torch" not in mods and (out / "model.safetensors").is_file()
    # a cast needs torch, and gets it
    mods = _modules_after(run.format(args=["convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(tmp_path / "f32"),
                                           "--verifier", str(WORLD / "verifier"), "--dtype", "float32"]))
    assert "torch" in mods
