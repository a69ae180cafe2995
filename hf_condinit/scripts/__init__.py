"""The pieces the example scripts share, one module per concern; import them from :mod:`hf_condinit.scripts_common`
(the public entry point, which re-exports everything a script calls). docs/development.md, "Writing a new script".

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
- :mod:`.logs`: quiet HF-example logging.

They stand on the library, never the other way round: user errors (:mod:`hf_condinit.errors`), how a command ends
(:mod:`hf_condinit.commands`), checkpoints (:mod:`hf_condinit.checkpoints`) and the ``--output_dir`` lock
(:mod:`hf_condinit.locks`) live there, since the study's CLI and the callbacks use them too.
"""
