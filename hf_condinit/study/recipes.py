"""A study's arms: recipes written as one word each, and the flags they add to the wrapped command.

Grammar: ``INIT[+ATTENTION][:KEY=VALUE[,KEY=VALUE...]]``, for example ``conditioned``, ``mimetic``,
``default+affine_scaled``, ``conditioned:v_gain=0.25``, ``conditioned+affine_scaled:qk_gain=2,v_gain=0.5``.
``INIT`` is an init scheme (:func:`hf_condinit.names.known_init_names`, or an alias such as ``orthogonal``),
``ATTENTION`` an attention implementation (:func:`hf_condinit.names.known_attention_names`) and each ``KEY`` an
option of :class:`hf_condinit.CondInitConfig` (``v_gain``, ``spectral_lambda``, ...). The recipe becomes the flags
``--init INIT [--attention ATTENTION] [--KEY VALUE ...]`` of the example scripts; without ``+ATTENTION`` the
command's own attention is used. A misspelt name is refused with the closest known one.
"""

from __future__ import annotations

import dataclasses
import re

from ..config import INIT_METHOD_ALIASES, CondInitConfig
from ..names import did_you_mean, known_attention_names, known_init_names

__all__ = ["Recipe", "parse_recipe", "OPTION_KEYS"]

#: The recipe options: every CondInitConfig field a user sets (the method, seed and filled-in fields are not).
OPTION_KEYS = tuple(f.name for f in dataclasses.fields(CondInitConfig)
                    if f.name not in ("method", "seed", "layout", "hf_condinit_version"))
_OPTION_TYPES = {f.name: str(f.type) for f in dataclasses.fields(CondInitConfig)}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One arm: its text as given (``name``), the init scheme, the attention (None: the command's) and options."""

    name: str
    init: str
    attention: str | None
    options: tuple[tuple[str, str], ...] = ()

    def flags(self) -> list[str]:
        """The command-line flags of this arm."""
        out = ["--init", self.init]
        if self.attention:
            out += ["--attention", self.attention]
        for key, value in self.options:
            out += [f"--{key}", value]
        return out

    def typed_options(self) -> dict:
        """The options as :class:`hf_condinit.CondInitConfig` values (``"0.25"`` -> 0.25 for a float option), for
        a run in this process (``condinit=`` of ``from_config``); ``ValueError`` naming an option whose value is
        not of its type."""
        out = {}
        for key, value in self.options:
            kind = float if "float" in _OPTION_TYPES[key] else int if "int" in _OPTION_TYPES[key] else str
            try:
                out[key] = kind(value)
            except ValueError:
                raise ValueError(f"arm {self.name!r}: option {key}={value!r} is not a {kind.__name__}") from None
        return out

    @property
    def slug(self) -> str:
        """A folder name for the arm: the recipe with every character outside ``[A-Za-z0-9._-]`` made ``_``."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.name)


def parse_recipe(text: str) -> Recipe:
    """The :class:`Recipe` of ``text`` (module docstring); ``ValueError`` naming the bad part (with the closest
    known name) otherwise."""
    head, _, opts = text.partition(":")
    init, _, attention = head.partition("+")
    inits = known_init_names()
    if init not in inits and init not in INIT_METHOD_ALIASES:
        raise ValueError(f"arm {text!r}: unknown init scheme {init!r}; known: {', '.join(inits)}"
                         f"{did_you_mean(init, [*inits, *INIT_METHOD_ALIASES])}")
    if attention or head.endswith("+"):
        names = known_attention_names()
        if attention not in names:
            raise ValueError(f"arm {text!r}: unknown attention {attention!r}; known: {', '.join(names)}"
                             f"{did_you_mean(attention, names)}")
    options = []
    for item in opts.split(",") if ":" in text else []:
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise ValueError(f"arm {text!r}: option {item!r} is not KEY=VALUE (e.g. conditioned:v_gain=0.25)")
        if key not in OPTION_KEYS:
            raise ValueError(f"arm {text!r}: unknown option {key!r}; known: {', '.join(OPTION_KEYS)}"
                             f"{did_you_mean(key, OPTION_KEYS)}")
        options.append((key, value))
    return Recipe(text, init, attention or None, tuple(options))
