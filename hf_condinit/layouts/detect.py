"""Layouts for model types that are not in the table: detected from naming conventions, proved on a miniature.

`get_layout(model)` (re-exported as `hf_condinit.layouts.get_layout`) returns the registered layout of the model's
``model_type``, else `detected_layout(model)`, which (an unexpected error becomes a `LayoutError` naming the type):

1. refuses what has no per-head W_Q/W_K/W_V to condition, saying why: multi-head latent attention (MLA: a
   ``kv_lora_rank`` / ``q_lora_rank`` in the config, DeepSeek-V2/V3, MiniCPM3), models without softmax
   attention (state-space, recurrent and convolutional mixers) and the attention of `NO_LAYOUT`'s types;
2. builds a miniature of the same model class (`miniature.build_miniature`: a 2-layer, 64-wide copy of its config);
3. lists candidate layouts from the names of the attention modules' children (`SEPARATE_NAMES`, `FUSED_NAMES`,
   `OUTPUT_NAMES`; for fused projections every ordering of `hf_condinit.layouts.fused`; after each separate
   candidate, its gated-attention readings, a query projection that also holds the output gate in each of
   `hf_condinit.layouts.separate.GATE_ORDERS`);
4. proves each candidate on the miniature (`proof.prove_layout`; on a hybrid, only the blocks of the classes that
   call HF's attention interface, `_restrict_to_softmax_blocks`) and returns the first that passes, with its
   ``core`` (the module that calls the attention function) taken from the proof and ``variant_refusal`` set when the
   attention does not go through HF's attention interface or passes terms the variants do not implement;
5. builds the miniature once with conditioned init (`init_trial_refusal`): a stack the layout does not reach
   refuses the type, with the reason. Each attention variant is tried the same way when a model first asks for it
   (`variant_trial_refusal`).

Nothing is written to the real model before that. Results are cached per (model type, model class, transformers
version) for the process, proved on the model type's base model (`AutoModel`) where it has one. No candidate proved → `LayoutError` naming the model type and how to register a layout.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn

from ..registry import LAYOUTS
from .base import RUNTIME_VARIANT_CHECKS, AttentionLayout, LayoutError, text_scope
from .fused import FusedQKVLayout
from .miniature import build_miniature, miniature_inputs, shrink_config
from .proof import LayoutProof, prove_layout, record_attention, register_proof_implementation
from .proof import PROOF_IMPLEMENTATION, using_attn_implementation
from .separate import GATE_ORDERS, GatedQuerySeparateLayout, SeparateQKVLayout, storage_of

__all__ = ["get_layout", "NO_LAYOUT", "SEPARATE_NAMES", "FUSED_NAMES", "OUTPUT_NAMES", "detected_layout",
           "detect_layout",
           "refusal_reason", "REGISTER_HINT", "proof_refusal", "installed_route_refusal", "variant_trial_refusal",
           "init_trial_refusal", "base_model_class"]

SEPARATE_NAMES = (
    ("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("q_lin", "k_lin", "v_lin"),
    ("query_proj", "key_proj", "value_proj"), ("q", "k", "v"), ("wq", "wk", "wv"), ("to_q", "to_k", "to_v"),
    ("q_linear", "k_linear", "v_linear"), ("linear_q", "linear_k", "linear_v"), ("Wq", "Wk", "Wv"),
    ("q_proj.linear", "k_proj.linear", "v_proj.linear"),
    ("q_gate_proj", "k_proj", "v_proj"),
)
FUSED_NAMES = ("qkv_proj", "Wqkv", "query_key_value", "c_attn", "W_pack", "qkv", "in_proj", "qkv_linear", "wqkv")
OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin", "o", "wo", "Wo", "proj", "out", "output.dense",
                "to_out.0", "o_linear", "out_linear", "linear_out", "output", "o_proj.linear")
# ordering, order, chunks of `FusedQKVLayout`, in the order they are tried
FUSED_ORDERINGS = (("concat", "qkv", 1), ("grouped", "qkv", 1), ("concat", "qvk", 4), ("concat", "qkv", 4))

REGISTER_HINT = (
    "Register a layout that says where q/k/v/o live, e.g. hf_condinit.register_layout('{model_type}', "
    "hf_condinit.layouts.SeparateQKVLayout(q='attn.q', k='attn.k', v='attn.v', o='attn.out')) (or "
    "FusedQKVLayout for a fused projection); tests can check it with hf_condinit.layouts.proof.prove_layout."
)

NO_SOFTMAX = {
    "mamba": "a selective state-space (Mamba) mixer", "mamba2": "a selective state-space (Mamba-2) mixer",
    "falcon_mamba": "a selective state-space (Mamba) mixer", "rwkv": "an RWKV linear-recurrent mixer",
    "xlstm": "an xLSTM recurrent mixer", "recurrent_gemma": "RG-LRU recurrent blocks with local attention",
}

#: Types with softmax attention that no layout here can write head by head, and why (each is checked in the tests to
#: fail detection without this entry, so a reason never outlives the architecture it describes).
NO_LAYOUT = {
    "xlnet": "q, k, v and o are (D, H, d) parameters of the attention module used in einsums, not linear "
             "projections (the layouts write nn.Linear / Conv1D weights), and its two-stream scores add "
             "relative-position and segment terms",
    "esmc": "its query and key LayerNorms normalise all heads together (over H·d, mean subtracted), so each head's "
            "query and key depend on every head's projection: W_Q and W_K have no per-head block that reaches the "
            "attention alone",
    "neomme": "a head's output reaches W_O after exclusive self-attention (its component along the head's value "
              "removed) and a sigmoid gate from a separate projection (output_projection.gate_proj), so W_O's block "
              "h does not read head h's attention output",
    "dory": "the heads' gated outputs are L2-normalised together over H·d (nGPT's attn_sub_norm) before W_O, so W_O's "
            "block h does not read head h's attention output alone",
    "zamba": "its attention is one transformer block shared (tied) by every hybrid layer, whose q/k/v read "
             "[h; embeddings] (2·D wide) while W_O writes D; the layouts here take W_O to write the width q/k/v read "
             "(mimetic's V·O target is one square D×D matrix)",
    "zamba2": "its attention is one transformer block shared by the hybrid layers, whose q/k/v read [h; embeddings] "
              "(2·D wide) while W_O writes D; the layouts here take W_O to write the width q/k/v read (mimetic's V·O "
              "target is one square D×D matrix)",
}

# layer kinds of hybrid configs (``layer_types`` / ``layers_block_type``) that hold no softmax attention
NON_SOFTMAX_LAYERS = ("linear_attention", "mamba", "conv", "mlp")


def refusal_reason(config) -> str | None:
    """Why a model type can have no layout at all (None when detection may try)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", None)
    if any(getattr(c, "kv_lora_rank", None) or getattr(c, "q_lora_rank", None) for c in (config, text)):
        return (f"{model_type} uses multi-head latent attention (MLA), where the papers' per-head W_Q, W_K, W_V "
                "from X do not exist: a head's query, key and value are products through normalised low-rank "
                "latents (q_lora_rank, kv_lora_rank) shared by all heads, with one shared RoPE key, so orthogonal "
                "up-projections alone leave κ of those products set by the shared down-projections, and "
                "conditioning those too writes weights that no paper's method touches (docs/methods.md, "
                "\"Multi-head latent attention\")")
    if model_type in NO_SOFTMAX:
        return f"{model_type} has no softmax attention to condition: its token mixer is {NO_SOFTMAX[model_type]}"
    if model_type in NO_LAYOUT:
        return (f"{model_type}'s attention is not one whose heads hf_condinit's layouts can write: "
                f"{NO_LAYOUT[model_type]}")
    kinds = next((k for k in (getattr(text, "layer_types", None), getattr(text, "layers_block_type", None))
                  if isinstance(k, (list, tuple)) and k), None)
    n_layers = getattr(text, "num_hidden_layers", None)
    if kinds and isinstance(n_layers, int) and n_layers > 0:
        kinds = kinds[:n_layers]  # layer i reads entry i (a config shrunk by attribute keeps the full list)
    if kinds and all(kind in NON_SOFTMAX_LAYERS for kind in kinds):
        return (f"this {model_type} config has no softmax-attention layer (its layers are "
                f"{', '.join(sorted(set(kinds)))}): set layer_types (or attn_layer_indices) to place attention layers")
    return None


def _projection(module: nn.Module, path: str) -> nn.Module | None:
    try:
        m = module.get_submodule(path)
    except AttributeError:
        return None
    return m if storage_of(m) is not None else None


def _find_output(holder: nn.Module, parents: list[tuple[str, nn.Module]]) -> tuple[nn.Module, str, str] | None:
    """(block, prefix of the holder inside the block, output path) for the first output projection found in the
    holder or, failing that, in one of its ancestors (BERT keeps W_O next to its self-attention module)."""
    for name in OUTPUT_NAMES:
        if _projection(holder, name) is not None:
            return holder, "", name
    prefix = ""
    child = holder
    for parent_name, parent in parents:
        child_name = next((n for n, m in parent.named_children() if m is child), None)
        if child_name is None:
            return None
        prefix = f"{child_name}.{prefix}" if prefix else f"{child_name}."
        for name in OUTPUT_NAMES:
            if not name.startswith(child_name) and _projection(parent, name) is not None:
                return parent, prefix, name
        child = parent
    return None


def candidate_layouts(model: nn.Module) -> list[AttentionLayout]:
    """Layouts that the names of ``model``'s modules suggest (unproved), in the order they are tried."""
    scope = text_scope(model)
    named = dict(model.named_modules())
    seen, out = set(), []
    for name, module in named.items():
        if scope and not name.startswith(scope):
            continue
        parts = name.split(".") if name else []
        parents = [(".".join(parts[:k]), named[".".join(parts[:k])]) for k in range(len(parts) - 1, max(-1, len(parts) - 3), -1)]
        for q, k, v in SEPARATE_NAMES:
            if all(_projection(module, p) is not None for p in (q, k, v)):
                found = _find_output(module, parents)
                if found is not None:
                    _, prefix, o = found
                    key = ("sep", prefix, q, k, v, o)
                    if key not in seen:
                        seen.add(key)
                        out.append(SeparateQKVLayout(f"{prefix}{q}", f"{prefix}{k}", f"{prefix}{v}", o,
                                                     name=f"auto_separate:{prefix}{q}/{o}"))
                        out.extend(GatedQuerySeparateLayout(f"{prefix}{q}", f"{prefix}{k}", f"{prefix}{v}", o,
                                                            gate_order=order,
                                                            name=f"auto_gated:{prefix}{q}/{o}:{order}")
                                   for order in GATE_ORDERS)
        for fused in FUSED_NAMES:
            qkv = _projection(module, fused)
            if qkv is None:
                continue
            found = _find_output(module, parents)
            if found is None:
                continue
            _, prefix, o = found
            for ordering, order, chunks in FUSED_ORDERINGS:
                key = ("fused", prefix, fused, o, ordering, order, chunks)
                if key not in seen:
                    seen.add(key)
                    out.append(FusedQKVLayout(f"{prefix}{fused}", o, storage=storage_of(qkv), ordering=ordering,
                                              order=order, chunks=chunks,
                                              name=f"auto_fused:{prefix}{fused}/{o}:{ordering}-{order}-{chunks}"))
    return out


def proof_refusal(proof: LayoutProof) -> str | None:
    """Why the attention variants cannot run where ``proof`` recorded the attention (None: they can)."""
    if proof.via != "interface":
        return "its attention is computed inline, not through HF's attention interface, where the variants plug in"
    if proof.extra:
        return f"its attention function receives {', '.join(proof.extra)}, which the variants do not implement"
    return None


def _with_core(layout: AttentionLayout, proof: LayoutProof) -> AttentionLayout:
    layout.core = proof.core or ""
    layout.variant_refusal = proof_refusal(proof)
    layout.detected = True
    return layout


_ROUTES: dict[tuple, str | None] = {}


def installed_route_refusal(layout: AttentionLayout, config) -> str | None:
    """Why the variants cannot run on ``config``'s model in the INSTALLED transformers because its attention does
    not go through HF's attention interface (None: it does, or there is no base model class to tell).

    A family's route changes between transformers versions (GPT-J and CodeGen compute attention inline in 5.17 and
    call the interface in 5.25), so a static table cannot say it. A base model class that declares
    ``_supports_attention_backend`` calls the interface; for one that does not (some still do, e.g. Falcon in 5.25),
    the layout proof on a miniature of ``config`` records where the attention is computed. Cached per (transformers
    version, miniature config) for the process.
    """
    model_class = base_model_class(config)
    if model_class is None:
        return None
    if getattr(model_class, "_supports_attention_backend", False):
        return None
    key = (transformers.__version__, shrink_config(config).to_json_string())
    if key not in _ROUTES:
        mini = build_miniature(model_class, config)
        inputs = miniature_inputs(mini)
        if inputs is None:
            _ROUTES[key] = (f"{model_class.__name__} does not declare HF's attention interface "
                            "(_supports_attention_backend) and no miniature input could be built to check it")
        else:
            _ROUTES[key] = proof_refusal(prove_layout(mini, layout, inputs))
    return _ROUTES[key]


def base_model_class(config) -> type | None:
    """The model type's base model class (`AutoModel`'s for ``type(config)``: every tower and stack), None for a
    config without one (a sub-model's config such as AIMv2's text tower)."""
    from transformers import AutoModel

    if type(config) not in AutoModel._model_mapping:
        return None
    found = AutoModel._model_mapping[type(config)]
    return found[0] if isinstance(found, (tuple, list)) else found  # Funnel maps to (FunnelModel, FunnelBaseModel)


def trial_accept(key: tuple, config, layout: AttentionLayout) -> str | None:
    """``detect_layout``'s ``accept`` for the model type ``key`` of ``config``: `init_trial_refusal` with
    ``layout`` as the type's layout (cached under ``key`` while the trial builds; removed again when refused)."""
    remember_layout(key, layout)
    reason = init_trial_refusal(config)
    if reason:
        del _CACHE[key]
    return reason


def init_trial_refusal(config) -> str | None:
    """Why the inits cannot be applied to ``config``'s model although its layout proved (None: they can): the base
    model (`AutoModel`) of ``shrink_config(config)`` built with ``condinit="conditioned"`` must build. It fails where
    the layout does not reach every stack that initialises itself: a sub-model with its own model type whose layout
    cannot be proved alone (T5Gemma's decoder needs encoder states), or a stack whose attention the layout does not
    match (LED's Longformer encoder); or it builds, but the layout's blocks are not the ones the init wrote
    (`_unwritten_block`). Call with the type's layout already cached (the build looks it up)."""
    model_class = base_model_class(config)
    if model_class is None:
        return None
    try:
        model = model_class._from_config(shrink_config(config), dtype=torch.float32, condinit="conditioned")
    except Exception as err:  # the reason, whatever failed
        text = " ".join(str(err).split())
        return (f"a 2-layer miniature of {model_class.__name__} does not build with conditioned init "
                f"({type(err).__name__}: {text[:300]})")
    return _unwritten_block(model)


def _unwritten_block(model: nn.Module) -> str | None:
    """Why the layout's blocks of a miniature built with conditioned init are not what the init wrote (None: every
    block's first query head is semi-orthogonal): the layout matched attention that another sub-model initialises
    without the init (GIT's vision tower, when the layout is read there)."""
    from ..init.functional import semi_orthogonality_error  # here: hf_condinit.init builds on the layouts

    layout = get_layout(model)
    for name, block in layout.attention_modules(model):
        geometry = layout.geometry(block, model.config)
        q = layout.projections(block, geometry)["q"]
        if semi_orthogonality_error(q.heads(q.weight.detach().double())[0]) > 1e-4:
            return (f"conditioned init does not reach attention block {name!r} of layout {layout.name!r} on a 2-layer "
                    f"miniature of {type(model).__name__} (its query heads are not semi-orthogonal after the build): "
                    "the layout matched attention that a sub-model initialises on its own")
    return None


_TRIALS: dict[tuple, str | None] = {}
_TRYING: list[str] = []  # variants whose trial is running: the miniature's own build skips the trial


def variant_trial_refusal(config, implementation: str) -> str | None:
    """Why ``implementation`` cannot run on ``config``'s model, found by trying it (None: a miniature built with it
    ran a forward pass). The miniature is the base model (`AutoModel`: every tower and stack) of
    ``shrink_config(config)``, built with ``attn_implementation=implementation`` and fed `miniature_inputs`; any
    error there (a sub-model without HF's attention interface or without a provable layout, an attention module
    that does not receive its input the way the variant reads it) is the reason. Cached per (transformers version,
    variant, miniature config) for the process; no base model class, or no input recipe: None (nothing to try)."""
    model_class = base_model_class(config)
    if _TRYING or model_class is None:
        return None
    small = shrink_config(config)
    key = (transformers.__version__, implementation, small.to_json_string())
    if key not in _TRIALS:
        _TRYING.append(implementation)
        try:
            mini = model_class._from_config(small, dtype=torch.float32, attn_implementation=implementation).eval()
            inputs = miniature_inputs(mini)
            if inputs is not None:
                with torch.no_grad():
                    mini(**inputs)
            _TRIALS[key] = None
        except Exception as err:  # the reason, whatever failed
            text = " ".join(str(err).split())
            _TRIALS[key] = (f"a 2-layer miniature of {model_class.__name__} built with it fails "
                            f"({type(err).__name__}: {text[:300]})")
        finally:
            _TRYING.pop()
    return _TRIALS[key]


def detect_layout(model: nn.Module, inputs: dict, accept=None) -> tuple[AttentionLayout, LayoutProof]:
    """The first candidate layout that proves on ``model`` (a miniature) and that ``accept(layout)`` (None: every
    proved one) does not refuse, with the proof; LayoutError otherwise, with each candidate's reason."""
    model_type = getattr(model.config, "model_type", None)
    reason = refusal_reason(model.config)
    if reason:
        raise LayoutError(f"hf_condinit refuses {model_type}: {reason}.")
    candidates = candidate_layouts(model)
    if not candidates:
        raise LayoutError(
            f"hf_condinit found no attention projections in {type(model).__name__} (model_type={model_type!r}) by "
            "any known naming convention (q_proj/k_proj/v_proj, query/key/value, qkv_proj, Wqkv, query_key_value, "
            f"c_attn, ...): no softmax attention, or unusual names. " + REGISTER_HINT.format(model_type=model_type)
        )
    failures = []
    for layout in candidates:
        try:
            _restrict_to_softmax_blocks(model, layout, inputs)
            proof = prove_layout(model, layout, inputs)
            if proof.core and proof.core != layout.core:  # re-prove with the geometry read from the core module
                layout.core = proof.core
                proof = prove_layout(model, layout, inputs)
            layout = _with_core(layout, proof)
            refusal = accept(layout) if accept is not None else None
            if refusal is None:
                return layout, proof
            failures.append(f"{layout.name}: proved, but {refusal}")
        except LayoutError as err:
            failures.append(f"{layout.name}: {err}")
        except Exception as err:  # a candidate whose shapes make the model's forward fail
            failures.append(f"{layout.name}: {type(err).__name__}: {err}")
    if failures and all(": proved, but " in f for f in failures):
        raise LayoutError(f"hf_condinit refuses {model_type}: " + " | ".join(failures)[:1500] + ".")
    raise LayoutError(
        f"hf_condinit could not prove any attention layout for model_type={model_type!r} "
        f"({type(model).__name__}); tried: " + " | ".join(failures)[:1500] + ". "
        + REGISTER_HINT.format(model_type=model_type)
    )


def _restrict_to_softmax_blocks(model: nn.Module, layout: AttentionLayout, inputs: dict) -> None:
    """On a hybrid, ``layout.block_classes`` := the classes of the blocks that call HF's attention interface in a
    forward of ``model``, when the names also match blocks of other classes that never call it (a linear-attention,
    state-space or convolution mixer); unchanged otherwise (every matched block calls it, or none does, or a class
    does in one block and not in another: the proof decides)."""
    blocks = layout.attention_modules(model)
    if len({type(m) for _, m in blocks}) < 2:  # one class (or none): nothing to tell apart, the model is not touched
        return
    register_proof_implementation()
    with using_attn_implementation(model, PROOF_IMPLEMENTATION):
        rec = record_attention(model, [m for _, m in blocks], inputs, products=False)
    calling = {type(m).__name__ for (_, m), calls in zip(blocks, rec.calls) if calls}
    silent = {type(m).__name__ for (_, m), calls in zip(blocks, rec.calls) if not calls}
    if calling and silent and not calling & silent:
        layout.block_classes = frozenset(calling)


_CACHE: dict[tuple, tuple[AttentionLayout | None, str | None]] = {}


def remember_layout(key: tuple, layout: AttentionLayout) -> None:
    """Take ``layout`` as the proved layout of the model type ``key`` (``(model_type, transformers version)``), as
    `detected_layout` does once its detection passes."""
    _CACHE[key] = (layout, None)


def _miniature_classes(config, model_class) -> list:
    """Classes to build the miniature from: the model type's base model first (it runs every attention module,
    e.g. both stacks of an encoder-decoder, where a sub-model such as BART's decoder alone skips cross-attention),
    then the class asked for."""
    base = base_model_class(config)
    classes = [base] if base is not None else []
    if model_class is not None and model_class not in classes:
        classes.append(model_class)
    return classes


def detected_layout(model_or_config) -> AttentionLayout:
    """The proved layout for a model of an unregistered type (detected on a miniature, cached per model type and
    transformers version); LayoutError otherwise."""
    config = getattr(model_or_config, "config", model_or_config)
    model_class = type(model_or_config) if isinstance(model_or_config, nn.Module) else None
    key = (config.model_type, transformers.__version__)
    reason = refusal_reason(config)  # per config, not cached: a hybrid config may or may not place attention layers
    if reason:
        raise LayoutError(f"hf_condinit refuses {config.model_type}: {reason}.")
    if key not in _CACHE:
        with torch.random.fork_rng(devices=[]):  # the miniatures' init leaves the caller's random stream as it was
            _CACHE[key] = _detect_for(config, model_class, key)
    layout, error = _CACHE[key]
    if layout is None:
        raise LayoutError(error)
    return layout


def _detect_for(config, model_class, key) -> tuple[AttentionLayout | None, str | None]:
    """`detected_layout`'s work for one model type: (layout, None), or (None, the refusal)."""
    errors = []
    for cls in _miniature_classes(config, model_class):
        try:
            mini = build_miniature(cls, config)
            inputs = miniature_inputs(mini)
            if inputs is None:
                raise LayoutError(f"hf_condinit cannot build inputs to prove a layout for {cls.__name__} "
                                  f"(main input {mini.main_input_name!r}). "
                                  + REGISTER_HINT.format(model_type=config.model_type))
            return detect_layout(mini, inputs, accept=lambda lay: trial_accept(key, config, lay))[0], None
        except LayoutError as err:
            errors.append(str(err))
        except Exception as err:
            errors.append(f"hf_condinit could not build a miniature {cls.__name__} to prove a layout for "
                          f"model_type={config.model_type!r} ({type(err).__name__}: {err}). "
                          + REGISTER_HINT.format(model_type=config.model_type))
    return None, errors[0] if errors else f"no model class for {config.model_type!r}"


def _runtime_variant_refusal(layout: AttentionLayout, config, implementation: str | None) -> str | None:
    """`AttentionLayout.refuse_variant`'s checks that build models: `installed_route_refusal`, then, for a detected
    family and a named ``implementation``, `variant_trial_refusal`."""
    with torch.random.fork_rng(devices=[]):  # the miniatures' init leaves the caller's random stream as it was
        reason = installed_route_refusal(layout, config)
        if reason is None and implementation is not None and layout.detected:
            reason = variant_trial_refusal(config, implementation)
    return reason


RUNTIME_VARIANT_CHECKS.append(_runtime_variant_refusal)


def get_layout(model_or_config) -> AttentionLayout:
    """The layout adapter for a model (or config): the registered one for ``config.model_type``, else one detected
    from the attention modules' names and proved on a miniature of the same model class (`detected_layout`).

    Raises:
        LayoutError: for a model type that is refused (MLA, no softmax attention) or whose layout could not be
            proved, naming the model type, the reason and how to register a layout; an unexpected error inside
            detection is refused the same way, naming it.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    owner = type(model_or_config).__name__
    try:
        return detected_layout(model_or_config)
    except LayoutError as err:
        raise LayoutError(f"hf_condinit has no attention layout for {owner} (model_type={model_type!r}): {err}") \
            from None
    except Exception as err:  # a bug of detection or of the model: a refusal that says what failed
        text = " ".join(str(err).split())[:400]
        raise LayoutError(
            f"hf_condinit has no attention layout for {owner} (model_type={model_type!r}): detecting it failed "
            f"({type(err).__name__}: {text}). " + REGISTER_HINT.format(model_type=model_type)
        ) from err
