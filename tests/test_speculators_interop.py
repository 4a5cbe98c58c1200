"""specfmt and speculators 0.9.0 (the real package, in its own virtual environment), both ways.

* A specfmt EAGLE-3 output loads with speculators' ``SpeculatorModel.from_pretrained``, every
  parameter equal to the file's tensor of the same name, and our provenance block survives
  speculators' ``save_pretrained``: users continue training in speculators from our output.
* speculators cannot load specfmt's EAGLE-1 and Medusa outputs (it has no such classes); the
  docs (docs/serving.md) and the model card say so.
* A checkpoint written by speculators' own converter (``speculators convert --algorithm eagle3``:
  tap layers null) fails ``specfmt validate`` with a hint naming ``specfmt upgrade``, and the
  upgrade, its changes printed, gives a checkpoint that validates and equals ``specfmt convert``'s
  config apart from provenance.

speculators' metadata asks for torchvision and torchaudio (and would pull a CUDA torch), so the
venv reuses the system's torch and installs speculators and the pure-Python packages it imports
with ``--no-deps``, pinned (:data:`PACKAGES`); it is cached in ``~/.cache/specfmt`` between runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WORLD, run_cli
from specfmt.convert import convert

VERIFIER = str((WORLD / "verifier").resolve())
#: speculators 0.9.0 and what ``import speculators`` needs beyond this project's own dependencies
#: (found by importing until nothing was missing: speculators/train/data.py imports datasets and hs_connectors)
PACKAGES = ["speculators==0.9.0", "hs-connectors==0.9.0", "datasets==5.1.0", "multiprocess==0.70.19", "pandas==3.1.1",
            "pyarrow==26.0.1", "xxhash==4.1.0"]


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """A venv's python with speculators 0.9.0 beside the system's torch and transformers."""
    root = Path(os.environ.get("SPECFMT_SPECULATORS_VENV") or Path.home() / ".cache" / "specfmt" / "speculators-0.9.0")
    py = root / "bin" / "python"
    if not (root / ".complete").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(root)], check=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *PACKAGES], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        (root / ".complete").write_text("\n".join(PACKAGES) + "\n")
    r = subprocess.run([str(py), "-c", "import torch, speculators; print(torch.__version__)"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return py


def in_speculators(python: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code, *map(str, args)], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


LOAD = """
import json, sys, torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
out, resave = sys.argv[1], sys.argv[2]
model = SpeculatorModel.from_pretrained(out)
sd, ft = model.state_dict(), load_file(out + "/model.safetensors")
report = {"class": type(model).__name__, "file": sorted(ft), "missing": sorted(set(ft) - set(sd)),
          "unequal": sorted(k for k in ft if k in sd and not (sd[k].dtype == ft[k].dtype and torch.equal(sd[k], ft[k]))),
          "provenance": getattr(model.config, "specfmt", None) is not None}
model.save_pretrained(resave)
report["resaved_provenance"] = json.load(open(resave + "/config.json")).get("specfmt")
print("REPORT " + json.dumps(report))
"""


def _report(r: subprocess.CompletedProcess) -> dict:
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    return json.loads(line[len("REPORT "):])


def test_speculators_loads_a_specfmt_eagle3_output_with_every_tensor_equal(python, tmp_path):
    out = tmp_path / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, VERIFIER)
    rep = _report(in_speculators(python, LOAD, out, tmp_path / "resaved"))
    assert rep["class"] == "Eagle3DraftModel" and len(rep["file"]) == 15
    assert rep["missing"] == [] and rep["unequal"] == []  # every file tensor is a model parameter of the same name and value
    ours = json.loads((out / "config.json").read_text())["specfmt"]
    assert rep["provenance"] and rep["resaved_provenance"] == ours  # kept through speculators' save_pretrained


@pytest.mark.parametrize("fmt,name", [("eagle", "eagle-safeailab"), ("medusa", "medusa-legacy")])
def test_speculators_cannot_load_eagle1_and_medusa_outputs(python, tmp_path, fmt, name):
    out = tmp_path / fmt
    convert(fmt, str(WORLD / name), out, VERIFIER)
    r = in_speculators(python, "import sys\nfrom speculators import SpeculatorModel\nSpeculatorModel.from_pretrained(sys.argv[1])", out)
    assert r.returncode != 0 and f"Input tag '{fmt}' found using 'speculators_model_type' does not match any of the expected tags" in r.stderr


def test_speculators_converter_output_is_pointed_at_upgrade_and_upgraded_exactly(python, tmp_path):
    theirs = tmp_path / "theirs"
    r = subprocess.run([str(python.parent / "speculators"), "convert", str(WORLD / "eagle3-safeailab"), "--algorithm", "eagle3",
                        "--verifier", VERIFIER, "--output-path", str(theirs)], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((theirs / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] is None  # speculators' default
    v = run_cli("validate", theirs, "--json")
    checks = {c["name"]: c for c in json.loads(v.stdout)["checks"]}
    assert v.returncode == 1 and checks["schema"]["status"] == "fail" and "`specfmt upgrade` rewrites it" in checks["schema"]["summary"]
    assert "$.eagle_aux_hidden_state_layer_ids: None is not of type 'array'" in checks["schema"]["details"]
    assert any(d.startswith("written by speculators 0.9.0, not by specfmt: `specfmt upgrade ") for d in checks["schema"]["details"])
    assert [c["name"] for c in json.loads(v.stdout)["checks"]].count("finite") == 1
    up = run_cli("upgrade", theirs, "-o", tmp_path / "upgraded", "--verifier", VERIFIER)
    assert up.returncode == 0, up.stderr
    assert "~ $.eagle_aux_hidden_state_layer_ids: null -> [2, 4, 5]" in up.stdout and "~ $.architectures: " in up.stdout
    assert run_cli("validate", tmp_path / "upgraded").returncode == 0
    convert("eagle3", str(WORLD / "eagle3-safeailab"), tmp_path / "ours", VERIFIER)
    strip = lambda p: {k: v for k, v in json.loads((p / "config.json").read_text()).items() if k != "specfmt"}  # noqa: E731
    assert strip(tmp_path / "upgraded") == strip(tmp_path / "ours")
