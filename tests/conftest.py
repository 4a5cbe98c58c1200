import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# No test may reach the Hub: offline mode and an empty private cache. Set before
# anything imports huggingface_hub, which reads these once at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="specfmt-test-hf-")
os.environ.pop("HF_HUB_CACHE", None)

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under a folder, to prove inputs are never modified."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def load_out(folder: Path) -> tuple[dict, dict]:
    """A written specfmt folder: ``(config.json, {name: tensor})``."""
    from safetensors.torch import load_file

    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``specfmt ARGS`` in a child process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "specfmt", *map(str, args)], capture_output=True, text=True, env={**os.environ, **(env or {})})


def assert_served(run, alone, out: Path, method: str, tokens: int):
    """vLLM served OUT exactly: the method it attached, greedy tokens equal to the verifier alone (speculative
    decoding is lossless), and drafts of k tokens from every position."""
    assert run.speculative_method == method
    assert alone.speculative_method is None and alone.num_drafts == 0
    assert run.token_ids == alone.token_ids  # speculative decoding is exact
    assert all(len(t) == tokens for t in run.token_ids)
    k = json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert run.num_drafts > 0 and run.num_draft_tokens == k * run.num_drafts
    assert len(run.accepted_per_position) == k
    return run


def assert_figures(got: dict, want: dict, where: str = "") -> None:
    """Every recorded figure is in ``got`` and equal to it. A key missing from ``got`` fails (a comparison
    over the keys both sides have would drop it from both)."""
    missing = sorted(set(want) - set(got))
    assert not missing, f"{where}: no {', '.join(missing)} among the figures {sorted(got)}"
    assert {key: got[key] for key in want} == want, where


WORLD = REPO / "examples" / "world"
#: prompts and length of the vLLM end-to-end tests (4 held-out prompts x 24 tokens)
E2E_TOKENS = 24


def _world_prompts() -> list[str]:
    import json

    return [json.loads(line)["prompt"] for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:4]]


try:
    import pytest

    @pytest.fixture
    def verifier(tmp_path):
        """A small random Llama verifier (``builders.write_verifier``) in this test's folder."""
        from builders import write_verifier

        return write_verifier(tmp_path / "verifier")

    @pytest.fixture(scope="session")
    def world_prompts() -> list[str]:
        return _world_prompts()

    @pytest.fixture(scope="session", autouse=True)
    def one_vllm_host():
        """Every vLLM engine this session starts runs in one host process (``vllm_run.engines``): an engine
        start then costs about 6 s instead of 35-45 s. The host's child starts only if an engine is asked for."""
        from specfmt.validation import vllm_run

        with vllm_run.engines() as host:
            yield host

    @pytest.fixture(scope="session")
    def verifier_alone(world_prompts):
        """The example verifier served alone by vLLM (one engine start shared by every e2e test)."""
        from specfmt.validation.vllm_run import generate

        return generate(str(WORLD / "verifier"), world_prompts, max_tokens=E2E_TOKENS)
except ImportError:  # pragma: no cover
    pass
