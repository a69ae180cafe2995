"""Init schemes (`schemes`) built from in-place tensor functions (`functional`)."""

from . import schemes  # noqa: F401  (registers the built-in schemes)
from .functional import block_identity, mimetic_factors, mimetic_target, rect_identity_, semi_orthogonal_

__all__ = ["block_identity", "mimetic_factors", "mimetic_target", "rect_identity_", "semi_orthogonal_"]
