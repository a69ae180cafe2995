"""``python -m hf_condinit.study``: :func:`hf_condinit.study.cli.console`."""

from .cli import console

if __name__ == "__main__":
    console()
