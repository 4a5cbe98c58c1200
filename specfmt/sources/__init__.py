"""Sources: resolving and reading what a command is given, before anything is built from it.

* :mod:`~specfmt.sources.resolve`: a model reference (a local folder or a Hub id) resolved to
  files on disk, downloading from the Hugging Face Hub through huggingface_hub and its cache;
* :mod:`~specfmt.sources.failures`: a failed download as one :class:`~specfmt.errors.HubError` line;
* :mod:`~specfmt.sources.verifier`: the verifier, resolved once and read by name;
* :mod:`~specfmt.sources.placement`: where and in what precision the verifier runs.

Publishing to the Hub is :mod:`specfmt.hub`'s.
"""
