"""The Hugging Face Hub: resolving model references, and publishing drafts (plan, model card, transport)."""
