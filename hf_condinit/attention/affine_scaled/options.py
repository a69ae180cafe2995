"""The condinit options of Affine-Scaled Attention, with their defaults (`hf_condinit.config.CondInitConfig` documents
and checks them)."""

#: ``affine_rho``: EMA factor of α_ma; ``affine_bias_length``: β divides by the ``"visible"`` key count or the
#: ``"full"`` key length
AFFINE_SCALED_OPTIONS = {"affine_rho": 0.9, "affine_bias_length": "visible"}
