"""The pieces the example scripts share, one module per concern; import them from :mod:`hf_condinit.scripts_common`
(the public entry point, which re-exports everything a script calls).

- :mod:`.errors`: user errors (one line, exit 2) and :func:`~.errors.run_main`;
- :mod:`.arguments`: :class:`~.arguments.CondInitArguments` and the default sets;
- :mod:`.parsing`: :func:`~.parsing.parse_and_set_up` and the parsing under it (defaults, run modes);
- :mod:`.flag_checks`: the range of every numeric flag;
- :mod:`.launch`: launcher, world size and device, reported once at start;
- :mod:`.machine`: the accelerator and the defaults that depend on it;
- :mod:`.deepspeed_checks`: the DeepSpeed file and its agreement with the flags;
- :mod:`.model_checks`: ``--attention`` and the init flags against the machine and the model;
- :mod:`.model_config`: ``--model_config`` / ``--config_overrides``;
- :mod:`.trainer`: :class:`~.trainer.CondInitTrainer` and the callbacks the flags add;
- :mod:`.lifecycle`: resume-or-stop, the folder's lock, splits, train and save, evaluate;
- :mod:`.checkpoints`: atomic checkpoints, their check before a resume, rotation, a full disk;
- :mod:`.run_lock`: one run per ``--output_dir``;
- :mod:`.logs`: quiet HF-example logging.
"""
