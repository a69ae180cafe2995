"""Miniatures: a 2-layer, 64-wide copy of a config (same model type and options), and inputs that run it.

Used to prove a detected layout before any weight of the real model is written (`hf_condinit.layouts.detect`) and
by the coverage table (`hf_condinit.coverage`). What changes (in the config and every sub-config):

- first, per-layer lists are fitted to the config's own layer count, as its model reads them (`_fit_layer_lists`: a
  config shrunk by attribute keeps its full-length ``layer_types``), so the miniature is built from what the user's
  model is, not refused by a validator;
- layers → 2 (Dory's dict, which lists each layer as its attention then ``"mlp"``, keeps 4 entries; a per-layer
  list such as ``layer_types`` keeps its first entry and the first entry of another kind, so sliding/global and
  dense/linear mixes stay mixed; Zamba keeps two hybrid layers); what names layers follows them
  (`_renumber_layers`): lists of layer indices (``index_layers``, ``kv_source_layers``) and dicts keyed by layer
  index (``per_layer_config``) keep the kept layers, renumbered, and counts that split the layers into sections
  (``n_input_layers`` + ``n_recurrent_layers`` + ``n_output_layers``) are rescaled to sum to 2;
- width → 64, query heads → 4, head dimension → 16 where the config has one; key/value heads keep their relation
  to the query heads (all → 4, one → 1 (MQA), otherwise → 2 (GQA));
- a rotary dimension (GPT-J, CodeGen) → 8, so rotary stays partial; multimodal RoPE sections rescaled to sum to 8;
- sizes that a config's validators tie to the others are derived from them (`_derive_dependent`): a per-head width
  ``d_head`` that was ``d_model / n_head`` stays so; a Mamba mixer's heads → 4 of ``mamba_d_head`` = its inner
  width (``mamba_d_ssm`` → at most 128, else ``mamba_expand`` × width) / 4, its state → 16; an attention indexer's
  heads (``index_num_heads``) → at most the query heads per key/value head; Zamba's and Zamba2's sizes computed
  once from the width (`_derive_concatenated_attention`);
- feed-forward widths → 128, experts → 4 (2 per token), vocabulary → at most 512 (special token ids past it move to its top),
  sliding windows → 4 tokens (shorter than the 6-token inputs, so they act), images → 32 pixels (at least two
  patches a side).

Everything else (flags such as ``new_decoder_architecture``, ``multi_query``, ``alibi``, ``qk_layernorm``,
``partial_rotary_factor``, softcapping) is kept.
"""

from __future__ import annotations

import copy
import inspect

import torch

__all__ = ["shrink_config", "shrink_by_attribute", "miniature_inputs", "build_miniature", "layer_kinds"]

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
               "num_decoder_layers", "num_encoder_layers")
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "n_embed")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads", "num_attention_heads_per_layer")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
_HEAD_DIM_KEYS = ("head_dim", "d_kv", "attention_head_dim", "kv_channels", "attention_head_size")
_FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim",
             "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
             "expert_intermediate_size", "dim_feedforward", "mlp_dim", "inner_hidden_size")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "num_selected_experts")
_PER_LAYER_SUFFIXES = ("layer_types", "attention_layers")  # per-layer lists (GPT-Neo's attention_layers)
_INDEX_LIST_SUFFIXES = ("_idxs", "_layer_ids", "_layer_indices")  # lists of layer indices (LFM2's full_attn_idxs)
# lists naming layers by index that follow the kept layers (Kolibri's index_layers, kv_source_layers)
_RENUMBERED_SUFFIXES = ("index_layers", "_source_layers", "attn_layer_indices", "hybrid_layer_ids")
_PER_LAYER_DICT_KEYS = ("per_layer_config",)  # dicts keyed by layer index (NeoMME)
_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id",
            "decoder_start_token_id", "unk_token_id")

LAYERS, WIDTH, HEADS, HEAD_DIM, FFN, EXPERTS, TOPK, VOCAB, WINDOW, IMAGE = 2, 64, 4, 16, 128, 4, 2, 512, 4, 32
SSM_STATE = 16  # a Mamba mixer's state size


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _layer_pick(n_layers: int, types: list | None, shared: bool = False) -> list[int]:
    """Indices of the layers kept: the first, and the first of another kind when ``types`` mixes kinds; with
    ``shared`` (Zamba's ``layers_block_type``, whose ``"hybrid"`` layers each hold a Mamba mixer and the one
    transformer block they share), the first two hybrid layers, since transformers ties that block across layers."""
    if types and len(types) == n_layers:
        hybrid = [i for i, t in enumerate(types) if t == "hybrid"]
        if shared and len(hybrid) >= LAYERS:
            return hybrid[:LAYERS]
        other = next((i for i, t in enumerate(types) if t != types[0]), None)
        if other is not None:
            return [0, other]
    return list(range(min(LAYERS, n_layers)))


def layer_kinds(d: dict, n_layers: int) -> list | None:
    """Each layer's kind, as the config says it: ``layer_types``, else ``layers_block_type`` (Zamba), else
    attention at ``attn_layer_indices`` (Bamba) or every ``attn_layer_period`` layers from ``attn_layer_offset``
    (Jamba); None when it does not say."""
    for key in ("layer_types", "layers_block_type"):
        if isinstance(d.get(key), list):
            return d[key]
    if isinstance(d.get("attn_layer_indices"), list):
        return ["attention" if i in d["attn_layer_indices"] else "other" for i in range(n_layers)]
    period, offset = d.get("attn_layer_period"), d.get("attn_layer_offset")
    if _is_int(period) and _is_int(offset) and period > 0:
        return ["attention" if i % period == offset else "other" for i in range(n_layers)]
    return None


def _fit_layer_lists(d: dict) -> dict:
    """``d`` with its per-layer lists fitted to its own layer count, the way the model built from it reads them
    (layer i takes entry i): a config shrunk by attribute (``cfg.num_hidden_layers = 2``) keeps, say, 32
    ``layer_types``, which its model uses only the first 2 of, but which the config's validator refuses when the
    dict is read back. Every list of the length of a ``*layer_types`` (or ``attention_layers``) list that differs
    from the layer count is cut to it (or cycled up to it); lists of layer indices (``full_attn_idxs``) lose the
    indices past it."""
    n_layers = next((d[k] for k in _LAYER_KEYS if _is_int(d.get(k)) and d[k] > 0), None)
    if n_layers is None:
        return d
    lengths = {len(v) for k, v in d.items() if k.endswith(_PER_LAYER_SUFFIXES) and isinstance(v, list) and v}
    lengths.discard(n_layers)
    for key, value in list(d.items()):
        if isinstance(value, list) and value and len(value) in lengths:
            d[key] = [value[i % len(value)] for i in range(n_layers)]
        elif key.endswith(_INDEX_LIST_SUFFIXES + _RENUMBERED_SUFFIXES) and isinstance(value, list) \
                and all(_is_int(i) for i in value):
            d[key] = [i for i in value if i < n_layers]
    return d


def _shrink_dict(d: dict) -> dict:
    d = _fit_layer_lists(dict(d))
    original = dict(d)
    n_layers = next((d[k] for k in _LAYER_KEYS if _is_int(d.get(k)) and d[k] > 0), None)
    unit = 2 if _mlp_paired(d, n_layers) else 1
    if n_layers is not None and n_layers > LAYERS * unit:
        kinds = layer_kinds(d, n_layers)
        keep = [unit * i + j for i in _layer_pick(n_layers // unit, kinds[::unit] if kinds else None,
                                                  shared=isinstance(d.get("layers_block_type"), list))
                for j in range(unit)]
        for key, value in list(d.items()):
            if isinstance(value, list) and len(value) == n_layers:
                d[key] = [value[i] for i in keep]
        _renumber_layers(d, n_layers, keep, unit)
        for key in _LAYER_KEYS:
            if _is_int(d.get(key)) and d[key] > LAYERS * unit:
                d[key] = LAYERS * unit
    heads = next((d[k] for k in _HEAD_KEYS if _is_int(d.get(k))), None)
    for key in _WIDTH_KEYS:
        if _is_int(d.get(key)) and d[key] > WIDTH:
            d[key] = WIDTH
    if heads is not None:
        for key in _HEAD_KEYS:
            if _is_int(d.get(key)):
                d[key] = min(d[key], HEADS)
        for key in _KV_KEYS:
            kv = d.get(key)
            if _is_int(kv) and kv > 0:
                d[key] = min(HEADS, heads) if kv >= heads else 1 if kv == 1 else 2
    for key in _HEAD_DIM_KEYS:
        if _is_int(d.get(key)) and d[key] > HEAD_DIM:
            d[key] = HEAD_DIM
    if "head_dim" in d and d["head_dim"] is None and heads is not None:  # Ministral's default leaves it unset
        d["head_dim"] = HEAD_DIM
    _derive_dependent(d, original)
    if _is_int(d.get("rotary_dim")) and d["rotary_dim"] > HEAD_DIM // 2:  # GPT-J / CodeGen partial rotary
        d["rotary_dim"] = HEAD_DIM // 2
    for key in _FFN_KEYS:
        if _is_int(d.get(key)) and d[key] > FFN:
            d[key] = FFN
    for key in _EXPERT_KEYS:
        if _is_int(d.get(key)) and d[key] > EXPERTS:
            d[key] = EXPERTS
    for key in _TOPK_KEYS:
        if _is_int(d.get(key)) and d[key] > TOPK:
            d[key] = TOPK
    if _is_int(d.get("vocab_size")) and d["vocab_size"] > VOCAB:
        d["vocab_size"] = VOCAB
        remap: dict[int, int] = {}  # special token ids past the small vocabulary move to its top
        for key in _ID_KEYS:
            value = d.get(key)
            if _is_int(value) and value >= VOCAB:
                d[key] = remap.setdefault(value, VOCAB - 1 - len(remap))
            elif isinstance(value, list):
                d[key] = [remap.setdefault(v, VOCAB - 1 - len(remap)) if _is_int(v) and v >= VOCAB else v
                          for v in value]
    if _is_int(d.get("image_size")) and d["image_size"] > IMAGE:  # keeps a few patches (and small convolutions)
        patch = d.get("patch_size") if _is_int(d.get("patch_size")) else 1
        d["image_size"] = max(IMAGE, 2 * patch)
    if _is_int(d.get("sliding_window")) and d["sliding_window"] > WINDOW:
        d["sliding_window"] = WINDOW
    for key, value in list(d.items()):
        if isinstance(value, dict) and "model_type" in value:
            d[key] = _shrink_dict(value)
        elif isinstance(value, dict) and isinstance(value.get("mrope_section"), list):
            d[key] = {**value, "mrope_section": _rescaled(value["mrope_section"], HEAD_DIM // 2)}
    return d


def _mlp_paired(d: dict, n_layers: int | None) -> bool:
    """Whether ``d`` lists each layer as two entries, its attention and then ``"mlp"`` (Dory's serialised
    ``layer_types``, whose counts are doubled: its config halves them when read back)."""
    kinds = d.get("layer_types")
    return isinstance(kinds, list) and len(kinds) == n_layers and n_layers % 2 == 0 \
        and all(k == "mlp" for k in kinds[1::2]) and "mlp" not in kinds[::2]


def _renumber_layers(d: dict, n_layers: int, keep: list[int], unit: int = 1) -> None:
    """In place: what names layers of ``d`` (``n_layers`` layers) follows the layers ``keep`` (old indices, in
    order), renumbered 0, 1, …: lists of layer indices (`_RENUMBERED_SUFFIXES`, after per-layer lists were picked)
    lose the dropped layers, dicts keyed by layer index (`_PER_LAYER_DICT_KEYS`) keep the kept layers' entries, and
    int counts named ``n_*_layers`` / ``num_*_layers`` that sum to ``n_layers`` (sections of the stack) are rescaled
    to sum to ``len(keep)`` (largest remainders, ties to the first) in multiples of ``unit`` (2 where each layer
    is listed twice, `_mlp_paired`)."""
    new = {old: j for j, old in enumerate(keep)}
    for key, value in list(d.items()):
        if key.endswith(_RENUMBERED_SUFFIXES) and isinstance(value, list) and all(_is_int(i) for i in value):
            d[key] = [new[i] for i in value if i in new]
        elif key in _PER_LAYER_DICT_KEYS and isinstance(value, dict):
            d[key] = {str(new[int(k)]): v for k, v in value.items() if str(k).isdigit() and int(k) in new}
    period, offset = d.get("attn_layer_period"), d.get("attn_layer_offset")
    if _is_int(period) and _is_int(offset) and period > 0 and offset >= len(keep) and len(keep) == 2 \
            and keep[1] % period == offset:  # Jamba, Zamba: the kept attention layer is the second
        d["attn_layer_period"], d["attn_layer_offset"] = 2, 1
    sections = [k for k, v in d.items() if _is_int(v) and k not in _LAYER_KEYS and k.endswith("_layers")
                and k.startswith(("n_", "num_"))]
    if len(sections) > 1 and sum(d[k] for k in sections) == n_layers:
        exact = {k: d[k] * len(keep) / n_layers / unit for k in sections}
        counts = {k: int(v) for k, v in exact.items()}
        for k in sorted(sections, key=lambda k: counts[k] - exact[k])[:len(keep) // unit - sum(counts.values())]:
            counts[k] += 1
        d.update({k: unit * v for k, v in counts.items()})


def _derive_dependent(d: dict, original: dict) -> None:
    """In place: the sizes that a config's validators tie to the sizes shrunk independently, derived from them
    (see the module docstring); a config without them is unchanged."""
    width = next((d[k] for k in _WIDTH_KEYS if _is_int(d.get(k))), None)
    heads = next((d[k] for k in _HEAD_KEYS if _is_int(d.get(k))), None)
    if _is_int(d.get("d_head")) and width and heads \
            and original["d_head"] * original.get("n_head", 0) == original.get("d_model"):  # XLNet
        d["d_head"] = width // heads
    if _is_int(d.get("mamba_n_heads")) and _is_int(d.get("mamba_d_head")) and width:  # Bamba, Falcon-H1, ...
        if _is_int(d.get("mamba_d_ssm")):
            d["mamba_d_ssm"] = inner = min(d["mamba_d_ssm"], FFN)
        else:
            inner = (d.get("mamba_expand") or 2) * width
        groups = d.get("mamba_n_groups") if _is_int(d.get("mamba_n_groups")) else 1
        d["mamba_n_heads"] = n = next(n for n in (HEADS, groups, 1) if inner % n == 0 and n % groups == 0)
        d["mamba_d_head"] = inner // n
        if _is_int(d.get("mamba_d_state")):
            d["mamba_d_state"] = min(d["mamba_d_state"], SSM_STATE)
    _derive_concatenated_attention(d, original, width, heads)
    kv = next((d[k] for k in _KV_KEYS if _is_int(d.get(k)) and d[k] > 0), heads)
    if _is_int(d.get("index_num_heads")) and heads and kv:  # Kolibri's indexer reads one key/value head's queries
        d["index_num_heads"] = max(1, min(d["index_num_heads"], heads // kv))


def _derive_concatenated_attention(d: dict, original: dict, width: int | None, heads: int | None) -> None:
    """In place: Zamba's and Zamba2's sizes that their configs compute from the width once (``__post_init__``) and
    store, so that a dict read back keeps the stale ones: the shared attention's input ``attention_hidden_size`` =
    2 × width (it reads ``[h; embeddings]``), ``attention_head_dim`` = that / heads, a Mamba head's
    ``mamba_headdim`` = ``mamba_expand`` × width / ``n_mamba_heads``, ``kv_channels`` = width / heads,
    ``num_query_groups`` = heads, each derived where the original config holds that relation."""
    old_width = next((original[k] for k in _WIDTH_KEYS if _is_int(original.get(k))), None)
    old_heads = next((original[k] for k in _HEAD_KEYS if _is_int(original.get(k))), None)
    if not (width and heads and old_width and old_heads):
        return
    if _is_int(d.get("attention_hidden_size")) and original["attention_hidden_size"] == 2 * old_width:
        d["attention_hidden_size"] = 2 * width
        if _is_int(original.get("attention_head_dim")) \
                and original["attention_head_dim"] == 2 * old_width // old_heads:
            d["attention_head_dim"] = 2 * width // heads
    expand, mamba_heads = d.get("mamba_expand"), d.get("n_mamba_heads")
    if _is_int(d.get("mamba_headdim")) and _is_int(mamba_heads) and isinstance(expand, (int, float)) \
            and original["mamba_headdim"] == int(expand * old_width) // mamba_heads:
        d["mamba_headdim"] = int(expand * width) // mamba_heads
    if _is_int(d.get("kv_channels")) and original["kv_channels"] == old_width // old_heads:
        d["kv_channels"] = width // heads
    if _is_int(d.get("num_query_groups")) and original["num_query_groups"] == old_heads:
        d["num_query_groups"] = heads


def _rescaled(sections: list[int], total: int) -> list[int]:
    """Multimodal RoPE sections (they must sum to head_dim / 2) scaled to ``total``, each at least 1."""
    scaled = [max(1, round(s * total / sum(sections))) for s in sections]
    scaled[0] += total - sum(scaled)
    return scaled


def _without_recipe(d: dict) -> dict:
    """``d`` without hf_condinit's recipe keys, in sub-configs too (a text config carries ``condinit``)."""
    return {k: _without_recipe(v) if isinstance(v, dict) else v for k, v in d.items()
            if k not in ("condinit", "condinit_attention")}


def shrink_config(config):
    """A miniature copy of ``config`` (same class and options; see the module docstring). ``config`` is unchanged."""
    d = _without_recipe(_shrink_dict(copy.deepcopy(config).to_dict()))
    small = type(config).from_dict(d)
    small.condinit = None
    return small


def shrink_by_attribute(config):
    """``config`` shrunk the way a researcher does it by hand, in place, and returned: each top-level integer size
    attribute (layers, width, heads, key/value heads (→ 2, or 1 for MQA), head dimension, feed-forward width,
    experts) set to the miniature's value with ``setattr``, nothing else touched: per-layer lists such as
    ``layer_types`` keep their full length, sub-configs their size and the vocabulary its size (its special token
    ids stay valid). An attribute whose setter refuses (Funnel's
    ``num_hidden_layers``) is left as it was. The plugin must take whatever config transformers builds from this
    (`hf_condinit.layouts.detect` proves the layout on a miniature made consistent, `shrink_config`)."""
    sizes = {**dict.fromkeys(_LAYER_KEYS, LAYERS), **dict.fromkeys(_WIDTH_KEYS, WIDTH),
             **dict.fromkeys(_HEAD_KEYS, HEADS), **dict.fromkeys(_HEAD_DIM_KEYS, HEAD_DIM),
             **dict.fromkeys(_FFN_KEYS, FFN), **dict.fromkeys(_EXPERT_KEYS, EXPERTS),
             **dict.fromkeys(_TOPK_KEYS, TOPK)}
    for key in _KV_KEYS:
        kv = getattr(config, key, None)
        if _is_int(kv) and kv > 0:
            sizes[key] = 1 if kv == 1 else 2
    for key, value in sizes.items():
        if _is_int(getattr(config, key, None)) and getattr(config, key) > value:
            try:
                setattr(config, key, value)
            except Exception:  # a computed attribute with a refusing setter: the researcher leaves it
                pass
    return config


def build_miniature(model_class, config):
    """``model_class`` built from ``shrink_config(config)`` on CPU in float32, in eval mode, without hf_condinit's
    init or variants (the layout proof records the model's own computation)."""
    small = shrink_config(config)
    with torch.device("cpu"):
        model = model_class._from_config(small, dtype=torch.float32)
    return model.eval()


def miniature_inputs(model, batch: int = 2, seq: int = 6, seed: int = 0) -> dict | None:
    """Forward kwargs for a miniature (random token ids, or pixels; both for dual encoders such as CLIP), or None
    when the input kind is not known."""
    gen = torch.Generator().manual_seed(seed)
    config = model.config
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        text = config.get_text_config()
        vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
        if not _is_int(vocab):
            return None
        inputs = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=gen)}
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), generator=gen)
        vision = getattr(config, "vision_config", None)
        takes_pixels = "pixel_values" in inspect.signature(model.forward).parameters
        image_tokens = any(getattr(config, k, None) is not None for k in ("image_token_id", "image_token_index"))
        if vision is not None and takes_pixels and not image_tokens:  # dual encoders (CLIP): both towers run
            pixels = _pixels(vision, batch, gen)
            if pixels is not None:
                inputs["pixel_values"] = pixels
        return inputs
    if name == "pixel_values":
        pixels = _pixels(getattr(config, "vision_config", None) or config, batch, gen)
        return None if pixels is None else {"pixel_values": pixels}
    return None


def _pixels(vision, batch: int, gen: torch.Generator) -> torch.Tensor | None:
    size = getattr(vision, "image_size", None)
    size = size[0] if isinstance(size, (list, tuple)) else size
    if not _is_int(size):
        return None
    return torch.randn(batch, getattr(vision, "num_channels", 3), size, size, generator=gen)
