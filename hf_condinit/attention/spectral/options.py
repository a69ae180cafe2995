"""The condinit options of spectral conditioning, with their defaults (`hf_condinit.config.CondInitConfig` documents
and checks them)."""

#: ``spectral_lambda``: λ, None = off; ``spectral_mode``: ``"identity"`` (C = λ·E) or ``"svd"`` (κ(W + C) ≤ 2)
SPECTRAL_OPTIONS = {"spectral_lambda": None, "spectral_mode": "identity"}
