"""What the example scripts (``run_clm.py``, ``run_mlm.py``, ``run_glue.py``, ``run_image_classification.py``) and
any new script share: the public entry point. The code lives in :mod:`hf_condinit.scripts`, one module per concern;
this module re-exports what a script calls (see docs/development.md, "Writing a new script").

What every script calls (one call each):

- :func:`parse_and_set_up` (or :func:`parse_script_args` for a script with its own set-up): parse the flags or one
  ``.json`` file, apply :data:`SCRIPT_DEFAULTS`, the machine's defaults (no accelerator: no pinned memory;
  ``--deepspeed`` without an accelerator: ``--use_cpu``) and the script's defaults (e.g.
  :data:`LM_TRAINING_DEFAULTS`, docs/methods.md §7) to the flags the user did not give, make a flag imply its strategy
  (``--save_steps`` → ``--save_strategy steps``), check every numeric flag's range (:data:`FLAG_RANGES`) and the
  DeepSpeed file, train and evaluate when no ``--do_*`` flag is given (:func:`set_run_modes`), give each arm its
  own ``--output_dir`` (:func:`default_output_dir`), set up quiet logging and print one line on the launch
  (launcher, world size, device: :func:`report_launch`).
- :class:`UsageError` / :func:`user_errors` / :func:`run_main`: a user error (bad flag, missing or bad file,
  impossible combination) prints one line ``<script>: error: ...`` on stderr and exits 2, as argparse does; a real
  bug keeps its traceback. ``with user_errors(output_dir):`` turns the ``ValueError`` / ``OSError`` raised inside it
  into a :class:`UsageError` and removes ``output_dir`` if the block created it.
- :func:`find_last_checkpoint`: the resume-or-stop policy for an ``--output_dir`` that already holds a run (the
  newest complete checkpoint); :func:`claim_output_dir`, first inside ``with user_errors(output_dir):``: one run per
  folder.
- :func:`check_attention_usable`, :func:`check_loaded_model_flags`, :meth:`CondInitArguments.condinit_dict`: the
  model flags against the machine, the model class and each other, before any work; :func:`recipe_applies`: a
  model type without an attention layout is built as transformers does unless a plugin flag asks for the layout.
- :class:`CondInitTrainer`: no weight decay on ``condinit_`` holders, biases and norms, a non-finite loss stops the
  run, quiet tied-weight resumes; :func:`train_and_save`, :func:`evaluate_with_perplexity`: the shared tail.

How "not set by the user" is detected: the defaults are installed as *parser* defaults with
``HfArgumentParser.set_defaults`` (argparse's own mechanism), so an explicit flag always wins and an absent flag
takes the default; for a ``.json`` argument file, the defaults are merged under the file's keys before
``parse_dict``. No value is compared against HF's own defaults (``--weight_decay 0.0`` given explicitly stays 0.0).
"""

from __future__ import annotations

from .commands import run_main
from .errors import UsageError, user_errors
from .names import known_attention_names, known_init_names
from .scripts.arguments import (
    LM_TRAINING_DEFAULTS,
    SCRIPT_DEFAULTS,
    CondInitArguments,
    HubArguments,
    TokenizerHubArguments,
)
from .scripts.deepspeed_checks import check_deepspeed_file, validate_deepspeed_config
from .scripts.deepspeed_launch import maybe_init_distributed, single_process_launch_env
from .scripts.flag_checks import FLAG_RANGES, check_numeric_flags
from .scripts.launch import launch_summary, launcher_name, report_launch, single_process_warning
from .scripts.levers import SpeedLeverArguments, apply_speed_levers, check_resume_vocabulary, check_speed_levers
from .scripts.lifecycle import (
    claim_output_dir,
    evaluate_with_perplexity,
    find_last_checkpoint,
    select_splits,
    train_and_save,
)
from .scripts.logs import setup_logging
from .scripts.machine import has_accelerator
from .scripts.model_checks import check_attention_usable, check_loaded_model_flags, recipe_applies
from .scripts.model_config import (
    config_for_model_type,
    model_class,
    parse_config_overrides,
    resolve_model_config,
    with_causal_loss_type,
)
from .scripts.parsing import (
    default_output_dir,
    flags_given,
    parse_and_set_up,
    parse_args_with_defaults,
    parse_script_args,
    set_run_modes,
)
from .scripts.trainer import (
    CondInitTrainer,
    make_condition_number_callback,
    make_periodic_checkpoint_callback,
    make_throughput_callback,
)

__all__ = [
    "UsageError",
    "user_errors",
    "run_main",
    "SCRIPT_DEFAULTS",
    "parse_script_args",
    "set_run_modes",
    "default_output_dir",
    "has_accelerator",
    "check_attention_usable",
    "check_loaded_model_flags",
    "recipe_applies",
    "check_numeric_flags",
    "FLAG_RANGES",
    "check_deepspeed_file",
    "launcher_name",
    "launch_summary",
    "single_process_warning",
    "report_launch",
    "CondInitArguments",
    "LM_TRAINING_DEFAULTS",
    "parse_args_with_defaults",
    "flags_given",
    "validate_deepspeed_config",
    "CondInitTrainer",
    "claim_output_dir",
    "make_condition_number_callback",
    "make_periodic_checkpoint_callback",
    "make_throughput_callback",
    "known_attention_names",
    "known_init_names",
    "setup_logging",
    "select_splits",
    "with_causal_loss_type",
    "parse_config_overrides",
    "resolve_model_config",
    "find_last_checkpoint",
    "train_and_save",
    "evaluate_with_perplexity",
    "parse_and_set_up",
    "HubArguments",
    "TokenizerHubArguments",
    "maybe_init_distributed",
    "single_process_launch_env",
    "SpeedLeverArguments",
    "apply_speed_levers",
    "check_resume_vocabulary",
    "check_speed_levers",
    "config_for_model_type",
    "model_class",
]
