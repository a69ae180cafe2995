"""`CondInitConfig`: every option of the init schemes and attention variants, stored on the model config.

The resolved config is written to ``model.config.condinit`` as a plain dict, so it lands in ``config.json`` through
``save_pretrained`` and tells later which recipe a checkpoint was trained from (METHODS.md: "the choice is written
into the saved config so a run can be told apart later").

Choice: ``seed=None`` means "derive from the global torch seed at build time" (``torch.initial_seed()``); the
resolved integer is what gets recorded, so the stored dict always reproduces the weights.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CondInitConfig", "resolve_condinit", "INIT_METHODS"]

INIT_METHODS = ("default", "mimetic", "conditioned")

_VALUE_INITS = ("block", "per_head")
_MIMETIC_DISTS = ("uniform", "normal")
_SPECTRAL_MODES = ("identity", "svd")
_BIAS_LENGTHS = ("visible", "full")
_PRECOND_SCALES = ("none", "sqrt_d")
_NUMBERS = (
    "qk_gain", "v_gain", "mimetic_alpha1", "mimetic_beta1", "mimetic_alpha2", "mimetic_beta2", "spectral_lambda",
    "affine_rho", "precond_eps",
)


def _package_version() -> str:
    from . import __version__

    return __version__


@dataclass
class CondInitConfig:
    """The full recipe of an hf_condinit model.

    Args:
        method (`str`, *optional*, defaults to `"conditioned"`):
            Attention init scheme: ``"default"`` (the architecture's own init), ``"mimetic"`` (Trockman & Kolter
            2023) or ``"conditioned"`` (semi-orthogonal Q/K, identity V; METHODS.md §1).
        seed (`int`, *optional*):
            Seed of the scheme's own generators (one per layer, ``seed * 1_000_003 + layer``); the global torch RNG
            is never consumed, so every other parameter equals the model's default init for the same global seed.
            ``None``: ``torch.initial_seed()`` at build time, then recorded.
        value_init (`str`, defaults to `"block"`):
            ``"block"``: the value projection is the (H·d)×D identity (head h reads coordinates [h·d, (h+1)·d)).
            ``"per_head"``: every head gets the rectangular identity I_{D×d} (the paper's literal algorithm).
        qk_gain / v_gain (`float`, defaults to 1.0):
            Scale of the semi-orthogonal Q/K blocks and of the V identity (the papers give no scale).
        mimetic_alpha1, mimetic_beta1, mimetic_alpha2, mimetic_beta2 (`float`):
            Mimetic targets W_Q W_Kᵀ ≈ α1·Z1 + β1·I and W_V W_O ≈ α2·Z2 + sign·β2·I (defaults 0.7, 0.7, 0.4, 0.4).
        mimetic_vo_sign (`int`, defaults to -1): sign of the identity term of the VO target.
        mimetic_dist (`str`, defaults to `"uniform"`): distribution of Z (variance 1/D): ``"uniform"`` or ``"normal"``.
        spectral_lambda (`float`, *optional*): enable spectral conditioning with this λ (METHODS.md §3).
        spectral_mode (`str`, defaults to `"identity"`): ``"identity"`` (C = λ·E) or ``"svd"`` (κ(W + C) ≤ 2).
        affine_rho (`float`, defaults to 0.9): EMA factor of α_ma (Affine-Scaled Attention).
        affine_bias_length (`str`, defaults to `"visible"`): β divides by the visible key count or the full length.
        precond_eps (`float`, defaults to 1e-6): ε of preconditioned attention's per-token normalisation.
        precond_scale (`str`, defaults to `"none"`): ``"sqrt_d"`` rescales normalised head outputs by √d.
        layout (`str`, *optional*): the layout adapter used (filled in when the model is built).
        hf_condinit_version (`str`, *optional*): filled in automatically.
    """

    method: str = "conditioned"
    seed: int | None = None
    value_init: str = "block"
    qk_gain: float = 1.0
    v_gain: float = 1.0
    mimetic_alpha1: float = 0.7
    mimetic_beta1: float = 0.7
    mimetic_alpha2: float = 0.4
    mimetic_beta2: float = 0.4
    mimetic_vo_sign: int = -1
    mimetic_dist: str = "uniform"
    spectral_lambda: float | None = None
    spectral_mode: str = "identity"
    affine_rho: float = 0.9
    affine_bias_length: str = "visible"
    precond_eps: float = 1e-6
    precond_scale: str = "none"
    layout: str | None = None
    hf_condinit_version: str | None = field(default=None)

    def __post_init__(self) -> None:
        if self.method == "orthogonal":  # spelled like the paper's figure legends
            self.method = "conditioned"
        _check_choice("method", self.method, INIT_METHODS)
        _check_choice("value_init", self.value_init, _VALUE_INITS)
        _check_choice("mimetic_dist", self.mimetic_dist, _MIMETIC_DISTS)
        _check_choice("spectral_mode", self.spectral_mode, _SPECTRAL_MODES)
        _check_choice("affine_bias_length", self.affine_bias_length, _BIAS_LENGTHS)
        _check_choice("precond_scale", self.precond_scale, _PRECOND_SCALES)
        if self.mimetic_vo_sign not in (-1, 1):
            raise ValueError(f"condinit option mimetic_vo_sign must be -1 or +1, got {self.mimetic_vo_sign!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"condinit option seed must be a non-negative int or None, got {self.seed!r}.")
        for name in _NUMBERS:
            _check_finite_number(name, getattr(self, name), optional=name == "spectral_lambda")
        for name in ("qk_gain", "v_gain", "precond_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"condinit option {name} must be > 0, got {getattr(self, name)!r}.")
        if not 0.0 <= self.affine_rho < 1.0:
            raise ValueError(f"condinit option affine_rho must be in [0, 1), got {self.affine_rho!r}.")
        if self.spectral_lambda is not None and self.spectral_lambda < 0:
            raise ValueError(f"condinit option spectral_lambda must be >= 0, got {self.spectral_lambda!r}.")
        if self.hf_condinit_version is None:
            self.hf_condinit_version = _package_version()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> "CondInitConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"Unknown condinit option(s) {unknown}. Accepted options: {sorted(known)} (see CondInitConfig)."
            )
        return cls(**options)


def _check_finite_number(name: str, value: Any, optional: bool = False) -> None:
    """A real, finite number (``None`` too when ``optional``): NaN or ±inf would silently poison the weights."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"condinit option {name} must be a finite number, got {value!r}.")


def _check_choice(name: str, value: Any, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"Unknown condinit {name} {value!r}; accepted: {', '.join(map(repr, accepted))}.")


def resolve_condinit(value: Any) -> CondInitConfig | None:
    """Normalise every accepted spelling of the ``condinit`` argument.

    ``True`` → conditioned; ``False``/``None`` → ``None`` (nothing to do); a method name; a dict with ``method`` and
    options; or a `CondInitConfig`. Raises `ValueError` naming what is accepted otherwise.
    """
    if value is None or value is False:
        return None
    if value is True:
        return CondInitConfig()
    if isinstance(value, CondInitConfig):
        return value
    if isinstance(value, str):
        return CondInitConfig(method=value)
    if isinstance(value, dict):
        return CondInitConfig.from_dict(dict(value))
    raise ValueError(
        f"condinit must be True/False/None, one of {INIT_METHODS}, a dict with 'method' and options, or a "
        f"CondInitConfig; got {type(value).__name__} {value!r}."
    )
