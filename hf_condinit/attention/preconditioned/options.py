"""The condinit options of preconditioned attention, with their defaults (`hf_condinit.config.CondInitConfig`
documents and checks them)."""

#: ``precond_eps``: ε of the per-token normalisation; ``precond_scale``: ``"sqrt_d"`` rescales the normalised head
#: outputs by √d
PRECONDITIONED_OPTIONS = {"precond_eps": 1e-6, "precond_scale": "none"}
