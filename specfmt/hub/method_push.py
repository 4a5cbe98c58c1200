"""``specfmt push`` of any proposal method: a speculators draft (:func:`specfmt.hub.push.plan_push`) or a draft model.

:func:`plan` reads what the folder is once (:func:`specfmt.methods.resolve`). A speculators-format draft is planned
by :func:`specfmt.hub.push.plan_push`, unchanged. A draft model (a causal LM folder) is planned here: its files as
they are (its config.json names no verifier, so nothing is rewritten), and a model card that names

* its verifier (``base_model``: ``--verifier-id``, else the Hub id ``validation.json`` was measured with);
* the tokenizer relation (one tokenizer; padding rows; two tokenizers and their token-level intersection);
* the padding fix, when ``specfmt pad-vocab`` wrote the folder (``config.json``'s ``specfmt.pad_vocab``);
* the serve line of each checked vLLM release and the transformers ``generate`` call;
* the acceptance ``validate --run`` measured, per engine (reference, vLLM, transformers).

The pair is checked against the verifier ``validation.json`` measured (or ``--verifier-id``) before anything is
uploaded (:meth:`~specfmt.methods.base.ProposalMethod.static_checks`); ``--no-validate`` skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InputError, SpecfmtError
from ..methods import ProposalMethod, resolve
from ..sources.resolve import check_repo_id, check_revision, is_hub_id
from .card import CARD_FILE, PIPELINE_TAG, _count, _figures_section, _place, _size
from .push import PushPlan, UploadFile, _folder_files, _read_validation, plan_push


def plan(folder: str | Path, repo_id: str, **kw: Any) -> PushPlan:
    """The push plan of ``folder``, whatever proposal method it holds (arguments as :func:`~specfmt.hub.push.plan_push`'s).

    Raises:
        InputError: as :func:`~specfmt.hub.push.plan_push`; for a draft model also: no verifier to name (neither
            ``--verifier-id`` nor a ``validation.json`` measured with a Hub id), or the pair fails its checks.
    """
    path = Path(folder).expanduser()
    method = resolve(str(path)) if path.is_dir() else None
    if method is None or method.speculators_config() is not None:  # a speculators draft, or what plan_push refuses in one line
        return plan_push(folder, repo_id, **kw)
    return plan_method_push(method, path, repo_id, **kw)


def plan_method_push(method: ProposalMethod, folder: Path, repo_id: str, *, revision: str | None = None, create_pr: bool = False,
                     private: bool = False, verifier_id: str | None = None, license: str | None = None, overwrite_card: bool = False,
                     validate: bool = True, commit_message: str | None = None) -> PushPlan:
    """The push plan of a method that is not a speculators draft (a draft model): see the module docstring.

    Raises:
        InputError: a malformed repo id or revision; no verifier to check against or to name on the card; a failed
            check of the pair; ``validation.json`` stale or failed (with ``validate``).
    """
    check_repo_id(repo_id)
    check_revision(revision)
    if verifier_id is not None and not is_hub_id(verifier_id):
        raise InputError(f"--verifier-id {verifier_id!r} is not a Hub id (OWNER/NAME)", hint="name the verifier as it is on the Hub")
    figures, notes = _read_validation(folder, validate)
    measured = (figures or {}).get("verifier")
    against = measured or verifier_id
    if against is None:
        raise InputError(f"a {method.title} names no verifier, and no validation.json says which it was measured with", where=str(folder),
                         hint=f"run `specfmt validate {folder} --verifier V --run` first, or pass --verifier-id OWNER/NAME")
    named = verifier_id or (measured if is_hub_id(measured or "") else None)
    if named is None:
        raise InputError(f"validation.json measured the pair with a local verifier ({measured}); on the Hub nobody else can load it", where=str(folder),
                         hint="pass --verifier-id OWNER/NAME, the verifier's Hub id, for the card's base_model")
    checks = None
    if validate:
        rep = method.static_checks(against)
        checks = [(c.name, c.status, c.summary) for c in rep.checks]
        if not rep.ok:
            failed = "; ".join(f"{c.name}: {c.summary}" for c in rep.checks if c.status == "fail")
            raise InputError(f"the pair fails its checks: {failed}", where=str(folder), hint="see `specfmt validate DIR --verifier V`; push with --no-validate to upload it anyway")
    else:
        notes.append("--no-validate: the pair was not checked before upload")
    paths, skipped = _folder_files(folder)
    files = [UploadFile(p.name, p.stat().st_size, local=p) for p in paths if p.name != CARD_FILE]
    own = folder / CARD_FILE
    if own.is_file() and not overwrite_card:
        card, origin = own.read_text(encoding="utf-8"), "kept"
        files.append(UploadFile(CARD_FILE, own.stat().st_size, local=own, note="the folder's own README.md (--overwrite-card replaces it)"))
    else:
        card = render_method_card(method, repo_id=repo_id, verifier=named, against=against, figures=figures, license=license,
                                  weights=[(f.path_in_repo, f.size) for f in files if f.path_in_repo.endswith(".safetensors")])
        origin = "regenerated" if own.is_file() else "generated"
        files.append(UploadFile(CARD_FILE, len(card.encode()), content=card.encode(), note=f"{origin} model card"))
    message = commit_message or f"Upload {method.title} for {named} (specfmt {__version__})"
    return PushPlan(folder=folder, repo_id=repo_id, revision=revision, create_pr=create_pr, private=private, verifier=named,
                    files=sorted(files, key=lambda f: f.path_in_repo), card=card, card_origin=origin, commit_message=message,
                    checks=checks, figures=figures, notes=notes + skipped, config={})


def _pair_rows(method: ProposalMethod, against: str, figures: dict[str, Any] | None) -> tuple[list[tuple[str, str]], Any]:
    """The card's rows about the pair and the pair itself (None when the verifier cannot be read: the rows say so)."""
    from ..sources.verifier import Verifier

    rows: list[tuple[str, str]] = []
    try:
        ver = Verifier.load(against)
        described = method.describe(ver)
        cost = method.cost(ver)
    except SpecfmtError as e:
        return [("tokenizer", f"not checked: the verifier {against} cannot be read ({e.one_line()})")], None
    pair = described.get("pair") or {}
    from ..methods.draft_lm import RELATIONS

    relation = RELATIONS.get(pair.get("relation", ""), "not recorded")
    inter = pair.get("intersection")
    rows.append(("tokenizer", relation + (f"; token-level intersection {inter['size']} tokens (vLLM `use_heterogeneous_vocab`)" if inter else "")))
    rows.append(("vocabulary", f"{pair.get('draft_vocab_size')} rows (the verifier: {pair.get('verifier_vocab_size')}; tokenizer "
                               f"{pair.get('draft_tokenizer_length')} tokens)"))
    rows.append(("cost of a draft pass", f"{100 * cost.ratio:.1f} % of the verifier's parameters read per pass ({_count(cost.draft_parameters)} of "
                                         f"{_count(cost.verifier_parameters)}); a chain of k drafts pays k passes"))
    return rows, ver


def render_method_card(method: ProposalMethod, *, repo_id: str, verifier: str, against: str, figures: dict[str, Any] | None, license: str | None,
                       weights: list[tuple[str, int]]) -> str:
    """The README.md of a pushed draft model (``huggingface_hub.ModelCard``): metadata (``base_model`` the verifier), what the pair
    is, how each engine serves it, the measured acceptance, and the padding fix's record when there is one."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(base_model=verifier, library_name="transformers", pipeline_tag=PIPELINE_TAG, license=license,
                         tags=["speculative-decoding", "draft-model", "specfmt"])
    rows, ver = _pair_rows(method, against, figures)
    rows = [("verifier", _place(verifier)), *method.card_rows(), *rows, ("weights", ", ".join(f"`{n}` ({_size(s)})" for n, s in weights))]
    lines = [f"# {repo_id.split('/')[1]}", "",
             f"A **draft model** for {_place(verifier)}: a small causal LM that proposes tokens the verifier checks in one pass "
             "(speculative decoding). The output is exactly what the verifier alone would produce; the draft only makes it faster. "
             "vLLM serves it as `draft_model`, transformers as `assistant_model`.", "",
             "## Serve it with vLLM", "", *_serve_lines(method, ver, verifier, repo_id),
             "## Run it with transformers", "", *_transformers_lines(method, ver, verifier, repo_id),
             "## The pair", "", "| | |", "| --- | --- |", *[f"| {a} | {b} |" for a, b in rows], ""]
    lines += _figures_section(figures, repo_id)
    lines += _padding_section(method)
    lines += [f"Published with specfmt {__version__}.", ""]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def _named(method: ProposalMethod, text: str, verifier: str, repo_id: str, ver: Any) -> str:
    """``text`` with the local names of the draft and the verifier replaced by the names the card uses."""
    out = text.replace(method.ref, repo_id)
    return out.replace(ver.name_or_path, verifier) if ver is not None else out


def _serve_lines(method: ProposalMethod, ver: Any, verifier: str, repo_id: str) -> list[str]:
    from ..serving import CHECKED_RELEASES, GPU_BUILD

    if ver is None:
        return ["Not checked against the verifier: run `specfmt serve-command` with `--verifier` for the line.", ""]
    line = method.serve_command(CHECKED_RELEASES[-1], verifier=ver, distribution=GPU_BUILD)
    span = f"{CHECKED_RELEASES[0]}-{CHECKED_RELEASES[-1]}"
    if line is None:
        return [f"vLLM {span} cannot serve it: {_named(method, method.serving_note(ver), verifier, repo_id, ver)}.", ""]
    return [f"vLLM {span} (checked against each release's own code):", "", "```bash", _named(method, line.line, verifier, repo_id, ver), "```", ""]


def _transformers_lines(method: ProposalMethod, ver: Any, verifier: str, repo_id: str) -> list[str]:
    part = method.transformers
    if part is None or ver is None:
        return ["transformers does not run it.", ""] if part is None else ["Not checked against the verifier.", ""]
    return ["```python", _named(method, part.generate_call(ver, method.default_k()), verifier, repo_id, ver), "```", ""]


def _padding_section(method: ProposalMethod) -> list[str]:
    record = ((getattr(method, "config", None) or {}).get("specfmt") or {}).get("pad_vocab")
    if not isinstance(record, dict):
        return []
    before, after = (record.get("rows") or [None, None])[:2]
    return ["## Padding", "", f"`specfmt pad-vocab` wrote this folder from `{Path(str(record.get('source'))).name}`: its embedding and output head went "
            f"from {before} to {after} rows, the verifier's ({', '.join(record.get('changed') or [])}); every other tensor is the source's. "
            f"{record.get('padding_rows', '')}.", ""]


__all__ = ["plan", "plan_method_push", "render_method_card"]
