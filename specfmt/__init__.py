"""specfmt: convert, validate and publish speculative-decoding draft models.

A *draft* (or speculator) proposes tokens that a *verifier* checks in one pass.
specfmt turns research checkpoints (EAGLE-3, ...) into the versioned speculators
format that ``vllm serve DIR`` runs with no extra flags, and proves the result.

The package imports nothing heavy at top level: torch and transformers are
imported only by the code paths that need them.
"""

__version__ = "0.1.0"

#: Version of the specfmt format (the ``$id`` of ``schemas/config-v1.schema.json``).
FORMAT_VERSION = 1
