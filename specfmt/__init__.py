"""specfmt: convert, validate and publish speculative-decoding draft models.

A *draft* (or speculator) proposes tokens that a *verifier* checks in one pass.
specfmt turns research checkpoints (EAGLE-3, ...) into the versioned speculators
format that ``vllm serve DIR`` runs with no extra flags, and proves the result.

The package imports nothing heavy at top level: torch and transformers are
imported only by the code paths that need them.

Layers, bottom to top. A module imports only modules of its own layer or a lower one,
never a higher one, and no two modules import each other, even through others.
``tests/test_architecture.py`` reads this list and checks every import statement
(function-level and ``TYPE_CHECKING`` ones included); a module in no layer fails it.
A package named here covers all its modules; ``specfmt`` alone is this ``__init__``.

0. ``specfmt``, ``specfmt.errors``, ``specfmt.interrupt``: the version numbers, the error hierarchy, and Ctrl-C;
1. ``specfmt.checkpoint``: tensor files: reading, writing, dtypes, finiteness, output folders;
2. ``specfmt.sources``: resolving inputs (local folders, Hub downloads), the verifier and where it runs;
3. ``specfmt.format``: the format: the JSON Schema, config blocks, tensor specs, provenance;
4. ``specfmt.algorithms``, ``specfmt.serving``: each algorithm's rules, tensors and reference
   proposer, the checks built on them, and how vLLM serves a draft;
5. ``specfmt.converters``, ``specfmt.convert``, ``specfmt.detect``, ``specfmt.draft``, ``specfmt.export``: producing a draft,
   and writing one in another engine's layout (``specfmt export --to sglang``);
6. ``specfmt.validation.report``, ``specfmt.validation.static``: the checks' report, and the static checks of a draft;
7. ``specfmt.methods``: the proposal methods behind one interface (a speculators draft, a draft LM, the methods
   without weights), found by one registry; each method's static checks are the ones below it;
8. ``specfmt.validation``: running a draft or any proposal method (``validate --run``, ``compare``);
9. ``specfmt.datagen``: training data made by the verifier (hidden states, loss masks: ``specfmt datagen``;
   the verifier's own responses: ``specfmt regenerate``);
10. ``specfmt.training``: training a draft (it reads datagen's output; datagen never imports the trainer);
11. ``specfmt.hub``: publishing to the Hugging Face Hub;
12. ``specfmt.cli``, ``specfmt.__main__``: the command line.
"""

__version__ = "0.1.0"

#: Version of the specfmt format (the ``$id`` of ``schemas/config-v1.schema.json``).
FORMAT_VERSION = 1
