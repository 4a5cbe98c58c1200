"""``specfmt push`` against a local stand-in for the Hub (``fakehub.FakeHub``), through the real
huggingface_hub client: the CLI runs in a subprocess with ``HF_ENDPOINT`` pointing at the server.

Covered: a push round-trips byte-identical (``snapshot_download``), the card parses with
``ModelCard`` and names the verifier as ``base_model``; the plan (dry run, validation, card
kept or replaced, a local verifier path); the Hub's errors (401, 403, missing repo, 5xx then
success, a connection dropped mid-upload), each one line with no commit made and the token
never printed; and convert / validate / inspect / upgrade reading Hub ids from the cache offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLI_IMPORTS, WORLD, tree_digest
from fakehub import FakeHub
from target_env import warm_run

TOKEN = "hf_specfmtTestSecretToken0123456789"
VERIFIER_ID = "meta/tiny-verifier"


def run_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    """``specfmt ARGS`` with ``env`` (the fake Hub's), a fork of a warm interpreter started with that environment
    (``target_env.warm_run``, as ``conftest.run_cli``: an environment's first command in a new interpreter when another
    has one already)."""
    return warm_run(f"specfmt-cli {env['HF_ENDPOINT']} {env['HF_HOME']}", CLI_IMPORTS, ["-m", "specfmt", *args], env, timeout=300)


def download(env: dict, repo_id: str, revision: str | None = None) -> Path:
    """huggingface_hub's own snapshot_download, in a subprocess with the same environment."""
    code = "import sys; from huggingface_hub import snapshot_download as s; print(s(sys.argv[1], revision=sys.argv[2] or None))"
    r = subprocess.run([sys.executable, "-c", code, repo_id, revision or ""], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip().splitlines()[-1])


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The CLI's error line; asserts exit 2, no traceback and no token in anything printed."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert TOKEN not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("specfmt: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def hub():
    with FakeHub(tokens={TOKEN: "me"}) as h:
        h.seed(VERIFIER_ID, {p.name: p.read_bytes() for p in (WORLD / "verifier").iterdir() if p.is_file()})
        yield h


@pytest.fixture(scope="module")
def env(hub, tmp_path_factory) -> dict:
    """The CLI's environment: the fake Hub, LFS uploads (no Xet), online, a private cache, the token."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**e, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0", "HF_TOKEN": TOKEN,
            "HF_HOME": str(tmp_path_factory.mktemp("hf-home")), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@pytest.fixture(scope="module")
def draft(env, tmp_path_factory) -> Path:
    """The example EAGLE-3 draft converted against the verifier's Hub id, with a reference-only validation.json."""
    out = tmp_path_factory.mktemp("draft") / "eagle3"
    r = run_cli(env, "convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(out), "--verifier", VERIFIER_ID)
    assert r.returncode == 0, r.stderr
    prompts = out.parent / "prompts.jsonl"
    prompts.write_text("".join((WORLD / "prompts.jsonl").read_text().splitlines(keepends=True)[:4]))
    r = run_cli(env, "validate", str(out), "--run", "--no-vllm", "--prompts", str(prompts), "--max-tokens", "8")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture(autouse=True)
def injected_failures_all_happen(hub):
    """Every failure a test injects must have been met by a request (else the test proved nothing)."""
    yield
    left, hub.failures[:] = list(hub.failures), []
    assert not left, f"injected failures never triggered: {left}"


def copy(draft: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(draft, dst)
    return dst


# --------------------------------------------------------------------------- round trip and card


def test_push_round_trips_byte_identical_and_the_card_names_the_verifier(hub, env, draft):
    from huggingface_hub import ModelCard

    before = tree_digest(draft)
    r = run_cli(env, "push", str(draft), "--repo-id", "me/eagle3-draft", "--license", "apache-2.0")
    assert r.returncode == 0, r.stderr
    assert TOKEN not in r.stdout + r.stderr
    from specfmt.serving import GPU_BUILD, LAUNCHERS, installed_distribution

    launcher = " ".join(LAUNCHERS[(installed_distribution() or (GPU_BUILD,))[0]])  # the CPU build's line is its module's
    assert "pushed 4 files" in r.stdout and f"{launcher} me/eagle3-draft" in r.stdout
    assert tree_digest(draft) == before  # the folder is never modified
    got = download(env, "me/eagle3-draft")
    for p in draft.iterdir():
        assert (got / p.name).read_bytes() == p.read_bytes(), p.name
    assert sorted(p.name for p in got.iterdir()) == sorted([".gitattributes", "README.md", *(p.name for p in draft.iterdir())])
    repo = hub.repos["me/eagle3-draft"]
    assert repo.history() == [f"Upload EAGLE-3 draft for {VERIFIER_ID} (specfmt 0.1.0)", "initial commit"]  # one commit
    assert repo.files()["model.safetensors"][0] == "lfs"

    card = ModelCard.load(got / "README.md")
    assert card.data.base_model == VERIFIER_ID
    assert (card.data.library_name, card.data.pipeline_tag, card.data.license) == ("vllm", "text-generation", "apache-2.0")
    assert set(card.data.tags) == {"speculative-decoding", "eagle3", "speculators", "specfmt"}
    figures = json.loads((draft / "validation.json").read_text())["reference"]
    assert "```bash\nvllm serve me/eagle3-draft\n```" in card.text
    assert f"| **mean acceptance length** | **{figures['mean_acceptance_length']:.3f}** |" in card.text
    rates = figures["acceptance_rate_per_position"]
    assert f"| acceptance rate, position 3 | {rates[2]:.3f} |" in card.text
    assert "| tap layers (`eagle_aux_hidden_state_layer_ids`) | 2, 4, 5 |" in card.text
    prov = json.loads((draft / "config.json").read_text())["specfmt"]["source"]
    assert prov["files"]["pytorch_model.bin"] in card.text and "`--from eagle3`, safeailab layout" in card.text
    assert str(WORLD) not in card.text  # a local source path is named by its folder name only

    # the same push again: nothing changed, no second commit
    r = run_cli(env, "push", str(draft), "--repo-id", "me/eagle3-draft", "--license", "apache-2.0")
    assert r.returncode == 0 and "nothing committed" in r.stdout, r.stdout + r.stderr
    assert len(repo.history()) == 2


def test_dry_run_prints_the_plan_and_uploads_nothing_without_a_token(hub, env, draft):
    n = len(hub.log)
    r = run_cli({**env, "HF_TOKEN": ""}, "push", str(draft), "--repo-id", "me/dry", "--dry-run")
    assert r.returncode == 0, r.stderr
    for name in ("config.json", "model.safetensors", "validation.json", "README.md", "generated model card", "base_model: meta/tiny-verifier",
                 "me/dry does not exist", "dry run: nothing uploaded"):
        assert name in r.stdout, name
    assert "me/dry" not in hub.repos
    assert all(m in ("GET", "HEAD") for m, _ in hub.log[n:])  # read-only


def test_an_own_readme_is_kept_unless_overwrite_card(hub, env, draft, tmp_path):
    d = copy(draft, tmp_path)
    (d / "README.md").write_text("---\nlicense: mit\n---\n# my own card\n")
    assert run_cli(env, "push", str(d), "--repo-id", "me/own-card").returncode == 0
    assert hub.repos["me/own-card"].files()["README.md"] == b"---\nlicense: mit\n---\n# my own card\n"
    r = run_cli(env, "push", str(d), "--repo-id", "me/own-card", "--overwrite-card")
    assert r.returncode == 0, r.stderr
    card = hub.repos["me/own-card"].files()["README.md"].decode()
    assert "base_model: meta/tiny-verifier" in card and "my own card" not in card
    assert (d / "README.md").read_text().endswith("# my own card\n")  # the folder keeps its own


def test_a_local_verifier_path_needs_its_hub_id(hub, env, tmp_path):
    out = tmp_path / "local"
    assert run_cli(env, "convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(out), "--verifier", str(WORLD / "verifier")).returncode == 0
    line = one_error_line(run_cli(env, "push", str(out), "--repo-id", "me/local"))
    assert "names the verifier by a local path" in line and "--verifier-id" in line
    before = tree_digest(out)
    r = run_cli(env, "push", str(out), "--repo-id", "me/local", "--verifier-id", VERIFIER_ID)
    assert r.returncode == 0, r.stderr
    files = hub.repos["me/local"].files()
    assert json.loads(files["config.json"])["speculators_config"]["verifier"]["name_or_path"] == VERIFIER_ID
    assert "base_model: meta/tiny-verifier" in files["README.md"].decode()
    assert tree_digest(out) == before
    line = one_error_line(run_cli(env, "push", str(out), "--repo-id", "me/local", "--verifier-id", "meta/other-model"))
    assert "meta/other-model" in line  # the verifier check against the Hub id fails (no such repo)


def test_validation_failures_refuse_the_push_unless_no_validate(hub, env, draft, tmp_path):
    d = copy(draft, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["norm_before_residual"] = "no"
    (d / "config.json").write_text(json.dumps(cfg))
    n = len(hub.log)
    line = one_error_line(run_cli(env, "push", str(d), "--repo-id", "me/broken"))
    assert "fails static validation: schema" in line and "norm_before_residual" in line and "--no-validate" in line
    assert not any(m == "POST" for m, _ in hub.log[n:]) and "me/broken" not in hub.repos
    r = run_cli(env, "push", str(d), "--repo-id", "me/broken", "--no-validate")
    assert r.returncode == 0 and "warning: --no-validate" in r.stderr, r.stderr
    # validation.json measured other files: its figures stay out of the card
    assert "No acceptance figures" in hub.repos["me/broken"].files()["README.md"].decode()


def test_a_stale_or_failed_validation_json_refuses_the_push(env, draft, tmp_path):
    d = copy(draft, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 2
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    line = one_error_line(run_cli(env, "push", str(d), "--repo-id", "me/stale"))
    assert "validation.json was measured on other files (config.json differ)" in line
    d2 = copy(draft, tmp_path / "b")
    v = json.loads((d2 / "validation.json").read_text())
    (d2 / "validation.json").write_text(json.dumps({**v, "passed": False, "likely_causes": ["tap ids"]}))
    line = one_error_line(run_cli(env, "push", str(d2), "--repo-id", "me/stale"))
    assert "records a failed run (likely causes: tap ids)" in line


def test_malformed_repo_ids_and_revisions_are_refused_before_any_request(hub, env, draft):
    n = len(hub.log)
    for args, words in ((["--repo-id", "no-owner"], "not OWNER/NAME"), (["--repo-id", "me/bad..name"], "not a valid Hub repo id"),
                        (["--repo-id", "me/ok", "--revision", "../main"], "not a valid revision"),
                        (["--repo-id", "me/ok", "--revision", "a b"], "not a valid revision")):
        assert words in one_error_line(run_cli(env, "push", str(draft), *args))
    assert hub.log[n:] == []


def test_branches_pull_requests_and_private_repos(hub, env, draft, tmp_path):
    assert run_cli(env, "push", str(draft), "--repo-id", "me/branchy", "--private").returncode == 0
    repo = hub.repos["me/branchy"]
    assert repo.private
    main = repo.refs["main"]
    d = copy(draft, tmp_path)
    (d / "README.md").write_text("---\ntags: [v2]\n---\nbranch card\n")
    r = run_cli(env, "push", str(d), "--repo-id", "me/branchy", "--revision", "v2", "-m", "second home")
    assert r.returncode == 0 and "created branch v2" in r.stderr, r.stderr
    assert repo.refs["main"] == main and repo.history("v2")[0] == "second home"
    (d / "README.md").write_text("---\ntags: [x]\n---\nnew card\n")
    r = run_cli(env, "push", str(d), "--repo-id", "me/branchy", "--create-pr")
    assert r.returncode == 0 and "opened a pull request" in r.stdout, r.stderr
    assert repo.refs["main"] == main and repo.files("refs/pr/1")["README.md"] == b"---\ntags: [x]\n---\nnew card\n"
    assert download(env, "me/branchy", "v2").joinpath("model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()
    # a public repo is never filled under --private
    hub.seed("me/public", {"notes.txt": b"x"})
    assert "exists and is public" in one_error_line(run_cli(env, "push", str(draft), "--repo-id", "me/public", "--private"))
    assert hub.repos["me/public"].history() == ["seed", "initial commit"]


def test_a_push_deletes_remote_weight_files_the_folder_no_longer_has(hub, env, draft):
    hub.seed("me/resharded", {"model-00001-of-00002.safetensors": b"old", "model.safetensors.index.json": b"{}", "notes.txt": b"keep"})
    r = run_cli(env, "push", str(draft), "--repo-id", "me/resharded")
    assert r.returncode == 0, r.stderr
    files = hub.repos["me/resharded"].files()
    assert "model-00001-of-00002.safetensors" not in files and "model.safetensors.index.json" not in files
    assert files["notes.txt"] == b"keep" and "model.safetensors" in files
    assert len(hub.repos["me/resharded"].history()) == 3  # initial, seed, one push


# --------------------------------------------------------------------------- the Hub's errors


def test_401_a_rejected_token(hub, env, draft):
    line = one_error_line(run_cli({**env, "HF_TOKEN": "hf_wrongToken"}, "push", str(draft), "--repo-id", "me/e401"))
    assert "rejected the token (401 Unauthorized)" in line and "hf auth login" in line
    assert "hf_wrongToken" not in line and "me/e401" not in hub.repos


def test_no_token_at_all(env, draft):
    line = one_error_line(run_cli({**env, "HF_TOKEN": ""}, "push", str(draft), "--repo-id", "me/none"))
    assert "no Hugging Face token" in line


def test_403_no_write_access(hub, env, draft):
    line = one_error_line(run_cli(env, "push", str(draft), "--repo-id", "someone-else/draft"))
    assert "may not write to someone-else/draft (403 Forbidden" in line and "someone-else/draft" not in hub.repos
    hub.seed("meta/their-draft", {"notes.txt": b"theirs"})
    line = one_error_line(run_cli(env, "push", str(draft), "--repo-id", "meta/their-draft"))
    assert "may not write to meta/their-draft (403" in line
    assert hub.repos["meta/their-draft"].history() == ["seed", "initial commit"]


def test_missing_repo(hub, env, draft):
    line = one_error_line(run_cli(env, "push", str(draft), "--repo-id", "me/absent", "--create-pr"))
    assert "me/absent does not exist, so no pull request can be opened" in line and "me/absent" not in hub.repos
    # the repo vanishes between creation and the commit (404 on the commit)
    hub.fail("POST", "/api/models/me/vanishing/commit/", 404)
    line = one_error_line(run_cli(env, "push", str(draft), "--repo-id", "me/vanishing"))
    assert "me/vanishing does not exist, or the token cannot see it (404)" in line
    assert hub.repos["me/vanishing"].history() == ["initial commit"]


def test_5xx_then_success_gives_one_commit(hub, env, draft):
    hub.fail("POST", "/api/models/me/flaky/commit/", 503)
    hub.fail("POST", "/me/flaky.git/info/lfs/objects/batch", 500)
    r = run_cli(env, "push", str(draft), "--repo-id", "me/flaky")
    assert r.returncode == 0, r.stderr
    assert "retrying" in r.stderr and hub.requests("POST", "/api/models/me/flaky/commit/") == 2
    assert len(hub.repos["me/flaky"].history()) == 2
    assert download(env, "me/flaky").joinpath("model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()


def test_a_connection_dropped_mid_upload(hub, env, draft, tmp_path):
    # once, during the LFS upload of weights the Hub does not have yet: huggingface_hub retries it
    from safetensors.torch import load_file, save_file

    d = copy(draft, tmp_path)
    (d / "validation.json").unlink()
    tensors = load_file(d / "model.safetensors")
    tensors["norm.weight"] = tensors["norm.weight"] * 2
    save_file(tensors, d / "model.safetensors")
    hub.fail("PUT", "/lfs/", None)
    r = run_cli(env, "push", str(d), "--repo-id", "me/dropped-once")
    assert r.returncode == 0, r.stderr
    assert hub.requests("PUT", "/lfs/") >= 2 and len(hub.repos["me/dropped-once"].history()) == 2
    # every time, while the commit is sent: one line, no commit; the next run works
    hub.fail("POST", "/api/models/me/dropped/commit/", None, times=3)
    line = one_error_line(run_cli(env, "push", str(draft), "--repo-id", "me/dropped"))
    assert "connection to the Hub dropped while uploading the commit after 3 attempts" in line and "no commit was made (main is still at" in line
    assert hub.repos["me/dropped"].history() == ["initial commit"]
    assert run_cli(env, "push", str(draft), "--repo-id", "me/dropped").returncode == 0
    assert len(hub.repos["me/dropped"].history()) == 2


# --------------------------------------------------------------------------- Hub ids offline, from the cache


def test_hub_ids_work_offline_from_the_cache(hub, env, draft, tmp_path):
    """convert, validate, inspect and upgrade take Hub ids; once cached they need no network,
    with HF_HUB_OFFLINE=1 and with the Hub unreachable."""
    import torch
    from safetensors.torch import load_file

    assert run_cli(env, "push", str(draft), "--repo-id", "me/cached").returncode == 0
    # fill the cache online: the commands themselves download what they read
    assert run_cli(env, "inspect", "me/cached").returncode == 0
    assert run_cli(env, "validate", "me/cached").returncode == 0
    assert run_cli(env, "upgrade", "me/cached", "-o", str(tmp_path / "warm")).returncode == 0
    dead = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    for label, e in (("HF_HUB_OFFLINE=1", {**env, "HF_HUB_OFFLINE": "1"}), ("unreachable", dead)):
        r = run_cli(e, "inspect", "me/cached")
        assert r.returncode == 0 and "specfmt" in r.stdout, (label, r.stderr)
        r = run_cli(e, "validate", "me/cached")
        assert r.returncode == 0 and "matches meta/tiny-verifier" in r.stdout, (label, r.stdout, r.stderr)
        out = tmp_path / label / "converted"
        r = run_cli(e, "convert", "--from", "speculators", "me/cached", "-o", str(out), "--verifier", VERIFIER_ID)
        assert r.returncode == 0, (label, r.stderr)
        got, want = load_file(out / "model.safetensors"), load_file(draft / "model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        r = run_cli(e, "upgrade", "me/cached", "-o", str(tmp_path / label / "upgraded"))
        assert r.returncode == 0, (label, r.stderr)
        # something never cached fails with one line, not a traceback
        line = one_error_line(run_cli(e, "inspect", "me/never-pushed"))
        assert "not in the local Hugging Face cache" in line or "could not fetch" in line, line


@pytest.mark.parametrize("fmt,src,row", [("medusa", "medusa-legacy", "| Medusa heads | 3, 1 residual block(s) each |"),
                                         ("eagle", "eagle-safeailab", "| decoder layers | 1 (hidden size 128, 4 attention heads) |")])
def test_cards_of_eagle1_and_medusa_drafts(tmp_path, fmt, src, row):
    """The plan alone (no network with validate=False): the card parses and describes the draft."""
    from huggingface_hub import ModelCard

    from specfmt.convert import convert
    from specfmt.hub.push import plan_push

    convert(fmt, str(WORLD / src), tmp_path / "out", str(WORLD / "verifier"))
    plan = plan_push(tmp_path / "out", "me/x", verifier_id=VERIFIER_ID, validate=False)
    card = ModelCard(plan.card)
    assert card.data.base_model == VERIFIER_ID and fmt in card.data.tags
    assert row in card.text and f"(`--from {fmt}`" in card.text
    assert json.loads(next(f.content for f in plan.files if f.path_in_repo == "config.json"))["speculators_config"]["verifier"]["name_or_path"] == VERIFIER_ID
    assert plan.notes[0].startswith("--no-validate")
