"""Training data from the verifier: hidden states, loss masks and the verifier's own responses,
in speculators 0.9's on-disk layout (``specfmt datagen``)."""
