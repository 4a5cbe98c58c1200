"""``validate --run``'s diagnosis: why a draft accepts little.

A report, not a check: nothing here passes or fails a run. From the reference run as written
(:class:`~specfmt.validation.acceptance.ChainResult`) it gathers, into ``validation.json``'s
``diagnosis`` and the command's output:

* **draft-vocabulary coverage** (:func:`vocab_coverage`): the verifier's greedy tokens on the
  prompts (``max_tokens`` per prompt, ``token_ids`` of the run) that the draft cannot propose,
  because its draft vocabulary (EAGLE-3's and the DFlash family's ``d2t``, Vd < V) leaves them
  out; which ids a draft can propose is its algorithm's knowledge
  (:meth:`~specfmt.algorithms.base.Algorithm.proposable_ids`). Each such token ends the
  accepted run at its place whatever the draft learned. The share, and the most frequent ones
  (id, text, count);
* **acceptance per prompt** (:func:`per_prompt`): drafts, accepted tokens and mean acceptance
  length of each prompt, so one pathological prompt shows;
* **the training log** (:func:`training_log`): per-position accuracy the draft's provenance
  records (``config.json`` ``specfmt.train``, the keys of :data:`TRAINING_LOG_KEYS`), to be read
  beside the measured acceptance rate per position.

Why the hint's threshold (:data:`COVERAGE_HINT`): on the shipped example world (V = 2048) a
draft vocabulary of 1024 ids chosen by token frequency of the training text covers 88.1 % of the
verifier's greedy tokens on the 16 held-out prompts, one chosen by the frequency of the
verifier's own top-1 prediction over the same text 99.2 % (issue 27); a draft missing more than
2 % of the greedy path is below what a vocabulary from the verifier's outputs reaches.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from .acceptance import ChainResult

#: offenders listed (the most frequent greedy tokens outside the draft vocabulary)
TOP_OFFENDERS = 10
#: the share of greedy tokens outside the draft vocabulary above which the output suggests another vocabulary
COVERAGE_HINT = 0.02
#: per-position lists of a draft's provenance shown beside the measured acceptance: ``{key under specfmt.train:
#: label}``; a dotted key reads a nested dict (``heldout.accuracy``). Absent or malformed keys show "n/a".
TRAINING_LOG_KEYS: dict[str, str] = {"top1_agreement": "training top-1 agreement",
                                     "top1_agreement_conditional": "training, in the draft vocabulary",
                                     "heldout.kept.top1_agreement": "held-out top-1 agreement"}
#: the flag that chooses a new draft's vocabulary from the verifier's outputs (``specfmt train eagle3``)
VOCAB_FLAG = "specfmt train eagle3 --vocab-from verifier"


def vocab_coverage(token_ids: list[list[int]], proposable: "list[int] | None", vocab_size: int,
                   decode: Callable[[int], str] | None = None, top: int = TOP_OFFENDERS) -> dict[str, Any]:
    """The verifier's greedy tokens the draft cannot propose.

    Args:
        token_ids: the verifier's greedy tokens per prompt (the reference run's ``token_ids``).
        proposable: the verifier ids the draft can propose (:meth:`~specfmt.algorithms.base.Algorithm.proposable_ids`),
            None for all ``vocab_size``.
        vocab_size: V, the verifier's vocabulary.
        decode: one id to its text (the verifier's tokenizer), None: no text.
        top: offenders listed.

    Returns:
        ``{draft_vocab_size, vocab_size, tokens, outside, share_outside, offenders: [{id, text, count}]}``:
        ``tokens`` greedy tokens counted, ``outside`` of them not proposable, ``share_outside`` = outside / tokens
        (0 to 1), offenders by count (ties: lower id first), ``text`` None without ``decode``.
    """
    flat = [t for ids in token_ids for t in ids]
    allowed = None if proposable is None else set(proposable)
    missed = Counter(t for t in flat if allowed is not None and t not in allowed)
    outside = sum(missed.values())
    offenders = sorted(missed.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"draft_vocab_size": vocab_size if allowed is None else len(allowed), "vocab_size": vocab_size, "tokens": len(flat),
            "outside": outside, "share_outside": round(outside / len(flat), 4) if flat else 0.0,
            "offenders": [{"id": t, "text": decode(t) if decode else None, "count": c} for t, c in offenders]}


def per_prompt(res: ChainResult, texts: list[str], proposable: "list[int] | None" = None) -> list[dict[str, Any]]:
    """Each prompt's figures, in prompt order: ``[{index, prompt, drafts, accepted, mean_acceptance_length, outside}]``
    (``prompt``: its first 60 characters; the drafts and accepted tokens sum to the run's ``num_drafts`` and
    ``num_accepted_tokens``; mean acceptance length ``1 + accepted / drafts``, 1.0 without drafts; ``outside``: its
    greedy tokens the draft cannot propose, as :func:`vocab_coverage` counts them)."""
    allowed = None if proposable is None else set(proposable)
    return [{"index": i, "prompt": (texts[i] if i < len(texts) else "")[:60], "drafts": d, "accepted": a,
             "mean_acceptance_length": round(1 + a / d, 4) if d else 1.0,
             "outside": 0 if allowed is None else sum(t not in allowed for t in ids)}
            for i, (d, a, ids) in enumerate(zip(res.drafts_per_prompt, res.accepted_per_prompt, res.token_ids))]


def _at(block: Any, key: str) -> Any:
    for part in key.split("."):
        block = block.get(part) if isinstance(block, dict) else None
    return block


def training_log(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-position accuracy lists the draft's provenance records: ``[{key, label, per_position}]`` for each
    key of :data:`TRAINING_LOG_KEYS` under ``config.json`` ``specfmt.train`` that holds a list of numbers (written
    by ``specfmt train``: ``specfmt/training/pipeline.py``); empty for a converted draft or one whose record
    holds none."""
    train = _at(cfg, "specfmt.train")
    out = []
    for key, label in TRAINING_LOG_KEYS.items():
        v = _at(train, key)
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out.append({"key": f"specfmt.train.{key}", "label": label, "per_position": [float(x) for x in v]})
    return out


def diagnose(res: ChainResult, *, proposable: "list[int] | None", vocab_size: int, texts: list[str], cfg: dict[str, Any],
             decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """``validation.json``'s ``diagnosis`` of the reference run as written: ``{vocab_coverage, per_prompt,
    training_log, training_steps, hint}`` (:func:`vocab_coverage`, :func:`per_prompt`, :func:`training_log`, the
    steps the provenance records (``specfmt.train.steps``; None without), :func:`hint`)."""
    cov = vocab_coverage(res.token_ids, proposable, vocab_size, decode)
    steps = _at(cfg, "specfmt.train.steps")
    return {"vocab_coverage": cov, "per_prompt": per_prompt(res, texts, proposable), "training_log": training_log(cfg),
            "training_steps": steps if isinstance(steps, int) and not isinstance(steps, bool) else None, "hint": hint(cov)}


def hint(coverage: dict[str, Any]) -> str | None:
    """One line when more than :data:`COVERAGE_HINT` of the greedy tokens are outside the draft vocabulary, else None."""
    if coverage["share_outside"] <= COVERAGE_HINT:
        return None
    return (f"the draft vocabulary misses {100 * coverage['share_outside']:.1f} % of the verifier's greedy tokens; retrain with the "
            f"draft vocabulary from the verifier's outputs (EAGLE-3: {VOCAB_FLAG})")


__all__ = ["COVERAGE_HINT", "TOP_OFFENDERS", "TRAINING_LOG_KEYS", "VOCAB_FLAG", "diagnose", "hint", "per_prompt", "training_log", "vocab_coverage"]
