"""Proposal methods: what proposes the draft tokens, behind one interface (:mod:`.base`), found by one registry.

* :mod:`~specfmt.methods.base`: the interface (:class:`~specfmt.methods.base.ProposalMethod`), its
  :class:`~specfmt.methods.base.Cost` and :class:`~specfmt.methods.base.EngineRun`;
* :mod:`~specfmt.methods.speculators`: a speculators-format draft (EAGLE-3, Medusa, DFlash, ...), an adapter
  over :class:`specfmt.algorithms.base.Algorithm`; also what any folder no other method claims is read as,
  so that its checks say what the folder is;
* :mod:`~specfmt.methods.draft_lm`: a small causal LM as the draft (vLLM's ``draft_model``, transformers'
  ``assistant_model``), with :mod:`~specfmt.methods.pair` (the pair checks), :mod:`~specfmt.methods.vocab`
  (tokenizer identity, the token-level intersection) and :mod:`~specfmt.methods.padding` (the padding fix);
* :mod:`~specfmt.methods.ngram` and :mod:`~specfmt.methods.suffix`: the methods without weights (vLLM's ``ngram`` and
  ``suffix``), named by their built-in names, on :mod:`~specfmt.methods.weightless`.

**The one place a method's name is read** is :func:`resolve` here: what the user named -- a folder, a Hub
id or a built-in name (issue 37 adds ``ngram`` and ``suffix``) -- becomes a method. The code that uses a
method never compares its name (``tests/test_methods.py`` checks it, as ``tests/test_architecture.py``
does for the algorithms).
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.files import CONFIG_FILE, read_json
from ..errors import InputError, SpecfmtError
from ..sources.resolve import resolve as resolve_path
from .base import PATTERNS, REGISTRY, Cost, EngineRun, ProposalMethod, ReferenceContext, Transformers, register

def builtin_names() -> list[str]:
    """Every built-in name a user may give instead of a folder (``ngram``, ``suffix`` once registered)."""
    return [n for cls in REGISTRY for n in cls.builtin_names]


def resolve(named: str, *, revision: str | None = None) -> ProposalMethod:
    """The proposal method ``named`` stands for.

    A built-in name (:func:`builtin_names`) is its method. Anything else is a folder or Hub id: each registered
    kind is asked in turn whether the folder is one of its kind (:meth:`ProposalMethod.claim`); the speculators
    kind, asked last, takes any folder, so that its static checks say what the folder is (a research draft
    names its ``specfmt convert`` line).

    Raises:
        InputError, HubError: ``named`` is neither a built-in name nor a folder or Hub id that can be fetched.
    """
    for cls in REGISTRY:
        if named in cls.builtin_names:
            return cls.builtin(named)
    resolved = resolve_path(named, allow_patterns=["*.json"], revision=revision, what="draft")  # a kind fetches the rest when it needs it
    config: dict[str, Any] | None = None
    if (resolved.folder / CONFIG_FILE).is_file():
        try:
            config = read_json(resolved.folder / CONFIG_FILE)
        except SpecfmtError:
            config = None  # the fallback's checks report it
    for cls in sorted(REGISTRY, key=lambda c: c.fallback):  # the fallback kind is asked last
        method = cls.claim(resolved, config)
        if method is not None:
            return method
    raise InputError(f"no proposal method reads {named}", hint="give a speculators-format draft folder or a causal LM folder")


from . import draft_lm, ngram, speculators, suffix  # noqa: E402, F401, I001  (each registers itself)

__all__ = ["Cost", "EngineRun", "PATTERNS", "ProposalMethod", "REGISTRY", "ReferenceContext", "Transformers", "builtin_names", "register", "resolve"]
