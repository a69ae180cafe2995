"""`CondInitConfig`: every option of the init schemes and attention variants, stored on the model config.

The resolved config is written to ``model.config.condinit`` as a plain dict, so it lands in ``config.json`` through
``save_pretrained`` and tells later which recipe a checkpoint was trained from (docs/methods.md: "the choice is written
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

from .versions import __version__

__all__ = [
    "CondInitConfig",
    "resolve_condinit",
    "INIT_METHODS",
    "INIT_METHOD_ALIASES",
    "check_options_apply",
    "option_readers",
]

INIT_METHODS = ("default", "mimetic", "conditioned")
#: Other spellings of a method, accepted wherever a method name is (the papers' figure legends say "orthogonal").
INIT_METHOD_ALIASES = {"orthogonal": "conditioned"}

_VALUE_INITS = ("block", "per_head")
_MIMETIC_DISTS = ("uniform", "normal")
_SPECTRAL_MODES = ("identity", "svd")
_BIAS_LENGTHS = ("visible", "full")
_PRECOND_SCALES = ("none", "sqrt_d")
_GENERATORS = ("cpu", "device")
_NUMBERS = (
    "qk_gain", "v_gain", "mimetic_alpha1", "mimetic_beta1", "mimetic_alpha2", "mimetic_beta2", "spectral_lambda",
    "affine_rho", "precond_eps",
)


@dataclass
class CondInitConfig:
    """The full recipe of an hf_condinit model.

    Args:
        method (`str`, *optional*, defaults to `"conditioned"`):
            Attention init scheme: ``"default"`` (the architecture's own init), ``"mimetic"`` (Trockman & Kolter
            2023) or ``"conditioned"`` (semi-orthogonal Q/K, identity V; docs/methods.md §1).
        seed (`int`, *optional*):
            Seed of the scheme's own generators (one per layer, ``seed * 1_000_003 + layer``); the global torch RNG
            is never consumed, so every other parameter equals the model's default init for the same global seed.
            ``None``: ``torch.initial_seed()`` at build time, then recorded.
        generator (`str`, defaults to `"cpu"`):
            Where those generators live: ``"cpu"`` (the same weights on every device) or ``"device"`` (the device
            the block's weights are built on, the CPU for CPU and meta builds: no host draws on an accelerator,
            deterministic per seed on one device kind, but a GPU build then differs from a CPU build of the same
            seed). Read by every scheme that draws (conditioned, mimetic).
        value_init (`str`, defaults to `"block"`):
            ``"block"``: the value projection is the (H·d)×D identity (head h reads coordinates [h·d, (h+1)·d)).
            ``"per_head"``: every head gets the rectangular identity I_{D×d} (the paper's literal algorithm).
        qk_gain / v_gain (`float`, defaults to 1.0):
            Scale of the semi-orthogonal Q/K blocks and of the V identity (the papers give no scale).
        mimetic_alpha1, mimetic_beta1, mimetic_alpha2, mimetic_beta2 (`float`):
            Mimetic targets W_Q W_Kᵀ ≈ α1·Z1 + β1·I and W_V W_O ≈ α2·Z2 + sign·β2·I (defaults 0.7, 0.7, 0.4, 0.4).
        mimetic_vo_sign (`int`, defaults to -1): sign of the identity term of the VO target.
        mimetic_dist (`str`, defaults to `"uniform"`): distribution of Z (variance 1/D): ``"uniform"`` or ``"normal"``.
        spectral_lambda (`float`, *optional*): enable spectral conditioning with this λ (docs/methods.md §3).
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
    generator: str = "cpu"
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
        self.method = INIT_METHOD_ALIASES.get(self.method, self.method)
        _check_choice("method", self.method, INIT_METHODS, INIT_METHOD_ALIASES)
        _check_choice("generator", self.generator, _GENERATORS)
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
            self.hf_condinit_version = __version__

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


def _check_choice(name: str, value: Any, accepted: tuple[str, ...], aliases: dict[str, str] | None = None) -> None:
    if value not in accepted:
        also = "".join(f", {a!r} (alias of {b!r})" for a, b in (aliases or {}).items())
        raise ValueError(f"Unknown condinit {name} {value!r}; accepted: {', '.join(map(repr, accepted))}{also}.")


#: Options read by one init method only: (what, who); `option_readers` adds the variants' and spectral conditioning's.
_METHOD_READERS = {
    **{name: ("method", "conditioned") for name in ("value_init", "qk_gain", "v_gain")},
    **{f"mimetic_{n}": ("method", "mimetic") for n in ("alpha1", "beta1", "alpha2", "beta2", "vo_sign", "dist")},
}


def option_readers() -> dict[str, tuple[str, str | None]]:
    """The options read by one method, one attention variant or spectral conditioning only: name → (what, who),
    e.g. ``"affine_rho": ("attention", "affine_scaled")``, the variants' from `hf_condinit.attention.catalog`."""
    from .attention.catalog import VARIANTS  # the variants import the core, not the other way round at import time

    variants = {name: ("attention", v.name) for v in VARIANTS for name in v.options}
    return {**_METHOD_READERS, **variants, "spectral_mode": ("spectral_lambda", None)}


def check_options_apply(options: dict[str, Any], attention: str | None = None) -> None:
    """Refuse options that the chosen method never reads (e.g. ``value_init`` with ``method="mimetic"``).

    ``options``: a ``condinit`` dict as the user gave it; an option at its default value is never refused (a stored
    ``config.condinit`` holds every option). With ``attention`` (the ``attn_implementation``), the ``affine_*`` and
    ``precond_*`` options are checked against it too. ``spectral_mode`` needs ``spectral_lambda``. Raises
    ``ValueError`` naming each unused option and what reads it."""
    method = INIT_METHOD_ALIASES.get(options.get("method", "conditioned"), options.get("method", "conditioned"))
    defaults = {f.name: f.default for f in dataclasses.fields(CondInitConfig)}
    problems = []
    for name, (what, reader) in option_readers().items():
        if name not in options or options[name] == defaults[name]:
            continue
        if what == "method" and method != reader:
            problems.append(f"{name} is read by method {reader!r} only, not {method!r}")
        elif what == "attention" and attention is not None and attention != reader:
            problems.append(f"{name} is read by attention {reader!r} only, not {attention!r}")
        elif what == "spectral_lambda" and options.get("spectral_lambda") is None:
            problems.append(f"{name} is read only with spectral_lambda set")
    if problems:
        raise ValueError(f"condinit option(s) without effect: {'; '.join(problems)}. Remove them or change the method.")


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
