"""The flags every script shares: :class:`CondInitArguments` (``--init`` / ``--attention`` / method options, 1:1 with
:class:`hf_condinit.config.CondInitConfig`), HF's hub fields (:class:`HubArguments`, :class:`TokenizerHubArguments`)
and the default sets :data:`LM_TRAINING_DEFAULTS` (docs/methods.md §7) and
:data:`SCRIPT_DEFAULTS`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..callbacks import DEFAULT_PROBE_LENGTH, DEFAULT_PROBE_SIZE
from ..names import did_you_mean, known_attention_names, known_init_names
from ..errors import UsageError, user_errors


# docs/methods.md §7 "LM settings used by the project unless a user overrides them". bf16 is not forced: it depends on
# the hardware (pass --bf16 on GPUs that have it; the DeepSpeed configs use "auto").
LM_TRAINING_DEFAULTS: dict[str, Any] = {
    "optim": "adamw_torch",
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "weight_decay": 0.1,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,  # < 1: a fraction of the total steps (transformers 5 semantics)
    "max_grad_norm": 1.0,
    "learning_rate": 3e-4,
    "logging_steps": 50,
}


#: Defaults of every script (explicit flags win): a non-finite loss must reach the logs, where
#: ``NonFiniteLossCallback`` stops the run (HF's default filter would replace it by the running mean).
SCRIPT_DEFAULTS: dict[str, Any] = {"logging_nan_inf_filter": False}


@dataclass
class HubArguments:
    """HF's ``ModelArguments`` fields for reading a model, config, tokenizer or image processor (a folder or a hub id),
    with HF's names, meaning and defaults; a script's ``ModelArguments`` inherits them. :meth:`hub_kwargs` gives the
    keyword arguments of every ``from_pretrained`` / ``from_config`` call that reads one."""

    cache_dir: str | None = field(default=None, metadata={"help": "Cache directory for hub downloads and datasets."})
    model_revision: str = field(
        default="main",
        metadata={"help": "The model version to load from the hub: a branch name, tag name or commit id."},
    )
    token: str | None = field(default=None, metadata={"help": "Hub token, for private models, configs and data."})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow a hub repository or folder to run its own model code (``auto_map`` in its "
                          "config.json). Only for repositories whose code you have read."},
    )

    def hub_kwargs(self) -> dict[str, Any]:
        """``cache_dir``, ``revision``, ``token`` and ``trust_remote_code`` for ``from_pretrained`` / ``from_config``."""
        return {"cache_dir": self.cache_dir, "revision": self.model_revision, "token": self.token,
                "trust_remote_code": self.trust_remote_code}


@dataclass
class TokenizerHubArguments(HubArguments):
    """:class:`HubArguments` plus HF's ``--use_fast_tokenizer`` (the text scripts)."""

    use_fast_tokenizer: bool = field(
        default=True,
        metadata={"help": "Use a fast (tokenizers-backed) tokenizer. Transformers 5 has only fast tokenizers: "
                          "False is accepted, as in HF's scripts, and changes nothing."},
    )

    def tokenizer_kwargs(self) -> dict[str, Any]:
        """:meth:`hub_kwargs` plus ``use_fast`` for ``AutoTokenizer.from_pretrained``."""
        return {**self.hub_kwargs(), "use_fast": self.use_fast_tokenizer}


#: ``--init`` / ``--attention`` value that leaves the choice to the model (its own init, transformers' attention).
MODEL_DEFAULT = "default"


@dataclass
class CondInitArguments:
    """Flags of the attention initialisation and variants; each option maps 1:1 to a ``CondInitConfig`` field.

    Options left at ``None`` are not passed, so ``CondInitConfig``'s own defaults apply (docs/methods.md §1-5).
    At their defaults (:meth:`plugin_flags` empty) a model type hf_condinit has no attention layout for is built and
    trained as transformers does (:func:`hf_condinit.scripts.model_checks.recipe_applies`).
    """

    init: str = field(
        default="default",
        metadata={"help": "Attention init scheme: default (the model's own), mimetic, or conditioned (alias: "
                          "orthogonal)."},
    )
    attention: str = field(
        default=MODEL_DEFAULT,
        metadata={
            "help": "Attention implementation: default (the model's own: transformers' choice, sdpa where the model "
            "supports it, else eager), sdpa, eager, or an hf_condinit variant (affine_scaled, attention_sink, "
            "preconditioned); HF's flash_attention_2/3/4 and flex_attention where this machine and model support "
            "them (checked before any work)."
        },
    )
    condinit_seed: int | None = field(
        default=None, metadata={"help": "Seed of the init scheme's generators (default: --seed)."}
    )
    generator: str | None = field(
        default=None,
        metadata={"help": "Where the init scheme's generators live: cpu (default: the same weights on every device) or "
                          "device (the device the model is built on: faster there, but a GPU build then differs from "
                          "a CPU build of the same seed)."},
    )
    value_init: str | None = field(default=None, metadata={"help": "conditioned: 'block' (default) or 'per_head'."})
    qk_gain: float | None = field(default=None, metadata={"help": "conditioned: scale of the Q/K blocks (default 1)."})
    v_gain: float | None = field(default=None, metadata={"help": "conditioned: scale of the V identity (default 1)."})
    mimetic_alpha1: float | None = field(default=None, metadata={"help": "mimetic α1 (default 0.7)."})
    mimetic_beta1: float | None = field(default=None, metadata={"help": "mimetic β1 (default 0.7)."})
    mimetic_alpha2: float | None = field(default=None, metadata={"help": "mimetic α2 (default 0.4)."})
    mimetic_beta2: float | None = field(default=None, metadata={"help": "mimetic β2 (default 0.4)."})
    mimetic_vo_sign: int | None = field(default=None, metadata={"help": "mimetic sign of the VO identity (-1|+1)."})
    mimetic_dist: str | None = field(default=None, metadata={"help": "mimetic Z distribution: uniform|normal."})
    spectral_lambda: float | None = field(
        default=None, metadata={"help": "Enable spectral conditioning with this λ (paper's best: 10)."}
    )
    spectral_mode: str | None = field(default=None, metadata={"help": "spectral: identity (default) or svd."})
    affine_rho: float | None = field(default=None, metadata={"help": "affine_scaled: EMA factor of α_ma (0.9)."})
    affine_bias_length: str | None = field(default=None, metadata={"help": "affine_scaled: visible|full."})
    precond_eps: float | None = field(default=None, metadata={"help": "preconditioned: ε (1e-6)."})
    precond_scale: str | None = field(default=None, metadata={"help": "preconditioned: none|sqrt_d."})
    log_condition_number_every: int = field(
        default=0,
        metadata={"help": "Log the attention-Jacobian κ every N optimizer steps (and at step 0); 0 disables. Each "
                          "measurement costs many training steps (benchmarks/throughput.py): 500 or more."},
    )
    condition_number_probe_size: int = field(
        default=DEFAULT_PROBE_SIZE, metadata={"help": "Sequences in the κ probe batch (taken from the evaluation data)."}
    )
    condition_number_probe_length: int = field(
        default=DEFAULT_PROBE_LENGTH, metadata={"help": "Tokens per probe sequence for the κ diagnostic."}
    )
    save_minutes: float = field(
        default=0.0,
        metadata={"help": "Also save a checkpoint every M minutes of training (wall time, whatever a step costs), so "
                          "that a kill without warning (SIGKILL, out of memory) costs at most M minutes; 0 (default): "
                          "only --save_steps' and a signal's checkpoints (hf_condinit.callbacks."
                          "PeriodicCheckpointCallback)."},
    )
    log_throughput: bool = field(
        default=False,
        metadata={"help": "Add tokens/s, MFU (known GPUs) and peak accelerator memory to every training log line "
                          "(hf_condinit.callbacks.ThroughputCallback; keys throughput/...)."},
    )

    # Fields that are CondInitConfig options (same names).
    OPTION_FIELDS = (
        "generator", "value_init", "qk_gain", "v_gain", "mimetic_alpha1", "mimetic_beta1", "mimetic_alpha2",
        "mimetic_beta2", "mimetic_vo_sign", "mimetic_dist", "spectral_lambda", "spectral_mode", "affine_rho",
        "affine_bias_length", "precond_eps", "precond_scale",
    )  # fmt: skip

    def __post_init__(self):
        if self.log_condition_number_every < 0:
            raise ValueError(f"--log_condition_number_every must be >= 0, got {self.log_condition_number_every}")
        self.validate_names()

    def validate_names(self) -> None:
        """Raise a :class:`UsageError` for an unknown ``--init`` or ``--attention`` name, with the closest known one
        and the accepted ones (aliases included: ``orthogonal`` = ``conditioned``)."""
        from hf_condinit.config import INIT_METHOD_ALIASES

        inits = known_init_names()
        if self.init not in inits and self.init not in INIT_METHOD_ALIASES:
            aliases = "".join(f", {a} (alias of {b})" for a, b in INIT_METHOD_ALIASES.items())
            raise UsageError(f"unknown --init {self.init!r}{did_you_mean(self.init, [*inits, *INIT_METHOD_ALIASES])}; "
                             f"choose one of: {', '.join(inits)}{aliases}")
        atts = [MODEL_DEFAULT, *known_attention_names()]
        if self.attention == "spectral":
            raise UsageError("--attention spectral: spectral conditioning is not an attention implementation; pass "
                             "--spectral_lambda λ (the paper's best: 10), with any --attention.")
        if self.attention not in atts:
            raise UsageError(f"unknown --attention {self.attention!r}{did_you_mean(self.attention, atts)}; choose one "
                             f"of: {', '.join(atts)}")

    @property
    def attn_implementation(self) -> str | None:
        """``attn_implementation=`` for ``from_config`` / ``from_pretrained``: ``None`` (transformers chooses) for
        ``--attention default``, else the name given."""
        return None if self.attention == MODEL_DEFAULT else self.attention

    def plugin_flags(self) -> list[str]:
        """The flags given that need hf_condinit's attention layout of the model, as typed: ``--init`` other than
        default, an hf_condinit ``--attention`` variant, ``--spectral_lambda``, ``--log_condition_number_every``
        (e.g. ``["--init conditioned"]``); empty at the defaults."""
        from hf_condinit.config import INIT_METHOD_ALIASES
        from hf_condinit.registry import ATTENTION_VARIANTS

        flags = []
        if INIT_METHOD_ALIASES.get(self.init, self.init) != "default":
            flags.append(f"--init {self.init}")
        if self.attention in ATTENTION_VARIANTS:
            flags.append(f"--attention {self.attention}")
        if self.spectral_lambda is not None:
            flags.append(f"--spectral_lambda {self.spectral_lambda:g}")
        if self.log_condition_number_every:
            flags.append(f"--log_condition_number_every {self.log_condition_number_every}")
        return flags

    def condinit_dict(self, seed: int) -> dict[str, Any]:
        """The ``condinit=`` dict for ``from_config``: method, seed, and every option the user set.

        Validated through ``CondInitConfig`` so a bad option (e.g. ``--value_init diagonal``) fails here, and an
        option the method or ``--attention`` never reads (``--init mimetic --value_init per_head``) is refused.
        """
        out: dict[str, Any] = {"method": self.init, "seed": self.condinit_seed if self.condinit_seed is not None else seed}
        for name in self.OPTION_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        from hf_condinit.config import CondInitConfig, check_options_apply

        with user_errors():
            CondInitConfig.from_dict(dict(out))  # raises with the accepted values
            check_options_apply(out, attention=self.attention)
        return out
