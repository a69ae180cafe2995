"""The three registries of the package: layouts, init schemes and attention variants.

Each maps a snake_case name to an object and refuses silent overwrites (peft's ``register`` convention):

- ``LAYOUTS``: ``config.model_type`` → `AttentionLayout` instance (how a family stores q/k/v);
- ``INIT_SCHEMES``: scheme name → ``fn(projs, geometry, cfg, generator) -> written roles`` writing q/k/v (and o)
  in place (`hf_condinit.init.schemes`);
- ``ATTENTION_VARIANTS``: HF ``attn_implementation`` name → attention forward function.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = [
    "LAYOUTS",
    "INIT_SCHEMES",
    "ATTENTION_VARIANTS",
    "register_layout",
    "register_scheme",
    "register_variant",
]

LAYOUTS: dict[str, Any] = {}
INIT_SCHEMES: dict[str, Callable[..., None]] = {}
ATTENTION_VARIANTS: dict[str, Callable[..., Any]] = {}


def _register(table: dict, kind: str, name: str, obj: Any, overwrite: bool) -> Any:
    if not isinstance(name, str) or not name:
        raise ValueError(f"A {kind} name must be a non-empty string, got {name!r}.")
    if name in table and table[name] is not obj and not overwrite:
        raise ValueError(f"A {kind} named {name!r} is already registered; pass overwrite=True to replace it.")
    table[name] = obj
    return obj


def register_layout(model_type: str, layout: Any, *, overwrite: bool = False) -> Any:
    """Register the layout adapter used for models whose ``config.model_type`` is ``model_type``."""
    return _register(LAYOUTS, "layout", model_type, layout, overwrite)


def register_scheme(name: str, fn: Callable[..., None], *, overwrite: bool = False) -> Callable[..., None]:
    """Register an init scheme ``fn(projs, geometry, cfg, generator) -> list[str]`` (`hf_condinit.init.schemes`)."""
    return _register(INIT_SCHEMES, "init scheme", name, fn, overwrite)


def register_variant(name: str, fn: Callable[..., Any], *, overwrite: bool = False) -> Callable[..., Any]:
    """Register an attention variant (also registered with HF's AttentionInterface by `hf_condinit.attention`)."""
    return _register(ATTENTION_VARIANTS, "attention variant", name, fn, overwrite)
