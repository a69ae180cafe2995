"""DeepSpeed started by ``run_clm.py`` itself: the environment of a one-process launch when there is no launcher,
and DeepSpeed's comm layer, which ``zero.Init`` (ZeRO-3 builds the model inside it) needs before the model is built."""

from __future__ import annotations

import os

from .parsing import flags_given


def single_process_launch_env(argv) -> None:
    """``python run_clm.py --deepspeed ...`` without a launcher: give DeepSpeed the env a 1-process launcher would
    (otherwise ``zero.Init`` falls back to MPI discovery). Must run before ``TrainingArguments`` is built."""
    if "WORLD_SIZE" in os.environ or "RANK" in os.environ or not flags_given(argv, ("deepspeed",)):
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def maybe_init_distributed(training_args):
    """ZeRO-3 builds the model inside ``deepspeed.zero.Init``, which needs DeepSpeed's comm layer first; on CPU
    (``--use_cpu``) that must be gloo."""
    if not training_args.deepspeed:
        return
    import deepspeed
    import deepspeed.comm as ds_comm

    # accelerate has already set up torch.distributed (for world size > 1); DeepSpeed's own comm layer (which
    # zero.Init asks for the world size) is separate and must be initialised too, over the same backend.
    if not ds_comm.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if training_args.use_cpu else None)
