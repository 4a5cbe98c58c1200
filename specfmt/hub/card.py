"""The model card of a pushed draft (README.md): metadata the Hub understands, and a body that says
what the draft is, how to serve it, how well it was measured to do and where it came from.

Published speculators are hard to use when their Hub page is blank and the verifier is buried
in config.json (speculators issue #1055). Built with huggingface_hub's ``ModelCard`` /
``ModelCardData``; what differs per algorithm comes from the algorithm
(:meth:`specfmt.algorithms.base.Card.card_rows`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from .. import __version__
from ..algorithms import find
from ..checkpoint.reader import CheckpointReader
from ..algorithms import schema_violations
from ..algorithms.sglang import EXPORT_KEY, SGLANG_VERSION
from ..sources.resolve import is_hub_id

CARD_FILE = "README.md"
#: the Hub's ``library_name``: the library that runs the draft (vLLM attaches it by itself)
LIBRARY_NAME = "vllm"
PIPELINE_TAG = "text-generation"


def _parameters(folder: Path) -> tuple[int, str]:
    with CheckpointReader(folder) as reader:
        infos = reader.infos
    n = 0
    for name, info in infos.items():
        if name not in ("d2t", "t2d"):
            k = 1
            for d in info.shape:
                k *= d
            n += k
    dtypes = sorted({i.dtype for n_, i in infos.items() if n_ not in ("d2t", "t2d")})
    return n, "/".join(dtypes)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _place(ref: str | None) -> str:
    """A Hub id as a link; a local path by its folder name only (the uploader's paths stay private)."""
    if not ref:
        return "(not recorded)"
    if is_hub_id(ref):
        return f"[{ref}](https://huggingface.co/{ref})"
    return f"a local folder `{PurePosixPath(ref.replace(chr(92), '/')).name}`"


def render_card(cfg: dict[str, Any], *, repo_id: str, verifier: str, figures: dict[str, Any] | None, license: str | None,
                weights: list[tuple[str, int]], folder: Path) -> str:
    """The README.md of a pushed draft, built with ``huggingface_hub.ModelCard``/``ModelCardData``.

    Metadata: ``base_model`` = the verifier's Hub id, ``library_name`` = ``vllm``,
    ``pipeline_tag`` = ``text-generation``, tags ``speculative-decoding``, the algorithm,
    ``speculators``, ``specfmt``; ``license`` when given. Body: what the draft is, the
    ``vllm serve`` command, its shape, the acceptance figures of ``validation.json`` (reference
    and vLLM side by side) and the provenance block of config.json.

    A config that does not match the schema (``push --no-validate``) gets a short card instead: the
    metadata, the schema's findings and the figures section, and nothing read from the config's fields.

    Returns:
        The card text (YAML front matter + Markdown), which ``ModelCard`` parses back.
    """
    from huggingface_hub import ModelCard, ModelCardData

    violations = schema_violations(cfg)
    if violations:  # push --no-validate: say what is wrong, and read no field the schema rejects
        algo = cfg.get("speculators_model_type")
        tags = ["speculative-decoding", *([algo] if isinstance(algo, str) and algo else []), "speculators", "specfmt"]
        data = ModelCardData(base_model=verifier, library_name=LIBRARY_NAME, pipeline_tag=PIPELINE_TAG, license=license, tags=tags)
        body = "\n".join([f"# {repo_id.split('/')[1]}", "",
                          f"A draft model (speculator) for {_place(verifier)}, uploaded with `specfmt push --no-validate`. Its config.json "
                          "does not match the speculators format schema, so vLLM may not load it and this card describes no more of it:", "",
                          *[f"- `{path}`: {message}" for path, message in violations[:20]], "", *_figures_section(figures, repo_id, verifier)])
        return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))
    algo = cfg["speculators_model_type"]
    algorithm = find(algo)
    name = algorithm.title if algorithm else algo
    spec = cfg["speculators_config"]
    k = spec["proposal_methods"][0]["speculative_tokens"]
    data = ModelCardData(base_model=verifier, library_name=LIBRARY_NAME, pipeline_tag=PIPELINE_TAG, license=license,
                         tags=["speculative-decoding", algo, "speculators", "specfmt"])
    n_params, dtypes = _parameters(folder)
    rows = [("algorithm", f"{name} (`speculators_model_type: {algo}`)"),
            ("verifier", f"{_place(verifier)} ({', '.join(spec['verifier'].get('architectures') or [])})"),
            ("speculative tokens", f"{k} per step ({spec['proposal_methods'][0]['proposal_type']} proposals)")]
    rows += algorithm.card.card_rows(cfg) if algorithm and algorithm.card else []  # the algorithm's card part, when it has one
    rows += [("parameters", f"{_count(n_params)} ({dtypes})"),
             ("weights", ", ".join(f"`{name}` ({_size(size)})" for name, size in weights))]
    lines = [f"# {repo_id.split('/')[1]}", "",
             f"{'An' if name[0] in 'AEIOU' else 'A'} **{name}** draft model (speculator) for {_place(verifier)}, in the speculators format "
             f"(`speculators_version` {cfg.get('speculators_version')}): vLLM attaches it to the verifier for speculative decoding. "
             "The output is exactly what the verifier alone would produce; the draft only makes it faster.", "",
             "## Serve it with vLLM", "",
             *_serving_section(cfg, repo_id, algorithm, k),
             *_sglang_section(folder, repo_id, verifier),
             "## The draft", "", "| | |", "| --- | --- |", *[f"| {a} | {b} |" for a, b in rows], ""]
    lines += _figures_section(figures, repo_id, verifier)
    lines += _provenance_section(cfg)
    body = "\n".join(lines)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)


def _serving_section(cfg: dict[str, Any], repo_id: str, algorithm: Any, k: int) -> list[str]:
    """How each checked vLLM release serves the draft, one paragraph per group of releases with the
    same line (:func:`specfmt.serving.by_release`, the rules ``specfmt serve-command`` answers with),
    each with its ``vllm serve`` line; then who else reads it.

    ``cfg`` is the config.json that is uploaded (the verifier named as uploaded) and ``repo_id``
    the name the draft is served by, so every line and every reason given is that config's.
    """
    if algorithm is None:
        return ["No vLLM release specfmt has checked serves this algorithm.", ""]
    from ..format.config import verifier_ref
    from ..serving import CHECKED_RELEASES, auto_refusal, by_release

    verifier = verifier_ref(cfg) or ""
    out = []
    for releases, command in by_release(cfg, repo_id):
        span = releases[0] if len(releases) == 1 else f"{releases[0]}-{releases[-1]}"
        if command is None:
            note = algorithm.serving_note().rstrip(".")
            out += [f"vLLM {span}: cannot serve it" + (f": {note}." if note else "."), ""]
            continue
        if command.form == "auto":
            said = (f"no speculative-decoding flags are needed: vLLM reads `speculators_config` from config.json, serves the verifier "
                    f"{verifier} and proposes {k} tokens per step with its `{algorithm.vllm_method}` method.")
        else:
            said = (f"the explicit form, because {auto_refusal(releases[0], verifier)}: the verifier, with `--speculative-config` naming "
                    f"this draft, its `{algorithm.vllm_method}` method and {k} speculative tokens.")
        out += [f"vLLM {span}: {said}", "", "```bash", command.line, "```", ""]
    out += [f"Checked against the code of vLLM {', '.join(CHECKED_RELEASES)}; `specfmt serve-command {repo_id} --vllm-version X` prints the line for one release.", ""]
    out += [algorithm.interop_note, ""] if algorithm.interop_note else []
    return out


def _sglang_section(folder: Path, repo_id: str, verifier: str) -> list[str]:
    """How SGLang serves the draft: the ``specfmt export --to sglang`` line and SGLang's server line when the export
    writes this draft (decided on the local folder, :func:`specfmt.export.export` with ``dry_run``), else why not.
    The lines name the draft by ``repo_id`` and the verifier by ``verifier``, as the card is read elsewhere."""
    from ..errors import ExportRefusal, SpecfmtError
    from ..export import export
    from ..serving import sglang_serve_command

    head = ["## Serve it with SGLang", ""]
    try:
        result = export(str(folder), None, dry_run=True)
    except ExportRefusal as e:
        return head + [f"SGLang {SGLANG_VERSION} does not run this draft as vLLM does, so `specfmt export --to sglang` refuses it: {e.message}.", ""]
    except SpecfmtError as e:
        return head + [f"Whether SGLang runs this draft exactly could not be decided here ({e.message}); `specfmt export --to sglang "
                       f"{repo_id} -o DRAFT` decides it.", ""]
    out_dir = f"{repo_id.split('/')[1]}-sglang"
    cfg = {**result.config, EXPORT_KEY: {**result.config[EXPORT_KEY], "verifier": verifier}}
    line = sglang_serve_command(cfg, out_dir).line
    return head + [f"SGLang {SGLANG_VERSION} does not read the speculators format; `specfmt export` writes the layout its own draft class "
                   f"loads (`{cfg['architectures'][0]}`), checked to load whole, then SGLang serves it:", "",
                   "```bash", f"specfmt export --to sglang {repo_id} -o {out_dir}", line, "```", ""]


#: the parts of ``validation.json`` the card shows, in its columns' order (``specfmt.validation.run.SECTIONS``; transformers: a draft model's)
FIGURE_SECTIONS = {"reference": "reference", "vllm": "vLLM", "transformers": "transformers"}


def _measured(figures: dict[str, Any], section: str) -> dict[str, Any]:
    """When and how ``section`` of ``validation.json`` was measured: the run's own conditions, or those of the earlier
    run it was kept from (``kept.{section}``: ``validate --run --no-vllm`` keeps an earlier run's vLLM figures)."""
    kept = (figures.get("kept") or {}).get(section)
    src = kept if isinstance(kept, dict) else figures
    prompts = src.get("prompts") if isinstance(src.get("prompts"), dict) else {}
    return {"date": str(src.get("date") or "")[:10], "specfmt": src.get("specfmt_version"), "kept": isinstance(kept, dict),
            "count": prompts.get("count"), "source": PurePosixPath(str(prompts.get("source") or "built-in prompts")).name,
            "digest": prompts.get("digest"), "tokens": src.get("max_tokens"), "k": src.get("num_speculative_tokens")}


def _measured_with(figures: dict[str, Any], base_model: str) -> list[str]:
    """The sentence naming the verifier the figures were measured with (``validation.json``'s ``verifier``; every part
    of one file has the same, :func:`specfmt.validation.run.keep_earlier`): the card's ``base_model`` itself, or
    another verifier, named, with what that means for the figures (issue 35: a card showed figures measured on a tiny
    local verifier under ``base_model: meta-llama/Llama-3.1-8B-Instruct`` without a word)."""
    used = figures.get("verifier")
    if used == base_model:
        return [f"Measured with this card's base model, {_place(base_model)}, as the verifier.", ""]
    if not isinstance(used, str) or not used:
        return [f"**Measured with a verifier `validation.json` does not record**: these figures are not known to be "
                f"{_place(base_model)}'s.", ""]
    return [f"**Measured with another verifier than this card's base model**: {_place(used)}, not {_place(base_model)}. "
            "The figures are that verifier's; they hold for the base model only as far as that verifier is the same model.", ""]


def _figures_section(figures: dict[str, Any] | None, repo_id: str, base_model: str | None = None) -> list[str]:
    """The acceptance table of ``validation.json``: one column per part measured (the reference, vLLM), after the
    verifier they were measured with (:func:`_measured_with`).

    When every column was measured in the same run, or with the same prompts, tokens and k, one line states the
    conditions. When they differ -- a part kept from an earlier run (``kept``) that used other prompts, another k
    or token count -- each column states its own: date, prompts (count and file), tokens per prompt and k, as
    rows of the table, so that no figure is read under another run's conditions.
    """
    out = ["## Acceptance", ""]
    if not figures:
        return out + ["No acceptance figures were recorded for this upload. Measure them on your own prompts with",
                      "", "```bash", f"specfmt validate {repo_id} --run --prompts prompts.jsonl", "```", ""]
    out += _measured_with(figures, base_model) if base_model else []
    #: (what the column is called in words, its heading, its figures, when and how they were measured)
    runs = [(FIGURE_SECTIONS[s], f"reference ({r.get('dtype')})" if s == "reference" else f"{r.get('engine', 'vLLM')} ({r.get('dtype')})", r,
             _measured(figures, s)) for s in FIGURE_SECTIONS for r in [figures.get(s)] if r]
    what = ("The reference is specfmt's own forward pass of the draft" + ("; vLLM is the engine that serves it." if figures.get("vllm") else "."))
    same = ("count", "source", "digest", "tokens", "k")
    one = len({tuple(m[key] for key in (*same, "date")) for *_, m in runs}) <= 1
    alike = len({tuple(m[key] for key in same) for *_, m in runs}) <= 1
    if one or not runs:
        m = runs[0][3] if runs else _measured(figures, "reference")
        out += [f"Measured with `specfmt validate --run` (specfmt {m['specfmt']}, {m['date']}): {m['count']} prompts from `{m['source']}`, "
                f"{m['tokens']} tokens each, {m['k']} speculative tokens, greedy. " + what, ""]
    else:
        kept = [words for words, *_, m in runs if m["kept"]]
        out += ["Measured with `specfmt validate --run`, greedy, in more than one run: "
                + (f"the {' and '.join(kept)} figures are kept from an earlier run of these same files and verifier. " if kept else "")
                + ("Each column was measured on the same prompts, tokens and k, on the date it states. " if alike
                   else "The columns were measured on different prompts, tokens or k: each states its own, and they compare only as far as those agree. ")
                + what, ""]
    k = max((m["k"] or 0 for *_, m in runs), default=0)
    out += ["| | " + " | ".join(name for _, name, _, _ in runs) + " |", "| --- |" + " ---: |" * len(runs)]
    if not one:
        out.append("| measured | " + " | ".join(f"{m['date']} (specfmt {m['specfmt']}{', kept' if m['kept'] else ''})" for *_, m in runs) + " |")
        out.append("| prompts | " + " | ".join(f"{m['count']} from `{m['source']}`" for *_, m in runs) + " |")
        out.append("| tokens per prompt | " + " | ".join(str(m["tokens"]) for *_, m in runs) + " |")
        out.append("| speculative tokens | " + " | ".join(str(m["k"]) for *_, m in runs) + " |")
    for i in range(k):
        out.append(f"| acceptance rate, position {i + 1} | " + " | ".join(_fmt(r.get("acceptance_rate_per_position"), i) for _, _, r, _ in runs) + " |")
    out.append("| **mean acceptance length** | " + " | ".join(f"**{_fmt(r.get('mean_acceptance_length'))}**" for _, _, r, _ in runs) + " |")
    out.append("| drafts | " + " | ".join(str(r.get("num_drafts", "-")) for _, _, r, _ in runs) + " |")
    out += ["", "Mean acceptance length counts the verifier's own token per step (1.0: no draft token accepted). "
            "Acceptance depends on the prompts: measure on your own traffic before relying on a speed-up.", ""]
    return out


def _fmt(v, i: int | None = None) -> str:
    if i is not None:
        v = v[i] if isinstance(v, list) and i < len(v) else None
    return "-" if v is None else f"{v:.3f}"


def _per_position(values: list[float]) -> str:
    return " / ".join(f"{a:.3f}" for a in values)


def _heldout_lines(train: dict[str, Any]) -> list[str]:
    """The training log's coverage and the held-out evaluation the draft was kept by (``specfmt.train.heldout``,
    written by :func:`specfmt.training.pipeline._heldout_record`); nothing where the provenance has neither."""
    out = []
    cover = train.get("draft_vocab_coverage")
    if cover:
        out.append(f"The draft vocabulary holds the verifier's top-1 at {cover[0]:.1%} of the training positions.")
    held = train.get("heldout") or {}
    kept = held.get("kept") or {}
    if kept.get("top1_agreement"):
        out.append(f"{held.get('share', 0):.0%} of the documents were held out and evaluated {held.get('evaluations')} times; the draft holds "
                   f"the {'best evaluation' if held.get('kept_by') == 'best' else 'last step'}'s weights (step {kept.get('step')}): held-out "
                   f"top-1 agreement {_per_position(kept['top1_agreement'])}, estimated acceptance length "
                   f"{kept.get('estimated_acceptance_length', float('nan')):.3f}.")
    return out


def _provenance_section(cfg: dict[str, Any]) -> list[str]:
    prov = cfg.get("specfmt") or {}
    out = ["## Provenance", ""]
    if not prov:
        return out + ["config.json carries no specfmt provenance block.", ""]
    src = prov.get("source") or {}
    rev = f" at revision `{src['revision']}`" if src.get("revision") else ""
    train = prov.get("train")
    if src.get("format") == "specfmt-train":
        out.append(f"Trained from scratch with specfmt {prov.get('specfmt_version')} ({prov.get('created')}).")
    else:
        out.append(f"Converted with specfmt {prov.get('specfmt_version')} ({prov.get('created')}) from {_place(src.get('name_or_path'))}{rev} "
                   f"(`--from {src.get('format')}`, {src.get('layout')} layout).")
    t = prov.get("tensors") or {}
    counts = [f"{len(t.get(key) or {})} {key}" for key in ("renamed", "kept", "folded", "derived", "dropped")]
    out.append(f"Every source tensor is accounted for: {', '.join(counts)}.")
    for tensor, why in sorted((t.get("dropped") or {}).items()):
        out.append(f"- dropped `{tensor}`: {why}")
    if train:
        agree = train.get("top1_agreement")
        out.append(f"Then {'initialised' if train.get('dry_run') else 'trained'} with `specfmt train {train.get('algorithm')}`: {train.get('steps')} steps, "
                   f"{train.get('tokens'):,} tokens" + (f", top-1 agreement with the verifier {_per_position(agree)}" if agree else "") + ".")
        out += _heldout_lines(train)
    files = {**(src.get("files") or {}), **({} if not train else {PurePosixPath(f).name: h for f, h in (train.get("data") or {}).items()})}
    if files:
        out += ["", "| source file | sha256 |", "| --- | --- |", *[f"| `{n}` | `{h}` |" for n, h in sorted(files.items())]]
    out += ["", f"The full record is the `specfmt` block of config.json. Published with specfmt {__version__}.", ""]
    return out
