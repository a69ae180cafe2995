"""The names a user can ask for, and the closest one when a name is misspelt.

:func:`known_init_names` / :func:`known_attention_names` list what ``condinit=`` / ``attn_implementation=`` (and the
scripts' ``--init`` / ``--attention``) accept; :func:`did_you_mean` appends the closest known name to an "unknown ..."
message; :func:`unknown_attention_error` is transformers' error for an unknown ``attn_implementation`` with
hf_condinit's variants added. The library (the construction hooks, ``python -m hf_condinit.coverage``) and the scripts
share them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .config import INIT_METHODS
from .registry import ATTENTION_VARIANTS, INIT_SCHEMES

__all__ = ["BUILTIN_ATTENTION", "did_you_mean", "known_attention_names", "known_init_names", "unknown_attention_error"]

#: The attention implementations transformers has built in (no ``condinit_`` holder parameters).
BUILTIN_ATTENTION = ("sdpa", "eager")


def known_init_names() -> list[str]:
    """Init scheme names: the built-in three and any registered with ``hf_condinit.register_scheme``."""
    return list(dict.fromkeys([*INIT_METHODS, *INIT_SCHEMES]))


def known_attention_names() -> list[str]:
    """Attention implementations: sdpa, eager, hf_condinit's variants and anything registered with HF's
    ``AttentionInterface`` (flash_attention_2, flex_attention, ...)."""
    names = [*BUILTIN_ATTENTION, *ATTENTION_VARIANTS]
    try:
        from transformers import AttentionInterface

        names += list(AttentionInterface._global_mapping)
    except Exception:  # pragma: no cover - private attribute moved
        pass
    return list(dict.fromkeys(names))


def did_you_mean(name: str, choices: Iterable[str], *, quote: str = "'") -> str:
    """``" (did you mean 'x'?)"`` for the choice closest to ``name`` (``difflib`` similarity ≥ 0.6, compared as
    given, then ignoring case and ``-`` / ``_``), else ``""``. Meant to be appended to an "unknown ..." message."""
    choices = list(dict.fromkeys(choices))
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if not close:
        folded = {c.lower().replace("-", "_"): c for c in choices}  # case and dash/underscore slips
        close = [folded[k] for k in difflib.get_close_matches(name.lower().replace("-", "_"), folded, n=1)]
    if not close:
        return ""
    return f" (did you mean {quote}{close[0]}{quote}?)"


def unknown_attention_error(name, err: ValueError) -> ValueError:
    """transformers' error for an unknown ``attn_implementation`` (``err``) with what it leaves out: hf_condinit's
    variants, how spectral conditioning is asked for (an init option, not an implementation) and the closest known
    name. ``err`` itself when ``name`` is known or not a string (the error is about something else)."""
    names = known_attention_names()
    if not isinstance(name, str) or name in names:
        return err
    hint = did_you_mean(name, [*names, "spectral"]).strip(" ()")
    hint = "" if not hint or "'spectral'" in hint else " D" + hint[1:]
    plugin = ", ".join(f'"{v}"' for v in ATTENTION_VARIANTS)
    return ValueError(f"{str(err).rstrip('. ')}; hf_condinit adds {plugin} (spectral conditioning is not an attention "
                      f"implementation: condinit={{'spectral_lambda': λ}}, with any of them).{hint}")
