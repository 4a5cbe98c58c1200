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

speculators runs in the shared env of ``tests/speculators_env.py``: speculators 0.9.0 and what it
imports, pinned, beside this interpreter's own torch and transformers (venv or not), built once,
checked every session and rebuilt when half-made (``tests/target_env.py``; its two tests are here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib.util import find_spec

import pytest

from conftest import WORLD, run_cli
from specfmt.convert import convert
from speculators_env import spec_env  # noqa: F401  (fixture)
from target_env import MARKER, TargetEnv, running_interpreter_files

VERIFIER = str((WORLD / "verifier").resolve())


def in_speculators(env: TargetEnv, code: str, *args) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` in the speculators env, offline."""
    return env.run("-c", code, *args)


FILES = "import json, torch, transformers, speculators; print(json.dumps({m.__name__: m.__file__ for m in (torch, transformers, speculators)}))"


def test_the_env_runs_speculators_on_this_interpreters_torch_and_transformers(spec_env):
    """Whether this interpreter is a venv or not: the env's torch and transformers are this
    interpreter's (a nested ``venv --system-site-packages`` gave the base Python's, or none)."""
    r = spec_env.run("-c", FILES)
    assert r.returncode == 0, r.stderr[-2000:]
    files = json.loads(r.stdout.strip().splitlines()[-1])
    ours = running_interpreter_files()
    assert {m: os.path.realpath(files[m]) for m in ours} == {m: os.path.realpath(f) for m, f in ours.items()}
    assert os.path.realpath(files["speculators"]).startswith(os.path.realpath(spec_env.root) + os.sep)
    assert json.loads((spec_env.root / MARKER).read_text())["packages"] == list(spec_env.packages)


def test_a_half_made_env_is_rebuilt_never_reused(tmp_path):
    """The marker is written last and holds the package list: a folder without it (killed while
    installing), with another list, or whose import check fails is built again; a complete one is
    reused; a build that fails its check leaves nothing marked."""
    # a small package this interpreter does not have (xxhash was one until `datasets`, the datagen extra, brought it):
    # with it importable from site-packages, an env that lost its own copy would pass its import check
    assert find_spec("tinydb") is None, "the test needs a package the running interpreter lacks: pick another"
    env = TargetEnv(tmp_path / "env", ("tinydb==4.8.2",), "import tinydb")
    sentinel = env.root / "sentinel"

    def rebuilt() -> bool:
        was = sentinel.exists()
        env.ensure()
        assert env.usable() and env.run("-c", "import tinydb; print(tinydb.__file__)").stdout.startswith(str(env.root))
        return was and not sentinel.exists()

    env.ensure()
    sentinel.touch()
    assert not rebuilt()  # complete and working: reused
    sentinel.touch()
    (env.root / MARKER).unlink()  # half-made: no marker
    assert rebuilt()
    sentinel.touch()
    (env.root / MARKER).write_text(TargetEnv(env.root, ("tinydb==4.8.0",), env.check).marker())  # another package list
    assert rebuilt()
    sentinel.touch()
    shutil.rmtree(env.root / "tinydb")  # marked, but the import fails
    assert rebuilt()

    broken = TargetEnv(tmp_path / "broken", ("tinydb==4.8.2",), "import tinydb, no_such_module_here")
    with pytest.raises(RuntimeError, match="No module named 'no_such_module_here'"):
        broken.ensure()
    assert not broken.root.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["env"]


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


def test_speculators_loads_a_specfmt_eagle3_output_with_every_tensor_equal(spec_env, tmp_path):
    out = tmp_path / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, VERIFIER)
    rep = _report(in_speculators(spec_env, LOAD, out, tmp_path / "resaved"))
    assert rep["class"] == "Eagle3DraftModel" and len(rep["file"]) == 15
    assert rep["missing"] == [] and rep["unequal"] == []  # every file tensor is a model parameter of the same name and value
    ours = json.loads((out / "config.json").read_text())["specfmt"]
    assert rep["provenance"] and rep["resaved_provenance"] == ours  # kept through speculators' save_pretrained


@pytest.mark.parametrize("fmt,name", [("eagle", "eagle-safeailab"), ("medusa", "medusa-legacy")])
def test_speculators_cannot_load_eagle1_and_medusa_outputs(spec_env, tmp_path, fmt, name):
    out = tmp_path / fmt
    convert(fmt, str(WORLD / name), out, VERIFIER)
    r = in_speculators(spec_env, "import sys\nfrom speculators import SpeculatorModel\nSpeculatorModel.from_pretrained(sys.argv[1])", out)
    assert r.returncode != 0 and f"Input tag '{fmt}' found using 'speculators_model_type' does not match any of the expected tags" in r.stderr


def test_speculators_converter_output_is_pointed_at_upgrade_and_upgraded_exactly(spec_env, tmp_path):
    theirs = tmp_path / "theirs"
    r = spec_env.run("-m", "speculators", "convert", WORLD / "eagle3-safeailab", "--algorithm", "eagle3", "--verifier", VERIFIER,
                     "--output-path", theirs)
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
