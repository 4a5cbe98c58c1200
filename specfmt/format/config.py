"""Pieces of a speculators config shared by every algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def verifier_ref(cfg: dict[str, Any]) -> str | None:
    """The verifier a speculators config names (``speculators_config.verifier.name_or_path``), or None."""
    v = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return v if isinstance(v, str) and v else None
