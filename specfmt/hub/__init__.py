"""The Hugging Face Hub, publishing: ``push`` (plan, model card, transport, upload failures); inputs are resolved and downloaded by :mod:`specfmt.sources`."""
