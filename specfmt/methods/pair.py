"""``specfmt validate D --verifier V`` on a causal LM: the pair checks.

Each check is named, says what it found in one line, and says how to fix a problem (the last clause of its
summary, after "fix:"). In order:

=================  ============================================================================================
``draft``          the draft is a causal LM transformers loads: config, weights, tokenizer
``verifier``       the verifier is given (a draft LM names none) and its config and tokenizer load
``tokenizer``      one token -> id map for every id; two tokenizers with the same vocabulary size fail: vLLM's
                   ``draft_model`` and transformers' ``assistant_model`` feed the draft the verifier's ids
                   without a word (:mod:`.vocab`)
``special_tokens`` the same bos/eos/pad/unk tokens
``encoding``       the same encoding of a probe text set (:data:`~specfmt.methods.vocab.PROBE_TEXTS`): a
                   normaliser or pre-tokenizer difference shows here
``chat_template``  the same chat template, when both have one
``vocab_size``     equal; or a padding-only difference (rows past the tokenizer's length), which vLLM refuses
                   and ``specfmt pad-vocab`` fixes; or truly different
``intersection``   two tokenizers: the token-level intersection vLLM serves them with (``VocabMapping``) and
                   transformers' token map (``AssistantToTargetTranslator``), and the share of the prompts'
                   tokens inside it
``context``        context length: vLLM serves the pair at the smaller of the two
``rope``           RoPE scaling (``rope_scaling``/``rope_parameters``) against the verifier's
``sliding_window`` a draft's sliding window shorter than the verifier's context
``cost``           the parameters one draft pass reads against one verifier pass (Leviathan et al. 2023's c)
``engines``        which engines serve the pair: vLLM 0.30-0.33 (``draft_model``, their own code), the
                   transformers installed; the exact reason where one cannot
=================  ============================================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SpecfmtError
from ..validation.report import FAIL, PASS, SKIP, WARN, Report
from .vocab import translator_pairs
from .weights import parameter_count

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import Verifier

#: the draft model and its pair (:class:`specfmt.methods.draft_lm.DraftLM`, ``Pair``: not imported, which imports this module)
DraftLM = Pair = Any

#: the checks of :func:`pair_checks`, in order
CHECKS = ("draft", "verifier", "tokenizer", "special_tokens", "encoding", "chat_template", "vocab_size", "intersection", "context", "rope",
          "sliding_window", "cost", "engines")
#: below this many shared tokens vLLM warns ("Very small vocabulary intersection", ``vocab_mapping.py``)
SMALL_INTERSECTION = 100


def pair_checks(draft: DraftLM, verifier: "str | Verifier | None", texts: list[str] | None = None) -> Report:
    """The pair checks of ``draft`` against ``verifier`` (see the module's table).

    Args:
        draft: the draft LM.
        verifier: the verifier (a folder, Hub id or resolved :class:`~specfmt.sources.verifier.Verifier`); None
            fails the ``verifier`` check (a draft LM names no verifier).
        texts: prompts whose tokens the ``intersection`` check counts (default: the probe texts).

    Returns:
        A report; a problem of either model is a failed check, not an exception.
    """
    rep = Report(draft.ref)
    if not _draft_check(rep, draft):
        return _skip_from(rep, "verifier", "the draft cannot be read")
    ver = _verifier_check(rep, draft, verifier)
    if ver is None:
        return _skip_from(rep, "tokenizer", "no verifier")
    try:
        pair = draft.pair(ver)
    except SpecfmtError as e:
        rep.add("tokenizer", FAIL, e.one_line())
        return _skip_from(rep, "special_tokens", "a tokenizer cannot be loaded")
    _tokenizer_checks(rep, draft, ver, pair)
    _vocab_checks(rep, draft, ver, pair, texts)
    _shape_checks(rep, draft, ver)
    _engines_check(rep, draft, ver, pair)
    return rep


def _skip_from(rep: Report, first: str, why: str) -> Report:
    for name in CHECKS[CHECKS.index(first):]:
        rep.add(name, SKIP, why)
    return rep


def _draft_check(rep: Report, draft: DraftLM) -> bool:
    c = draft.config
    try:
        params = parameter_count(draft.folder)
        draft.tokenizer()
    except SpecfmtError as e:
        rep.add("draft", FAIL, e.one_line())
        return False
    rep.add("draft", PASS, f"{', '.join(c.get('architectures') or [c.get('model_type', '?')])}: {c.get('num_hidden_layers')} layers, hidden "
                           f"{c.get('hidden_size')}, vocabulary {draft.vocab_size} rows, {params:,} parameters; tokenizer of {len(draft.tokenizer())} tokens")
    return True


def _verifier_check(rep: Report, draft: DraftLM, verifier: "str | Verifier | None") -> "Verifier | None":
    from ..sources.verifier import Verifier

    if verifier is None:
        rep.add("verifier", FAIL, f"a draft model names no verifier; fix: pass --verifier FOLDER_OR_HUB_ID (`specfmt validate {draft.named} --verifier V`)")
        return None
    try:
        ver = verifier if isinstance(verifier, Verifier) else Verifier.load(verifier)
        ver.tokenizer()
    except SpecfmtError as e:
        rep.add("verifier", FAIL, f"the verifier cannot be read: {e.one_line()}")
        return None
    except (OSError, ValueError) as e:
        rep.add("verifier", FAIL, f"the verifier's tokenizer cannot be loaded: {str(e).splitlines()[0][:200]}; fix: --verifier must name a folder or Hub id with its tokenizer")
        return None
    v = ver.info
    rep.add("verifier", PASS, f"{ver.name_or_path}: {', '.join(v.architectures)}, {v.num_hidden_layers} layers, hidden {v.hidden_size}, vocabulary {v.vocab_size} rows")
    return ver


def _tokenizer_checks(rep: Report, draft: DraftLM, ver: "Verifier", pair: Pair) -> None:
    """``tokenizer``, ``special_tokens``, ``encoding``, ``chat_template``."""
    t = pair.tokens
    examples = [f"id {i}: verifier {a!r}, draft {b!r}" for i, a, b in t.differing]
    if t.same_map:
        rep.add("tokenizer", PASS, f"one token -> id map: all {t.verifier_len} ids hold the same token")
    elif pair.relation == "different-same-size":
        rep.add("tokenizer", FAIL, f"the draft's ids are not the verifier's ({t.n_differing} of {t.verifier_len} ids hold another token) and the vocabulary "
                f"sizes are equal ({pair.draft_rows}), so vLLM's draft_model and transformers' assistant_model feed the draft the verifier's ids without a word; "
                "fix: serve it with use_heterogeneous_vocab: true (`specfmt serve-command` prints it), or use a draft trained on the verifier's tokenizer", examples)
    else:
        rep.add("tokenizer", WARN, f"two tokenizers ({t.verifier_len} and {t.draft_len} tokens, {t.n_differing} of the shared ids differ): vLLM serves the pair "
                "only with use_heterogeneous_vocab (token-level intersection), transformers with assistant_tokenizer (through text); "
                "fix: none needed, `specfmt serve-command` prints both", examples)
    if not t.same_map:
        for name in ("special_tokens", "encoding", "chat_template"):
            rep.add(name, SKIP, "two tokenizers (see tokenizer)")
        return
    if t.special:
        rep.add("special_tokens", WARN, f"special tokens differ: {'; '.join(f'{r}: verifier {a}, draft {b}' for r, a, b in t.special)}; the engines use "
                "the verifier's; fix: give the draft's tokenizer_config.json the verifier's special tokens")
    else:
        rep.add("special_tokens", PASS, "the same bos, eos, pad and unk tokens")
    if t.encodings:
        rep.add("encoding", WARN, f"{len(t.encodings)} of the probe texts encode differently (a normaliser or pre-tokenizer differs): the draft was trained "
                "on other ids for the same text; fix: save the verifier's tokenizer files into the draft's folder",
                [f"{text!r}: verifier {a[:12]}, draft {b[:12]}" for text, a, b in t.encodings])
    else:
        rep.add("encoding", PASS, "every probe text encodes to the same ids")
    status = {"differ": WARN, "same": PASS}.get(t.chat_template, SKIP if t.chat_template == "none" else PASS)
    rep.add("chat_template", status, {
        "differ": "the chat templates differ: a chat prompt reaches the draft as the verifier's template renders it; fix: train or tune the draft on the verifier's template",
        "same": "the same chat template", "none": "neither has a chat template",
        "verifier only": "only the verifier has a chat template (the engines render prompts with it)",
        "draft only": "only the draft has a chat template (the engines render prompts with the verifier's tokenizer, which has none)"}[t.chat_template])


def _vocab_checks(rep: Report, draft: DraftLM, ver: "Verifier", pair: Pair, texts: list[str] | None) -> None:
    """``vocab_size`` and ``intersection``."""
    d, v, n = pair.draft_rows, pair.verifier_rows, pair.tokens.verifier_len
    if pair.relation == "same":
        rep.add("vocab_size", PASS, f"equal: {v} rows")
    elif pair.relation == "padded":
        rep.add("vocab_size", FAIL, f"a padding-only difference: draft {d} rows, verifier {v}, one tokenizer of {n} tokens; vLLM 0.30-0.33 refuse it "
                f"(\"Target and draft model should have the same vocabulary size\"; vLLM issues #5203, #7252, #10913); "
                f"fix: `specfmt pad-vocab {draft.named} --verifier {ver.ref} -o OUT`")
    elif pair.relation == "truncated":
        rep.add("vocab_size", FAIL, f"truly different: draft {d} rows, verifier {v}, but the tokenizer has {n} tokens, so some ids have no row; "
                "fix: use a draft whose vocabulary covers the tokenizer")
    else:
        rep.add("vocab_size", PASS if d != v else WARN, f"draft {d} rows, verifier {v}, two tokenizers: the engines map tokens between them (see intersection)")
    inter = pair.intersection
    if inter is None:
        rep.add("intersection", SKIP, "one tokenizer: no mapping")
        return
    vtok = ver.tokenizer()
    ids = [i for text in (texts or list(_probe())) for i in vtok.encode(text, add_special_tokens=False)]
    share = inter.share_inside(ids)
    hf = translator_pairs(vtok, draft.tokenizer(), v)
    hf_line = f"; transformers' token map (AssistantToTargetTranslator, used when sampling) pairs {len(hf)}" if hf is not None else ""
    summary = (f"{inter.size} tokens shared ({100 * inter.size / max(d, 1):.1f} % of the draft's {d}, {100 * inter.size / max(v, 1):.1f} % of the "
               f"verifier's {v}; computed by {inter.source}'s VocabMapping){hf_line}; {100 * share:.1f} % of the prompts' {len(ids)} verifier tokens "
               "are inside it, the others reach the draft as its unk/eos token in vLLM")
    small = inter.size < SMALL_INTERSECTION
    rep.add("intersection", WARN if small else PASS, summary + ("; fix: a draft sharing more of the verifier's tokens" if small else ""))


def _probe() -> tuple[str, ...]:
    from .vocab import PROBE_TEXTS

    return PROBE_TEXTS


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RoPE scaling of a config, without the base frequency: ``{}`` for none (``default``)."""
    r = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    r = {k: v for k, v in r.items() if k not in ("rope_theta",)} if isinstance(r, dict) else {}
    return {} if r.get("rope_type", r.get("type", "default")) == "default" else r


def _shape_checks(rep: Report, draft: DraftLM, ver: "Verifier") -> None:
    """``context``, ``rope``, ``sliding_window`` and ``cost``."""
    dc, vc = draft.config, ver.text_config
    dlen, vlen = dc.get("max_position_embeddings"), vc.get("max_position_embeddings")
    if isinstance(dlen, int) and isinstance(vlen, int) and dlen < vlen:
        rep.add("context", WARN, f"the draft has {dlen} positions, the verifier {vlen}: vLLM serves the pair at {dlen} tokens per sequence "
                "(the draft's max_model_len becomes the smaller); fix: a draft with the verifier's context, or --max-model-len within it")
    else:
        rep.add("context", PASS, f"the draft has {dlen} positions, the verifier {vlen}")
    dr, vr = _rope(dc), _rope(vc)
    if dr == vr:
        rep.add("rope", PASS, "the same RoPE scaling" + (f" ({vr.get('rope_type', vr.get('type'))})" if vr else " (none)"))
    else:
        rep.add("rope", WARN, f"RoPE scaling differs: verifier {vr or 'none'}, draft {dr or 'none'}: past the draft's trained context its proposals "
                "degrade; fix: a draft with the verifier's rope scaling")
    from ..algorithms.layers import kept_window

    sw, vsw = kept_window(dc), kept_window(vc)  # as transformers' config class keeps them (Qwen's use_sliding_window)
    if isinstance(sw, int) and isinstance(vlen, int) and sw < vlen and sw != vsw:
        rep.add("sliding_window", WARN, f"the draft attends to the last {sw} tokens only, the verifier to {vsw or vlen}: "
                "on long prompts the draft sees less than the verifier; fix: none in serving, only a draft without the window")
    else:
        rep.add("sliding_window", PASS, "no sliding window shorter than the verifier's" if sw is None else f"sliding window {sw}")
    cost = draft.cost(ver)
    k = draft.default_k()
    line = (f"one draft pass reads {cost.draft_parameters:,} parameters, {100 * cost.ratio:.1f} % of a verifier pass ({cost.verifier_parameters:,}); "
            f"a chain of k = {k} costs {cost.per_step(k):.2f} verifier passes per step")
    if cost.per_step(k) >= 1:
        rep.add("cost", WARN, line + ": at batch size 1 drafting costs more than it can save; fix: a smaller draft")
    else:
        rep.add("cost", PASS, line)


def _engines_check(rep: Report, draft: DraftLM, ver: "Verifier", pair: Pair) -> None:
    """``engines``: vLLM 0.30-0.33 (``draft_model``) and the transformers installed."""
    import transformers

    from ..serving import CHECKED_RELEASES

    span = f"{CHECKED_RELEASES[0]}-{CHECKED_RELEASES[-1]}"
    refusal = draft.refusal(ver)
    hf = draft.transformers_refusal(ver)
    how = " with use_heterogeneous_vocab (greedy draft sampling only; the V1 model runner)" if pair.heterogeneous else ""
    parts = [f"vLLM {span} cannot serve it: {refusal}" if refusal else f"vLLM {span} serve it as draft_model{how} (draft tensor parallelism must equal the verifier's)"]
    two = pair.draft_rows != pair.verifier_rows
    parts.append(f"transformers {transformers.__version__}: " + (hf if hf else "generate(assistant_model=D" + (", tokenizer=T, assistant_tokenizer=TD)" if two else ")")))
    status = FAIL if refusal and hf else WARN if refusal or hf else PASS
    rep.add("engines", status, "; ".join(parts))


__all__ = ["CHECKS", "pair_checks"]
