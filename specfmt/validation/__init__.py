"""Validation: the static checks of a checkpoint, and ``validate --run`` (the draft run by the reference and by vLLM)."""
