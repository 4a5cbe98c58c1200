"""The specfmt format, v1: a speculators ``config.json`` and the tensors it implies.

What a checkpoint in this format is:

* ``config.json`` in the speculators format that vLLM detects by itself
  (``vllm/transformers_utils/config.py::maybe_override_with_speculators``: a
  ``speculators_config`` key), valid against ``schemas/config-v1.schema.json``
  (:mod:`~specfmt.format.schema`), at a known ``speculators_version``
  (:mod:`~specfmt.format.versions`), with a provenance block (:mod:`~specfmt.format.provenance`);
* ``model.safetensors`` (or shards with ``model.safetensors.index.json``) whose tensor
  names and shapes are exactly those the algorithm derives from the config
  (:mod:`specfmt.algorithms`, :class:`~specfmt.format.tensors.TensorSpec`).

Notation in docstrings: H draft hidden size, H_t verifier hidden size, V verifier
vocabulary, Vd draft vocabulary, I intermediate size, nH / nKV attention / KV heads,
d head dim, n_aux number of tap layers, K Medusa heads.
"""

SCHEMA_FILE = "config-v1.schema.json"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
