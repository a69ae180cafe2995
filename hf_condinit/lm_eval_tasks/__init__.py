"""Task YAMLs for lm-evaluation-harness (``pip install 'hf_condinit[lm_eval]'``), read from local files.

``blimp_local/``: BLiMP's 67 paradigms as tasks ``blimp_local_<paradigm>`` and the group ``blimp_local``, reading
the JSONL files of a local folder (``--metadata '{"blimp_dir": DIR}'``, or the ``HF_CONDINIT_BLIMP_DIR``
environment variable) instead of downloading ``nyu-mll/blimp``. They score a sentence exactly as
``hf_condinit.zero_shot`` does with its default ``prefix="eos"``: empty context (lm-eval prepends its prefix token,
the tokenizer's BOS, else EOS) and no space before the sentence (``target_delimiter: ""``; lm-eval's own ``blimp``
tasks use ``" "``, so they score `` <sentence>``). See docs/zero_shot.md.

    lm_eval --model hf --model_args pretrained=RUN_DIR --include_path $(python -m hf_condinit.lm_eval_tasks) \\
        --tasks blimp_local --metadata '{"blimp_dir": "../shared/data/blimp"}' --log_samples --output_path out
"""

import os

#: The folder to pass to lm-eval's ``--include_path`` / ``TaskManager(include_path=...)``.
TASKS_DIR = os.path.dirname(os.path.abspath(__file__))
