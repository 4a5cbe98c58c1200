"""The Hugging Face Hub, publishing: ``push`` (plan, model card, transport, upload failures); resolving and downloading inputs is :mod:`specfmt.sources`'."""
