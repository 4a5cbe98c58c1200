"""Training: data and the verifier's features, the training loop, and the ``specfmt train`` pipeline."""
