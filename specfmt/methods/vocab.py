"""A draft LM's tokenizer against its verifier's: identity, and the token-level intersection the engines use.

Two facts decide how a pair can be served, both read from the tokenizers and the configs:

* **Is it one tokenizer?** vLLM's ``draft_model`` feeds the draft the verifier's token ids and never reads
  the draft's tokenizer (``SpeculativeConfig``: the draft's ``ModelConfig`` takes the target's tokenizer unless
  ``use_heterogeneous_vocab``); transformers' ``assistant_model`` does the same when the vocabulary sizes are
  equal (``generation/utils.py``, ``_validate_assistant``). A draft trained on another tokenizer with the same
  vocabulary size is then served without a word, at near-zero acceptance.
* **How many rows?** vLLM 0.30-0.33 refuse a pair whose ``vocab_size`` differ
  (``SpeculativeConfig.verify_equal_vocab_size_if_draft_model``), also when the only difference is padding
  rows past the tokenizer's length (Qwen2-1.5B has 151,936 rows, Qwen2-72B 152,064, one tokenizer: vLLM
  issues #5203, #7252, #10913; PR #42775, not in 0.32, proposes ``allow_draft_model_vocab_padding``).

For different tokenizers the engines map tokens differently:

* vLLM (``use_heterogeneous_vocab``, PR #38174, ``vllm/v1/spec_decode/vocab_mapping.py``, ``VocabMapping``):
  the **token-level intersection** of the two vocabularies after normalising the word-initial space marker
  (``Ġ``/``▁``); a verifier token outside it reaches the draft as the draft's unk (else eos) token, and the
  draft's logits are masked to the intersection.
* transformers, greedy (``AssistedCandidateGeneratorDifferentTokenizers``): **text**: the verifier's new tokens
  are decoded and re-encoded with the draft's tokenizer, and the draft's tokens back. Sampling
  (``UniversalSpeculativeDecodingGenerator``) uses a token map, ``AssistantToTargetTranslator``
  (built through ``AssistantVocabTranslatorCache``).

:func:`intersection` computes the first with vLLM's own class when vLLM imports, else with
:func:`_vllm_like` (the same rules, checked against vLLM's class in ``tests/test_pairs.py``);
:func:`translator_pairs` computes transformers' token map with transformers' own class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: texts whose encodings must agree for one tokenizer: code, prose, spacing, digits, accents, CJK, emoji,
#: special-looking text (a normaliser or pre-tokenizer difference shows in one of them)
PROBE_TEXTS = (
    "def main(argv: list[str]) -> int:\n    return 0\n",
    "The quick brown fox jumps over the lazy dog.",
    "  two  spaces,\ttabs\tand\n\nblank lines  ",
    "3.14159 2026-01-31 0x1F 1,000,000",
    "naïve café Ångström façade",
    "東京で日本語のテキスト",
    "emoji 🙂👍 and symbols ∑ ≤ →",
    "<|im_start|>user\nHi<|im_end|>",
)


@dataclass
class Comparison:
    """Two tokenizers compared id by id.

    Attributes:
        verifier_len / draft_len: the tokenizers' lengths (``len(tokenizer)``: base vocabulary and added tokens).
        differing: ids below both lengths whose token differs (``[(id, verifier token, draft token)]``, the first 10).
        n_differing: how many such ids there are.
        special: special tokens that differ: ``[(role, verifier, draft)]`` for bos/eos/pad/unk (token and id).
        added: added tokens that differ: ``[(content, verifier id, draft id)]``.
        encodings: probe texts encoded differently: ``[(text, verifier ids, draft ids)]``.
        chat_template: ``same``, ``differ``, ``verifier only``, ``draft only`` or ``none``.
    """

    verifier_len: int
    draft_len: int
    differing: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    n_differing: int = 0
    special: list[tuple[str, str, str]] = field(default_factory=list)
    added: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    encodings: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    chat_template: str = "none"

    @property
    def same_map(self) -> bool:
        """One token -> id map: the same length and the same token at every id."""
        return self.verifier_len == self.draft_len and self.n_differing == 0


def compare(verifier_tok: Any, draft_tok: Any, texts: tuple[str, ...] | list[str] = PROBE_TEXTS) -> Comparison:
    """Compare two transformers tokenizers: every id's token, the special and added tokens, the encodings of
    ``texts`` and the chat templates."""
    vmap = _id_to_token(verifier_tok)
    dmap = _id_to_token(draft_tok)
    out = Comparison(len(verifier_tok), len(draft_tok))
    for i in range(min(out.verifier_len, out.draft_len)):
        if vmap.get(i) != dmap.get(i):
            out.n_differing += 1
            if len(out.differing) < 10:
                out.differing.append((i, vmap.get(i), dmap.get(i)))
    for role in ("bos", "eos", "pad", "unk"):
        a = (getattr(verifier_tok, f"{role}_token", None), getattr(verifier_tok, f"{role}_token_id", None))
        b = (getattr(draft_tok, f"{role}_token", None), getattr(draft_tok, f"{role}_token_id", None))
        if a != b:
            out.special.append((role, _token_str(*a), _token_str(*b)))
    va, da = _added(verifier_tok), _added(draft_tok)
    out.added = [(c, va.get(c), da.get(c)) for c in sorted(set(va) | set(da)) if va.get(c) != da.get(c)]
    for text in texts:
        a, b = _encode(verifier_tok, text), _encode(draft_tok, text)
        if a != b:
            out.encodings.append((text, a, b))
    ta, tb = getattr(verifier_tok, "chat_template", None), getattr(draft_tok, "chat_template", None)
    out.chat_template = ("none" if not ta and not tb else "verifier only" if not tb else "draft only" if not ta
                         else "same" if ta == tb else "differ")
    return out


def _id_to_token(tok: Any) -> dict[int, str]:
    return {i: t for t, i in tok.get_vocab().items()}


def _added(tok: Any) -> dict[str, int]:
    return {str(t.content if hasattr(t, "content") else t): int(i) for i, t in (getattr(tok, "added_tokens_decoder", None) or {}).items()}


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _token_str(token: Any, i: Any) -> str:
    return "none" if token is None else f"{token!r} = {i}"


# --------------------------------------------------------------------------- the token-level intersection


@dataclass
class Intersection:
    """The token-level intersection of two vocabularies, as vLLM's ``VocabMapping`` builds it.

    Attributes:
        target_to_draft: [V] the draft id of each verifier id, -1 outside the intersection.
        draft_to_target: [Vd] the verifier id of each draft id, -1 outside it.
        size: tokens in the intersection.
        draft_unk / target_unk: the ids a token outside the intersection becomes (unk, else eos).
        source: ``vllm X`` when vLLM's own class computed it, ``specfmt`` for :func:`_vllm_like`.
    """

    target_to_draft: list[int]
    draft_to_target: list[int]
    size: int
    draft_unk: int
    target_unk: int
    source: str

    def to_draft(self, ids: list[int]) -> list[int]:
        """Verifier ids as the draft reads them (``map_target_to_draft_ids``: outside the intersection, the draft's unk)."""
        t2d = self.target_to_draft
        return [t2d[i] if 0 <= i < len(t2d) and t2d[i] >= 0 else self.draft_unk for i in ids]

    def to_target(self, ids: list[int]) -> list[int]:
        """Draft ids as the verifier reads them (``map_draft_to_target_ids``)."""
        d2t = self.draft_to_target
        return [d2t[i] if 0 <= i < len(d2t) and d2t[i] >= 0 else self.target_unk for i in ids]

    def share_inside(self, ids: list[int]) -> float:
        """The share of verifier ids ``ids`` inside the intersection (1.0 for none)."""
        t2d = self.target_to_draft
        return sum(1 for i in ids if 0 <= i < len(t2d) and t2d[i] >= 0) / len(ids) if ids else 1.0


def intersection(verifier_tok: Any, draft_tok: Any, verifier_rows: int, draft_rows: int) -> Intersection:
    """The token-level intersection vLLM's ``use_heterogeneous_vocab`` serves the pair with.

    vLLM's own ``VocabMapping`` computes it when vLLM imports (its ``vocab_mapping.py``, 0.30-0.33); else
    :func:`_vllm_like`, the same rules.

    Raises:
        ValueError: a tokenizer has neither an unk nor an eos token (vLLM refuses the pair the same way).
    """
    try:
        from vllm.v1.spec_decode.vocab_mapping import VocabMapping
    except ImportError:
        return _vllm_like(verifier_tok, draft_tok, verifier_rows, draft_rows)
    import vllm

    import logging

    log = logging.getLogger(VocabMapping.__module__)  # vLLM's init_logger: a logger per module
    level = log.level
    log.setLevel(logging.ERROR)  # its notes (a missing unk token) are vLLM's to print when it serves, not ours
    try:
        m = VocabMapping(verifier_tok, draft_tok, verifier_rows, draft_rows, "cpu")
    finally:
        log.setLevel(level)
    return Intersection(m.target_to_draft_ids.tolist(), m.draft_to_target_ids.tolist(), m.intersection_size,
                        m.draft_unk_token_id, m.target_unk_token_id, f"vllm {vllm.__version__}")


def _space_prefix(tok: Any) -> tuple[str, ...]:
    """vLLM's ``_detect_space_prefix``: the marker of a word-initial space, read by tokenizing ``" a"``."""
    try:
        ids = tok.encode(" a", add_special_tokens=False)
        if ids:
            s = tok.convert_ids_to_tokens(ids[0])
            if isinstance(s, str) and len(s) > 1 and s.endswith("a") and s[0] not in (" ", "\t"):
                return (s[:-1],)
    except Exception:  # noqa: BLE001 - vLLM falls back the same way on any failure
        pass
    return ("\u0120", "\u2581")


def _normalised(tok: Any) -> dict[str, int]:
    prefixes = _space_prefix(tok)
    out: dict[str, int] = {}
    for token, i in tok.get_vocab().items():
        norm = next((" " + token[len(p):] for p in prefixes if token.startswith(p)), token)
        out.setdefault(norm, i)
    return out


def _unk(tok: Any, role: str) -> int:
    for attr in ("unk_token_id", "eos_token_id"):
        i = getattr(tok, attr, None)
        if i is not None:
            return int(i)
    raise ValueError(f"the {role} tokenizer has neither an unk nor an eos token, so a token outside the intersection has no id")


def _vllm_like(verifier_tok: Any, draft_tok: Any, verifier_rows: int, draft_rows: int) -> Intersection:
    """vLLM 0.32's ``VocabMapping.__init__`` without vLLM: normalised token strings (word-initial space marker to
    a space, the first id kept for a repeated string), their intersection, ids past either model's rows left out."""
    t, d = _normalised(verifier_tok), _normalised(draft_tok)
    t2d, d2t = [-1] * verifier_rows, [-1] * draft_rows
    size = 0
    for norm in t.keys() & d.keys():
        ti, di = t[norm], d[norm]
        if ti < verifier_rows and di < draft_rows:
            t2d[ti], d2t[di] = di, ti
    size = sum(1 for x in d2t if x >= 0)
    return Intersection(t2d, d2t, size, _unk(draft_tok, "draft"), _unk(verifier_tok, "target"), "specfmt")


def translator_pairs(verifier_tok: Any, draft_tok: Any, verifier_rows: int) -> dict[int, int] | None:
    """transformers' token map for a pair with different tokenizers, ``{verifier id: draft id}``, as its own
    ``AssistantToTargetTranslator`` builds it (what ``UniversalSpeculativeDecodingGenerator`` uses when sampling);
    None when the installed transformers has no such class."""
    try:
        from transformers.generation.candidate_generator import AssistantToTargetTranslator
    except ImportError:
        return None
    tr = AssistantToTargetTranslator(verifier_tok, draft_tok, verifier_rows)
    return dict(tr.target_to_assistant_input_ids)


__all__ = ["Comparison", "Intersection", "PROBE_TEXTS", "compare", "intersection", "translator_pairs"]
