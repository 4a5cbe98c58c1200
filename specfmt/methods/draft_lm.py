"""A small causal LM as the draft: vLLM's ``draft_model`` method, transformers' ``assistant_model``.

The oldest kind of speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small LM of the
verifier's family proposes k tokens one after another, the verifier checks them in one pass. Served as

* vLLM: ``--speculative-config '{"method": "draft_model", "model": D, "num_speculative_tokens": k}'``, plus
  ``"use_heterogeneous_vocab": true`` for a draft with its own tokenizer (``vllm/v1/spec_decode/draft_model.py``,
  ``DraftModelProposer``; ``vocab_mapping.py``, PR #38174; greedy draft sampling only);
* transformers: ``model.generate(..., assistant_model=D)``, plus ``tokenizer=T, assistant_tokenizer=TD``
  for different tokenizers ("universal assisted decoding", transformers >= 4.46, PR #33383).

What the pair is -- one tokenizer, one tokenizer with padding rows, or two tokenizers -- decides how each
engine serves it (:class:`Pair`, from :mod:`.vocab`); :mod:`.pair` checks it, :mod:`.padding` fixes the padding.

The reference proposer (:class:`DraftChain`) runs the draft as vLLM's proposer does, greedy: the draft reads
the sequence (mapped to its ids through the token-level intersection for two tokenizers, as vLLM's
``map_target_to_draft_ids``), proposes k tokens with its KV cache (its logits masked to the intersection and
mapped back, as vLLM's ``_greedy_sample``), and keeps the cache of the verified positions for the next step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import InputError, SpecfmtError
from ..serving import CHECKED_RELEASES, ServeCommand, _launcher, _releases
from .base import Cost, EngineRun, ProposalMethod, ReferenceContext, Transformers, Variant, register
from .vocab import Comparison, Intersection, compare, intersection
from .weights import parameters_read

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer, VerifierStates
    from ..sources.placement import Placement
    from ..sources.resolve import Resolved
    from ..sources.verifier import Verifier
    from ..validation.report import Report

#: vLLM's method for a draft LM (``SpeculativeConfig.method``)
VLLM_METHOD = "draft_model"

#: how a pair's tokenizers stand, in words (:attr:`Pair.relation`)
RELATIONS = {
    "same": "one tokenizer, the same vocabulary size",
    "padded": "one tokenizer; the vocabulary sizes differ by padding rows past the tokenizer's length only",
    "truncated": "one tokenizer, but a model has fewer rows than the tokenizer has tokens",
    "different": "two tokenizers (the token -> id maps differ), different vocabulary sizes",
    "different-same-size": "two tokenizers (the token -> id maps differ) with the same vocabulary size",
}


@dataclass
class Pair:
    """A draft LM and its verifier, as the engines see them.

    Attributes:
        draft_rows / verifier_rows: ``vocab_size`` of each config (the embedding's and output head's rows).
        tokens: the tokenizers compared (:func:`~specfmt.methods.vocab.compare`).
        relation: a key of :data:`RELATIONS`.
        intersection: for two tokenizers, the token-level intersection vLLM serves the pair with (else None).
    """

    draft_rows: int
    verifier_rows: int
    tokens: Comparison
    relation: str
    intersection: Intersection | None = None

    @property
    def heterogeneous(self) -> bool:
        """Two tokenizers: vLLM needs ``use_heterogeneous_vocab``."""
        return self.relation.startswith("different")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"relation": self.relation, "draft_vocab_size": self.draft_rows, "verifier_vocab_size": self.verifier_rows,
                               "draft_tokenizer_length": self.tokens.draft_len, "verifier_tokenizer_length": self.tokens.verifier_len}
        if self.intersection is not None:
            out["intersection"] = {"size": self.intersection.size, "computed_by": self.intersection.source}
        return out


def relation_of(tokens: Comparison, draft_rows: int, verifier_rows: int) -> str:
    """The key of :data:`RELATIONS` for two tokenizers compared and the two models' row counts."""
    if not tokens.same_map:
        return "different-same-size" if draft_rows == verifier_rows else "different"
    if min(draft_rows, verifier_rows) < tokens.verifier_len:
        return "truncated"
    return "same" if draft_rows == verifier_rows else "padded"


def _vocab_size(cfg: dict[str, Any]) -> int:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return int(text["vocab_size"])


@register
class DraftLM(ProposalMethod, Transformers):
    """A causal LM folder used as the draft of a verifier (vLLM ``draft_model``; transformers ``assistant_model``).

    Attributes:
        config: its config.json.
    """

    name = VLLM_METHOD

    def __init__(self, named: str, resolved: "Resolved", config: dict[str, Any]) -> None:
        super().__init__(named, resolved)
        self.config = config
        self._pairs: dict[str, Pair] = {}
        self._model: Any = None

    @classmethod
    def claim(cls, resolved: "Resolved", config: dict[str, Any] | None) -> "DraftLM | None":
        """A folder whose config has no ``speculators_config`` and whose weights are a full decoder stack with its
        embeddings (what :func:`specfmt.detect.detect` calls ``causal-lm``)."""
        if not isinstance(config, dict) or "speculators_config" in config or "vocab_size" not in (config.get("text_config") or config):
            return None
        from ..detect import detect
        from ..sources.resolve import fetch
        from .base import PATTERNS

        try:
            found = detect(fetch(resolved, PATTERNS))  # a Hub id's weights and tokenizer come now (a local folder: nothing to do)
        except SpecfmtError:
            return None
        return cls(resolved.name_or_path, resolved, config) if found.format == "causal-lm" else None

    # -- what it is ------------------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"draft model ({self.config.get('model_type', 'causal LM')})"

    @property
    def vocab_size(self) -> int:
        return _vocab_size(self.config)

    @cached_property
    def lm(self) -> "Verifier":
        """The draft as a causal LM resolved once (its config, tokenizer and weights), through the verifier's loader."""
        from ..sources.verifier import Verifier

        return Verifier.load(self.ref)

    def tokenizer(self) -> Any:
        """The draft's own tokenizer (transformers).

        Raises:
            InputError: the folder holds no tokenizer transformers can load.
        """
        try:
            return self.lm.tokenizer()
        except (OSError, ValueError) as e:
            raise InputError(f"the draft's tokenizer cannot be loaded: {str(e).splitlines()[0][:200]}", where=str(self.folder),
                             hint="save the tokenizer the draft was trained with into its folder (tokenizer.json, tokenizer_config.json)") from None

    def pair(self, verifier: "Verifier") -> Pair:
        """The pair with ``verifier`` (computed once per verifier: both tokenizers loaded and compared).

        Raises:
            InputError: a tokenizer cannot be loaded.
        """
        key = verifier.name_or_path
        if key not in self._pairs:
            try:
                vtok = verifier.tokenizer()
            except (OSError, ValueError) as e:
                raise InputError(f"the verifier's tokenizer cannot be loaded: {str(e).splitlines()[0][:200]}", where=verifier.name_or_path) from None
            dtok = self.tokenizer()
            tokens = compare(vtok, dtok)
            rel = relation_of(tokens, self.vocab_size, verifier.info.vocab_size)
            inter = intersection(vtok, dtok, verifier.info.vocab_size, self.vocab_size) if rel.startswith("different") else None
            self._pairs[key] = Pair(self.vocab_size, verifier.info.vocab_size, tokens, rel, inter)
        return self._pairs[key]

    # -- static checks -----------------------------------------------------------------------------

    def static_checks(self, verifier: "str | Verifier | None") -> "Report":
        from .pair import pair_checks

        return pair_checks(self, verifier)

    def describe(self, verifier: "Verifier") -> dict[str, Any]:
        return {"pair": self.pair(verifier).to_json()}

    def reference_notes(self, ctx: ReferenceContext, result: Any) -> dict[str, Any]:
        """For two tokenizers: the share of the verifier's greedy tokens inside the intersection (the others reach the
        draft as its unk/eos token in vLLM and in the reference)."""
        inter = self.pair(ctx.verifier).intersection
        if inter is None:
            return {}
        ids = [t for path in result.token_ids for t in path]
        return {"greedy_tokens_inside_intersection": round(inter.share_inside(ids), 4)}

    def runnable(self, report: "Report") -> str | None:
        failed = [c.name for c in report.checks if c.status == "fail"]
        return f"the pair fails its static checks ({', '.join(failed)})" if failed else None

    # -- the reference -------------------------------------------------------------------------------

    def model(self, placement: "Placement") -> Any:
        """The draft as a transformers causal LM in ``placement`` (loaded once)."""
        try:
            return self.lm.load_model(placement)
        except (OSError, ValueError) as e:
            raise InputError(f"the draft cannot be loaded with transformers: {str(e).splitlines()[0][:200]}", where=str(self.folder)) from None

    def readings(self, ctx: ReferenceContext) -> list[Variant]:
        """As vLLM serves it; for two tokenizers also through text, as transformers' greedy assisted generation maps
        tokens (another way to serve the files, measured beside, never failed on: :class:`TextChain`)."""
        out = [Variant(None, "as written", self.config)]
        if self.pair(ctx.verifier).heterogeneous:
            out.append(Variant("text mapping", "through text (transformers' assistant_tokenizer)", self.config, {"text": True}, rival=False))
        return out

    def proposer(self, reading: Variant, ctx: ReferenceContext) -> "Proposer":
        pair = self.pair(ctx.verifier)
        if reading.extra.get("text"):
            return TextChain(self.model(ctx.placement), ctx.verifier.tokenizer(), self.tokenizer())
        return DraftChain(self.model(ctx.placement), pair.intersection)

    # -- vLLM ----------------------------------------------------------------------------------------

    def speculative_config(self, verifier: "Verifier", k: int) -> dict[str, Any]:
        """vLLM's ``speculative_config`` for the pair: ``draft_model``, the draft, k; ``use_heterogeneous_vocab``
        for two tokenizers."""
        spec: dict[str, Any] = {"method": VLLM_METHOD, "model": self.ref, "num_speculative_tokens": k}
        if self.pair(verifier).heterogeneous:
            spec["use_heterogeneous_vocab"] = True
        return spec

    def _verifier(self, verifier: "str | Verifier | None") -> "Verifier":
        from ..sources.verifier import Verifier

        if verifier is None:
            raise InputError("a draft model names no verifier", where=str(self.folder), hint="pass --verifier FOLDER_OR_HUB_ID")
        return verifier if isinstance(verifier, Verifier) else Verifier.load(verifier)

    def vllm_engine(self, verifier: str, version: str | None, k: int) -> EngineRun:
        return EngineRun(verifier, self.speculative_config(self._verifier(verifier), k), "explicit", VLLM_METHOD)

    def serve_command(self, version: str, *, verifier: "str | Verifier | None" = None, distribution: str | None = None) -> ServeCommand | None:
        """``vllm serve VERIFIER --speculative-config {...}`` on every checked release (0.30-0.33 all have
        ``draft_model`` and ``use_heterogeneous_vocab``); None for a pair no release serves (:meth:`refusal`)."""
        ver = self._verifier(verifier)
        if self.refusal(ver) is not None:
            return None
        spec = self.speculative_config(ver, self.default_k())
        argv = (*_launcher(distribution), ver.name_or_path, "--speculative-config", json.dumps(spec))
        return ServeCommand(argv, "explicit", _releases(list(CHECKED_RELEASES)), spec)

    def serving_note(self, verifier: "str | Verifier | None" = None) -> str:
        return (self.refusal(self._verifier(verifier)) or "") if verifier is not None else ""

    def refusal(self, verifier: "Verifier") -> str | None:
        """Why vLLM 0.30-0.33 do not serve the pair, with what fixes it (a clause after "vLLM cannot serve it: "); None when they do."""
        pair = self.pair(verifier)
        if pair.relation == "padded":
            return (f"the vocabulary sizes differ ({pair.draft_rows} and {pair.verifier_rows} rows; "
                    "SpeculativeConfig.verify_equal_vocab_size_if_draft_model), although only by padding rows; "
                    f"`specfmt pad-vocab {self.named} --verifier {verifier.ref} -o OUT` writes a draft with {pair.verifier_rows} rows")
        if pair.relation == "truncated":
            return (f"a model has fewer rows than the tokenizer's {pair.tokens.verifier_len} tokens (draft {pair.draft_rows}, verifier "
                    f"{pair.verifier_rows}): the sizes differ, and ids past the rows cannot be embedded")
        return None

    # -- transformers ----------------------------------------------------------------------------------

    def generate_kwargs(self, verifier: "Verifier", placement: "Placement", k: int) -> dict[str, Any]:
        """``assistant_model`` (k tokens per step, a constant schedule, no confidence stop), and for two tokenizers
        ``tokenizer``/``assistant_tokenizer``.

        Raises:
            InputError: transformers cannot run this pair (:meth:`transformers_refusal`).
        """
        why = self.transformers_refusal(verifier)
        if why:
            raise InputError(why)
        model = self.model(placement)
        fixed_k(model.generation_config, k)
        out: dict[str, Any] = {"assistant_model": model}
        if self.pair(verifier).draft_rows != self.pair(verifier).verifier_rows:  # transformers' own rule (generation/utils.py)
            out.update(tokenizer=verifier.tokenizer(), assistant_tokenizer=self.tokenizer())
        return out

    def transformers_refusal(self, verifier: "Verifier") -> str | None:
        """Why transformers' assisted generation cannot run the pair correctly, or None."""
        pair = self.pair(verifier)
        if pair.relation == "different-same-size":
            return ("transformers takes equal vocabulary sizes for one tokenizer: it refuses assistant_tokenizer for them "
                    "(generation/utils.py) and would feed the draft the verifier's ids")
        return None

    def mapping(self, verifier: "Verifier") -> str:
        pair = self.pair(verifier)
        if pair.draft_rows == pair.verifier_rows:
            return "one tokenizer: the draft reads the verifier's ids"
        return "assistant_tokenizer: the verifier's tokens decoded to text and re-encoded for the draft, and back"

    def agreement_note(self, verifier: "Verifier") -> str:
        pair = self.pair(verifier)
        if pair.draft_rows == pair.verifier_rows:
            return ""
        return ("transformers maps the two vocabularies through text (decode, re-encode: a draft token may become several verifier "
                "tokens or part of one, and a verifier token outside the draft's vocabulary still reaches it as its own text), vLLM and the "
                "reference through the token-level intersection (a verifier token outside it reaches the draft as its unk/eos token); "
                "the two are different drafts of the same model")

    def generate_call(self, verifier: str, k: int) -> str:
        ver = self._verifier(verifier)
        two = self.pair(ver).draft_rows != self.pair(ver).verifier_rows
        lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                 f"tokenizer = AutoTokenizer.from_pretrained({ver.name_or_path!r})",
                 f"model = AutoModelForCausalLM.from_pretrained({ver.name_or_path!r})",
                 f"assistant = AutoModelForCausalLM.from_pretrained({self.ref!r})",
                 f"assistant.generation_config.num_assistant_tokens = {k}  # k drafted tokens per step",
                 "assistant.generation_config.num_assistant_tokens_schedule = \"constant\"  # the default 'heuristic' changes k as it goes",
                 "assistant.generation_config.assistant_confidence_threshold = 0.0  # no early stop of a draft"]
        kwargs = "assistant_model=assistant"
        if two:
            lines.append(f"assistant_tokenizer = AutoTokenizer.from_pretrained({self.ref!r})")
            kwargs += ", tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer"
        lines += ["inputs = tokenizer(\"def main():\", return_tensors=\"pt\")",
                  f"out = model.generate(**inputs, {kwargs}, do_sample=False, max_new_tokens=64)"]
        return "\n".join(lines)

    # -- cost and card -------------------------------------------------------------------------------

    def cost(self, verifier: "Verifier") -> Cost:
        return Cost(parameters_read(self.folder, tied=bool(self.config.get("tie_word_embeddings"))),
                    parameters_read(verifier.model_folder(), tied=verifier.info.tie_word_embeddings), False)

    def card_rows(self) -> list[tuple[str, str]]:
        c = self.config
        return [("draft model", f"{', '.join(c.get('architectures') or [])}: {c.get('num_hidden_layers')} layers, hidden size "
                                f"{c.get('hidden_size')}, vocabulary {self.vocab_size} rows")]


def fixed_k(generation_config: Any, k: int) -> None:
    """Make transformers' assistant draft exactly k tokens per step: ``num_assistant_tokens = k`` with the
    ``constant`` schedule (the default ``heuristic`` adds 2 after a fully accepted draft and drops 1 otherwise,
    ``AssistedCandidateGenerator.update_candidate_strategy``) and no confidence stop (``assistant_confidence_threshold``
    0.4 by default ends a draft when the assistant's probability falls below it)."""
    generation_config.num_assistant_tokens = k
    generation_config.num_assistant_tokens_schedule = "constant"
    generation_config.assistant_confidence_threshold = 0.0


def _keep(cache: Any, n: int) -> None:
    """Keep the first ``n`` positions of a transformers cache (``crop`` with the negative count to drop)."""
    drop = cache.get_seq_length() - n
    if drop > 0:
        cache.crop(-drop)


class DraftChain:
    """Greedy chain drafting of a draft LM, as vLLM's ``DraftModelProposer`` runs it (a :data:`Proposer`).

    Per sequence (by its verifier pass, :attr:`VerifierStates.source`) the draft's KV cache over the verified
    positions is kept; a call runs the positions verified since, then k - 1 one-token passes, and drops the
    drafted positions from the cache.

    Args:
        model: the draft (transformers causal LM, eval mode).
        mapping: for two tokenizers, the token-level intersection (verifier ids -> draft ids on the way in; draft
            logits masked to it and mapped back on the way out); None for one tokenizer.
    """

    KEPT = 64

    def __init__(self, model: Any, mapping: Intersection | None = None) -> None:
        self.model, self.mapping = model, mapping
        self._caches: dict[int, tuple[list[int], Any]] = {}
        self._mask: Any = None

    def _allowed(self, device: Any) -> Any:
        """[Vd] bool: the draft ids inside the intersection (vLLM's ``intersection_mask_draft``)."""
        if self._mask is None:
            import torch

            self._mask = torch.tensor([t >= 0 for t in self.mapping.draft_to_target], device=device)  # type: ignore[union-attr]
        return self._mask

    def __call__(self, tokens: list[int], states: "VerifierStates", k: int) -> list[int]:
        import torch

        ids = tokens if self.mapping is None else self.mapping.to_draft(tokens)
        dev = self.model.get_input_embeddings().weight.device
        seen, past = self._caches.pop(states.source, ([], None))
        common = 0
        while common < min(len(seen), len(ids) - 1) and seen[common] == ids[common]:
            common += 1
        if past is None or common == 0:
            past, common = None, 0
        else:
            _keep(past, common)
        out: list[int] = []
        with torch.no_grad():
            step = self.model(input_ids=torch.tensor([ids[common:]], device=dev), past_key_values=past, use_cache=True)
            for i in range(k):
                logits = step.logits[0, -1]
                if self.mapping is not None:
                    logits = logits[: len(self.mapping.draft_to_target)].masked_fill(~self._allowed(logits.device), float("-inf"))
                out.append(int(logits.argmax()))
                if i + 1 == k:
                    break
                step = self.model(input_ids=torch.tensor([[out[-1]]], device=dev), past_key_values=step.past_key_values, use_cache=True)
        cache = step.past_key_values
        _keep(cache, len(ids))  # the verified positions only
        self._caches[states.source] = (list(ids), cache)
        while len(self._caches) > self.KEPT:
            self._caches.pop(next(iter(self._caches)))
        return out if self.mapping is None else self.mapping.to_target(out)


class TextChain:
    """Greedy drafting of a draft LM with its own tokenizer through text, as transformers' greedy assisted generation
    with ``assistant_tokenizer`` maps tokens (``AssistedCandidateGeneratorDifferentTokenizers``): the verifier's tokens
    are decoded and re-encoded with the draft's tokenizer, the draft proposes k of its tokens, and their text is
    re-encoded with the verifier's. A draft token may so become several verifier tokens, or part of one; the proposal
    is the verifier tokens that extend the sequence, at most k (the loop's limit; transformers takes them all).
    transformers' own alignment of re-encoded windows (its look-behind) is not reproduced: this is the same mapping,
    not the same code. The draft runs over the whole re-encoded text at each step (no cache: re-encoding may change
    earlier tokens)."""

    def __init__(self, model: Any, verifier_tokenizer: Any, draft_tokenizer: Any) -> None:
        self.model, self.vtok, self.dtok = model, verifier_tokenizer, draft_tokenizer

    def __call__(self, tokens: list[int], states: "VerifierStates", k: int) -> list[int]:
        import torch

        text = self.vtok.decode(tokens, skip_special_tokens=True)
        ids = self.dtok.encode(text, add_special_tokens=True)
        dev = self.model.get_input_embeddings().weight.device
        drafted: list[int] = []
        with torch.no_grad():
            step = self.model(input_ids=torch.tensor([ids], device=dev), use_cache=True)
            for i in range(k):
                drafted.append(int(step.logits[0, -1].argmax()))
                if i + 1 == k:
                    break
                step = self.model(input_ids=torch.tensor([[drafted[-1]]], device=dev), past_key_values=step.past_key_values, use_cache=True)
        new = self.dtok.decode(drafted, skip_special_tokens=True)
        base = self.vtok.encode(text, add_special_tokens=False)
        full = self.vtok.encode(text + new, add_special_tokens=False)
        extra = full[len(base):] if full[:len(base)] == base else self.vtok.encode(new, add_special_tokens=False)
        return extra[:k]


__all__ = ["DraftChain", "TextChain", "DraftLM", "Pair", "RELATIONS", "VLLM_METHOD", "fixed_k", "relation_of"]
