"""`AffineScaledHolder`: the state of Affine-Scaled Attention in one attention module (docs/methods.md §5).

Attached as ``condinit_affine``: parameter ``weight`` = W_a, shape **(H, D)** (``nn.Linear`` orientation:
α = φ(F.linear(X, weight)), i.e. W_a of the paper is ``weight.T``), and the persistent fp32 buffer ``alpha_ma`` (H,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..holder_base import CondInitHolder, hf_init_fn

__all__ = ["AFFINE_INPUT_KWARG", "in_backward_recompute", "reduce_over_replicas", "AffineScaledHolder"]

AFFINE_INPUT_KWARG = "condinit_affine_input"
"""Keyword under which the attention input X reaches the affine_scaled attention function (see `AffineScaledHolder`)."""

_AFFINE_IMPLEMENTATIONS = ("affine_scaled", "affine_scaled_reference")


def in_backward_recompute() -> bool:
    """True while autograd runs a backward pass (e.g. the re-forward of gradient checkpointing).

    Always False while ``torch.compile`` traces: the compiled graph runs the forward once (no Python re-forward).
    """
    if torch.compiler.is_compiling():
        return False
    try:
        return torch._C._current_graph_task_id() != -1
    except AttributeError:  # pragma: no cover
        return False


def reduce_over_replicas(total: torch.Tensor, count: torch.Tensor, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ over ranks of total, Σ over ranks of count)`` when torch.distributed is initialised with more than one
    process in ``group`` (one all_reduce of the packed (H + 1,) fp32 vector); the inputs unchanged otherwise.

    Sums and counts, not means: ranks with different numbers of real tokens (padding, an uneven last batch, a rank
    with none) weigh as their tokens do. Every rank of ``group`` must call it the same number of times (it is
    called once per affine_scaled layer in each training forward, as DDP / DeepSpeed run them in lockstep).
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return total, count
    packed = torch.cat([total.reshape(-1), count.reshape(1).to(total.dtype)])
    dist.all_reduce(packed, group=group)
    return packed[:-1].reshape(total.shape), packed[-1]


class AffineScaledHolder(CondInitHolder):
    """State of Affine-Scaled Attention for one attention module (docs/methods.md §5).

    Attributes:
        weight: W_a in ``nn.Linear`` orientation, shape (H, D); α(X) = clamp(0.1·X·weightᵀ + 0.5, 0, 1).
        alpha_ma: (H,) persistent fp32 buffer, EMA of α over real tokens of training forward passes (starts at 0).
            It stays fp32 whatever the model's dtype (``.to()``, ``.half()``, ``from_pretrained(dtype=...)``): a
            bf16 EMA with ρ = 0.9 stalls (the increment is below bf16's resolution).
        alpha_ma_used: (H,) non-persistent fp32 buffer, the α_ma the last training forward used (the
            gradient-checkpointing re-forward reads it, so it recomputes exactly what the forward computed).

    X reaches the attention function as the keyword argument ``AFFINE_INPUT_KWARG`` of the very call that needs it:
    the forward pre-hook `pass_input` (registered on the attention module by `hf_condinit.attention.inject`) adds it
    to the module's kwargs, which HF forwards to the attention function. Nothing of a forward is kept on the holder,
    so one model can serve several threads, and a model switched to another implementation passes nothing.
    """

    #: process group over which α_ma's batch statistic is reduced (None: the default group, i.e. every rank, which is
    #: the data-parallel group of DDP and of DeepSpeed without model parallelism). Set it (on the class or on a
    #: holder) to the data-parallel group when ranks also split the model (tensor / pipeline parallelism).
    process_group = None
    shape_fields = ("n_heads", "hidden")

    def __init__(self, n_heads: int, hidden: int, *, device=None, dtype=None):
        super().__init__()
        self.n_heads, self.hidden = n_heads, hidden
        self.weight = nn.Parameter(torch.zeros(n_heads, hidden, device=device, dtype=dtype))
        self.register_buffer("alpha_ma", torch.zeros(n_heads, device=device, dtype=torch.float32), persistent=True)
        self.register_buffer("alpha_ma_used", torch.zeros(n_heads, device=device, dtype=torch.float32),
                             persistent=False)

    def _apply(self, fn, recurse=True):
        """``Module._apply`` (``.to``, ``.half``, ``.cuda``, ...) that follows devices but keeps the EMA in fp32."""
        before = {name: self._buffers[name] for name in ("alpha_ma", "alpha_ma_used")}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new is not None and new.dtype != torch.float32:
                exact = old is not None and old.dtype == torch.float32 and not old.is_meta
                self._buffers[name] = old.to(new.device) if exact else new.float()
        return self

    def reset_condinit_parameters(self, force: bool = False) -> None:
        with torch.no_grad():
            if force:
                self.weight.zero_()
                self.alpha_ma.zero_()
            else:
                hf_init_fn("zeros_")(self.weight)
                hf_init_fn("zeros_")(self.alpha_ma)
            self.alpha_ma_used.zero_()

    def hook_into(self, module: nn.Module) -> None:
        """Register `pass_input` as a forward pre-hook (with kwargs) of ``module`` unless it is there."""
        if not any(getattr(h, "__self__", None) is self for h in module._forward_pre_hooks.values()):
            module.register_forward_pre_hook(self.pass_input, with_kwargs=True)

    # forward pre-hook of the attention module (registered by `hook_into`, with_kwargs=True)
    def pass_input(self, module: nn.Module, args: tuple, kwargs: dict):
        """Add the module's input X to its kwargs (under ``AFFINE_INPUT_KWARG``) when it runs affine_scaled."""
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) not in _AFFINE_IMPLEMENTATIONS:
            return None
        x = args[0] if args else kwargs.get("hidden_states")
        if x is None:
            raise RuntimeError(
                f"affine_scaled: could not find the input hidden states of {type(module).__name__} "
                "(expected the first positional argument or `hidden_states=`)."
            )
        return args, {**kwargs, AFFINE_INPUT_KWARG: x}

    @staticmethod
    def input_from(kwargs: dict) -> torch.Tensor:
        """Pop X from the attention function's kwargs (a clear error when the pre-hook did not add it)."""
        x = kwargs.pop(AFFINE_INPUT_KWARG, None)
        if x is None:
            raise RuntimeError(
                "affine_scaled: the attention input X was not passed to the attention function. The forward "
                "pre-hook registered by hf_condinit.attention.inject() is missing (model built before `import "
                "hf_condinit`, or hooks removed), or the attention module does not forward **kwargs to its "
                "attention function; call hf_condinit.attention.inject(model) again."
            )
        return x

    def alpha(self, x: torch.Tensor) -> torch.Tensor:
        """α(X) of shape (..., N, H): linear clipping φ(z) = clamp(0.1·z + 0.5, 0, 1)."""
        z = F.linear(x.to(self.weight.dtype), self.weight)
        return torch.clamp(0.1 * z + 0.5, 0.0, 1.0)

    def alpha_ma_for_forward(self, alpha: torch.Tensor, real: torch.Tensor | None, rho: float) -> torch.Tensor:
        """The α_ma this forward uses, (H,) fp32 and detached; a training forward then updates α_ma.

        docs/methods.md §5 order: the output uses α_ma as it stood *before* this batch; then, in training forward
        passes only (never in eval, never in the gradient-checkpointing re-forward),
        α_ma ← ρ·α_ma + (1 − ρ)·mean(α) over the real tokens. Under data parallelism the mean is over the real
        tokens of every replica's batch (`reduce_over_replicas`: sums and counts all-reduced, like SyncBatchNorm),
        so every rank holds the same α_ma, the one a single process would compute on the global batch.
        ``alpha``: (B, Q, H); ``real``: (B or 1, Q) bool, None = every token is real.
        """
        if not self.training:
            return self.alpha_ma.detach().clone()
        if in_backward_recompute():
            return self.alpha_ma_used.detach().clone()
        with torch.no_grad():
            self.alpha_ma_used.copy_(self.alpha_ma)
            used = self.alpha_ma_used.clone()
            a = alpha.detach().float()
            if real is None:
                weights = torch.ones(a.shape[:2], dtype=a.dtype, device=a.device)
            else:
                weights = real.to(a.dtype).expand(a.shape[0], a.shape[1])  # masks may broadcast over B
            total, n = (a * weights.unsqueeze(-1)).sum(dim=(0, 1)), weights.sum()
            total, n = reduce_over_replicas(total, n, self.process_group)
            batch_mean = total / n.clamp(min=1.0)
            # a batch without real tokens leaves α_ma unchanged (computed branch-free, for torch.compile)
            new = torch.where(n > 0, rho * self.alpha_ma + (1.0 - rho) * batch_mean, self.alpha_ma)
            self.alpha_ma.copy_(new)
        return used

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, hidden={self.hidden}"
