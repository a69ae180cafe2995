"""The config of a new model (``--model_config``, HF's ``--model_type``, ``--config_overrides``), the class a config
builds (remote code included) and the causal-loss fix of GPT-2."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..names import did_you_mean

logger = logging.getLogger(__name__)

_TRUE, _FALSE = ("true", "1"), ("false", "0")


def parse_config_overrides(text: str | None, reference_config) -> dict[str, Any]:
    """Parse ``--config_overrides`` (``"key=value,key=value"``) into a dict of typed values.

    Each value is cast with the type of the same attribute of ``reference_config`` (as
    ``PreTrainedConfig.update_from_string`` does): ``bool`` accepts ``true/false/1/0`` (any case), ``int`` and
    ``float`` are converted, an attribute whose reference value is ``None`` takes an int, else a float, else the
    string, and any other type keeps the string. Empty items (``"a=1,,b=2"``) are skipped; a later key wins.

    Raises ``ValueError`` naming ``--config_overrides`` for an item without ``=``, a key that is not an attribute of
    ``reference_config``, a value that is not a boolean / int / float where one is needed.
    """
    overrides: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--config_overrides: {item!r} is not of the form key=value.")
        key, value = (s.strip() for s in item.split("=", 1))
        if not hasattr(reference_config, key):
            raise ValueError(f"--config_overrides: {type(reference_config).__name__} has no attribute {key!r}"
                             f"{did_you_mean(key, reference_config.to_dict())}.")
        old = getattr(reference_config, key)
        if isinstance(old, bool):
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError(f"--config_overrides: {key}={value!r} is not a boolean (true/false/1/0).")
            overrides[key] = value.lower() in _TRUE
        elif isinstance(old, (int, float)):
            try:
                overrides[key] = type(old)(value)
            except ValueError:
                raise ValueError(f"--config_overrides: {key}={value!r} is not {type(old).__name__}.") from None
        elif old is None:
            for cast in (int, float, str):
                try:
                    overrides[key] = cast(value)
                    break
                except ValueError:
                    continue
        else:
            overrides[key] = value
    return overrides


def resolve_model_config(name: str, config_dir: str, config_overrides: str | None = None,
                         cache_dir: str | None = None, token: str | None = None):
    """The config of a new model from ``--model_config`` (``run_clm.py``, ``run_image_classification.py``), with
    ``--config_overrides`` applied (:func:`parse_config_overrides`). Returns ``(config, where)``.

    ``name``: a config in ``config_dir`` (with or without ``.json``), a path (a file, or a directory holding
    ``config.json``), else a hub id (cache or network). Raises ``ValueError`` listing the configs of ``config_dir``
    when it is none of these, or for a bad ``config_overrides``."""
    from transformers import AutoConfig

    candidates = [name]
    if not os.path.isabs(name):
        candidates += [os.path.join(config_dir, name), os.path.join(config_dir, name + ".json")]
    path = next((p for p in candidates if os.path.isfile(p) or os.path.isfile(os.path.join(p, "config.json"))), None)
    if path is not None:
        config = AutoConfig.from_pretrained(path)
    else:
        local = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".json")) if os.path.isdir(config_dir) else []
        try:
            config, path = AutoConfig.from_pretrained(name, cache_dir=cache_dir, token=token), name
        except (OSError, ValueError) as err:
            raise ValueError(
                f"--model_config {name!r}{did_you_mean(name, local)} is not a config in {config_dir} "
                f"({', '.join(local)}), not a local path, and "
                f"could not be loaded from the hub ({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from err
    if config_overrides:
        logger.info(f"Overriding config: {config_overrides}")
        config.update(parse_config_overrides(config_overrides, config))
    return config, path


def model_types(auto_class) -> list[str]:
    """The ``model_type`` names ``auto_class`` (``AutoModelForCausalLM``, ...) has a model for, registered ones
    (Crammed BERT) included, sorted."""
    mapping = auto_class._model_mapping
    return sorted(set(mapping._model_mapping) | {c.model_type for c in mapping._extra_content})


def config_for_model_type(model_type: str, auto_class, config_overrides: str | None = None):
    """HF's ``--model_type`` (train from scratch): the default config of ``model_type`` (``AutoConfig.for_model``)
    with ``--config_overrides`` applied (:func:`parse_config_overrides`, HF's ``update_from_string`` typing).

    Raises ``ValueError`` naming the closest known type when ``auto_class`` has no model for ``model_type``."""
    from transformers import AutoConfig

    known = model_types(auto_class)
    if model_type not in known:
        raise ValueError(f"--model_type {model_type!r}{did_you_mean(model_type, known)} has no "
                         f"{auto_class.__name__} model; choose one of: {', '.join(known)}.")
    config = AutoConfig.for_model(model_type)
    if config_overrides:
        logger.info(f"Overriding config: {config_overrides}")
        config.update(parse_config_overrides(config_overrides, config))
    return config


def model_class(auto_class, config, name_or_path: str | None, hub_kwargs: dict):
    """The class ``auto_class`` builds for ``config``: the repository's own (``config.auto_map``, loaded from
    ``name_or_path`` with ``hub_kwargs``) when ``hub_kwargs["trust_remote_code"]``, else ``auto_class`` itself
    (resolved through its mapping by the caller). For the checks made before any work
    (:func:`hf_condinit.scripts.model_checks.check_attention_usable`)."""
    auto_map = getattr(config, "auto_map", None) or {}
    if not (hub_kwargs.get("trust_remote_code") and auto_class.__name__ in auto_map and name_or_path):
        return auto_class
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    kwargs = {k: hub_kwargs[k] for k in ("cache_dir", "revision", "token") if k in hub_kwargs}
    return get_class_from_dynamic_module(auto_map[auto_class.__name__], name_or_path, **kwargs)


def with_causal_loss_type(model):
    """Set ``model.loss_type = "ForCausalLM"`` where transformers leaves it ``None`` (5.24 derives it from the class
    name, and ``GPT2LMHeadModel`` has no ``ForCausalLM`` in it). Without it the ``Trainer`` counts all N labels of a
    row in ``num_items_in_batch`` instead of the N − 1 shifted targets, so its training and evaluation losses are
    (N − 1)/N times the mean next-token cross-entropy (1.6 % low at N = 64); and every forward with labels reaches the
    loss through ``logger.warning_once`` ("``loss_type=None`` ... unrecognized"), which a whole-model
    ``torch.compile`` cannot trace: a graph break in every compiled forward."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model
