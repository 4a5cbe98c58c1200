"""Pieces of a speculators config shared by every algorithm, and the one typed reading of its
``speculators_config`` object for code that reads configs before (or without) the schema.

A config.json can hold any JSON value at any key; the schema check reports that, but detection,
``upgrade``'s verifier lookup and ``push`` read ``speculators_config`` before or without it. They
read it here: :func:`speculators_section` and :func:`verifier_section` give the object or None, or
refuse with one line, and never hand a list or a string to ``.get``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import VerifierInfo


def speculators_block(algorithm: str, speculative_tokens: int, verifier: "VerifierInfo") -> dict[str, Any]:
    """The ``speculators_config`` object: one greedy proposal method of ``speculative_tokens``
    (what vLLM reads as ``num_speculative_tokens``) and the verifier vLLM serves."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier.name_or_path, "architectures": list(verifier.architectures)},
    }


def speculative_tokens(cfg: dict[str, Any]) -> int:
    """k: ``speculators_config.proposal_methods[0].speculative_tokens`` of a schema-valid config."""
    return cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages: ``null``, ``a boolean``, ``a list``..."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def speculators_section(cfg: dict[str, Any], where: str = "config.json") -> dict[str, Any] | None:
    """``cfg["speculators_config"]``: the object, or None when the key is absent.

    Raises:
        InputError: the key is there but holds anything other than an object (``null``, a list,
            a string, a boolean, a number).
    """
    if "speculators_config" not in cfg:
        return None
    section = cfg["speculators_config"]
    if not isinstance(section, dict):
        raise InputError(f"speculators_config is {json_type(section)}, not an object", where=where,
                         hint="a speculators config.json holds speculators_config as {\"algorithm\": ..., \"proposal_methods\": [...], \"verifier\": {...}}")
    return section


def verifier_section(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """``speculators_config.verifier`` when both are objects, else None (never raises: a lookup)."""
    section = cfg.get("speculators_config")
    verifier = section.get("verifier") if isinstance(section, dict) else None
    return verifier if isinstance(verifier, dict) else None


def verifier_ref(cfg: dict[str, Any]) -> str | None:
    """The verifier a speculators config names (``speculators_config.verifier.name_or_path``, a
    non-empty string), or None (absent, or not a string; never raises)."""
    v = (verifier_section(cfg) or {}).get("name_or_path")
    return v if isinstance(v, str) and v else None


def with_verifier(cfg: dict[str, Any], name: str, where: str = "config.json") -> dict[str, Any]:
    """A copy of ``cfg`` whose ``speculators_config.verifier.name_or_path`` is ``name``.

    Raises:
        InputError: ``cfg`` has no ``speculators_config.verifier`` object to write it into.
    """
    import copy

    if verifier_section(cfg) is None:
        raise InputError("config.json has no speculators_config.verifier object to name the verifier in; this is not a speculators "
                         "checkpoint", where=where, hint="push a folder that `specfmt convert -o` or `specfmt train -o` wrote")
    new = copy.deepcopy(cfg)
    new["speculators_config"]["verifier"]["name_or_path"] = name
    return new
