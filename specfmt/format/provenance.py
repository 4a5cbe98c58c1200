"""The ``specfmt`` provenance block of config.json: where a checkpoint came from and what happened
to every source tensor (vLLM ignores the block; ``specfmt push`` turns it into the model card)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from .. import FORMAT_VERSION, __version__
from .model import ConfigModel, Def, Nullable, Schema

#: a sha256 digest, lowercase hex
Sha256 = Annotated[str, Schema({"pattern": "^[0-9a-f]{64}$"}), Def("sha256")]
#: an ISO 8601 UTC time (:func:`utc_now`)
DateTime = Annotated[str, Schema({"format": "date-time"})]


class ProvenanceSource(ConfigModel):
    """``specfmt.source``: what was read."""

    schema_name: ClassVar[str] = "provenance_source"

    format: str
    layout: str
    name_or_path: str = None
    revision: Nullable[str] = None
    files: dict[str, Sha256] = Field(description="sha256 of every source file read, by file name.")


class ProvenanceTensors(ConfigModel):
    """``specfmt.tensors``: what happened to every source tensor."""

    schema_name: ClassVar[str] = "provenance_tensors"

    renamed: dict[str, str] = None
    kept: list[str] = None
    dropped: dict[str, str] = None
    folded: dict[str, str] = Field(None, description="source tensors whose values were moved exactly into other output tensors, with how")
    derived: dict[str, str] = Field(None, description="output tensors computed (not copied) from source or verifier tensors, with how")


class Upgrade(ConfigModel):
    """One entry of ``specfmt.upgrades`` (:func:`carry_provenance`)."""

    specfmt_version: str
    created: DateTime
    source: ProvenanceSource
    tensors: ProvenanceTensors = None
    changes: list[str] = Field(description="what the upgrade changed in config.json, one JSON path per line (specfmt upgrade prints them)")


class Provenance(ConfigModel):
    """The ``specfmt`` block. Unknown keys are allowed (``specfmt train`` adds ``train``)."""

    schema_name: ClassVar[str] = "provenance"
    schema_description: ClassVar[str] = "Where the checkpoint came from. vLLM ignores this block."

    format_version: Literal[1]
    specfmt_version: str
    created: DateTime
    source: ProvenanceSource
    tensors: ProvenanceTensors = Field(None, description="What happened to every source tensor.")
    upgrades: list[Upgrade] = Field(None, description=(
        "Later rewrites by specfmt upgrade (convert --from speculators) that changed something, oldest first; source, tensors, created "
        "and specfmt_version above keep describing the first conversion. An upgrade that changes nothing leaves the block as it was."))


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a ``Z`` and whole seconds (the ``created`` field)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def provenance_block(
    *,
    source_format: str,
    layout: str,
    name_or_path: str,
    revision: str | None,
    files: dict[str, str],
    renamed: dict[str, str],
    kept: list[str],
    dropped: dict[str, str],
    created: str,
    folded: dict[str, str] | None = None,
    derived: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``specfmt`` provenance block (ignored by vLLM).

    Args:
        files: sha256 (hex) of every source file read, by file name.
        renamed / kept / dropped / folded: what happened to every source tensor
            (dropped and folded map a tensor to the reason).
        derived: output tensors computed rather than copied, with how.
        created: ISO 8601 UTC time.
    """
    return Provenance(
        format_version=FORMAT_VERSION,
        specfmt_version=__version__,
        created=created,
        source=ProvenanceSource(format=source_format, layout=layout, name_or_path=name_or_path, revision=revision, files=dict(sorted(files.items()))),
        tensors=ProvenanceTensors(renamed=renamed, kept=kept, dropped=dropped, folded=dict(folded or {}), derived=dict(derived or {})),
    ).dump()


def provenance_violations(block: Any) -> list[tuple[str, str]]:
    """Violations of the schema's provenance definition by a ``specfmt`` block alone,
    ``[(json_path, message), ...]`` with paths under ``$.specfmt``; empty when it is valid."""
    from jsonschema import Draft202012Validator

    from .schema import load_schema

    defs = load_schema()["$defs"]
    validator = Draft202012Validator({"$ref": "#/$defs/provenance", "$defs": defs}, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return sorted(("$.specfmt" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path), e.message)
                  for e in validator.iter_errors(block))


def carry_provenance(earlier: dict[str, Any], step: dict[str, Any], *, unchanged: bool, changes: list[str]) -> dict[str, Any]:
    """The provenance of a rewrite of a checkpoint that already has one (``specfmt upgrade`` of a
    folder specfmt wrote): the original conversion is what the block describes, and stays so.

    * ``unchanged`` (no config change, every tensor kept byte for byte under its name): the block
      is ``earlier`` as it was, so the rewritten config equals the original one.
    * otherwise: ``earlier`` with one more entry in its ``upgrades`` list -- the step's
      ``specfmt_version`` and ``created``, its ``source`` (the folder read, with the sha256 of its
      files), its ``tensors`` (what happened to each) and the config ``changes``
      (:func:`specfmt.convert.config_changes` lines). ``source``, ``tensors``, ``created`` and
      ``specfmt_version`` at the top keep describing the first conversion (or training).

    Args:
        earlier: the source's ``specfmt`` block (schema-valid: :func:`provenance_violations`).
        step: the block this rewrite alone would get (:func:`provenance_block`).
        unchanged: the rewrite changed nothing.
        changes: what it changed in config.json, one line per JSON path.
    """
    import copy

    block = copy.deepcopy(earlier)
    if unchanged:
        return block
    block["upgrades"] = [*block.get("upgrades", []), {
        "specfmt_version": step["specfmt_version"],
        "created": step["created"],
        "source": copy.deepcopy(step["source"]),
        "tensors": copy.deepcopy(step["tensors"]),
        "changes": list(changes),
    }]
    return block


def provenance_source(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg["specfmt"]["source"]`` when both are objects, else ``{}`` (what a config says it was
    converted from, for display; never raises)."""
    block = cfg.get("specfmt")
    source = block.get("source") if isinstance(block, dict) else None
    return source if isinstance(source, dict) else {}
