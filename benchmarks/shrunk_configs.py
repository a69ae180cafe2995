"""Never stricter than transformers: configs shrunk by attribute, with and without ``condinit=True``.

``python benchmarks/shrunk_configs.py [--types a b ...] [--timeout 120] [--out FILE.jsonl]``: for every causal /
masked LM model type of the installed transformers (or the ones given), shrinks the default config the way a
researcher does by hand (`hf_condinit.layouts.miniature.shrink_by_attribute`: ``cfg.num_hidden_layers = 2``,
``cfg.hidden_size = 64``, ... with per-layer lists such as ``layer_types`` left at full length), builds it with
transformers alone (``from_config(cfg)``), then with ``condinit=True``. It prints one line per type and the count
the plugin must keep at zero: types that transformers builds, that docs/coverage.md lists as supported, and that the
plugin refuses, other than a hybrid whose shrunk config keeps only non-attention layers (Qwen3.5's first two layers
are Gated DeltaNet: refused with that reason, counted apart). With ``--out`` it writes one JSON line per type there
(nothing is written otherwise).
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import _per_type as P  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The refusal of a hybrid config whose kept layers hold no softmax attention (``hf_condinit.layouts.detect``): the
#: type is supported, the config has nothing to condition, which the plugin says instead of building it silently.
NO_ATTENTION_LAYER = "no softmax-attention layer"
COVERAGE_TABLE = os.path.join(REPO_ROOT, "docs", "coverage.md")


def lm_types() -> list[str]:
    """The causal and masked LM model types of the installed transformers."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES))


def supported_in_table(path: str = COVERAGE_TABLE) -> set[str]:
    """Model types whose docs/coverage.md row has both inits ``ok``."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 6 and cells[5] == "ok" and cells[6] == "ok":  # | type | class | layout | via | cond | mim
                out.add(cells[1])
    return out


def probe(model_type: str) -> dict:
    """``{"model_type", "transformers", "condinit"}``: each ``"ok"`` or ``"<ExceptionType>: <message>"``."""
    from transformers import AutoConfig

    from hf_condinit.coverage import auto_class
    from hf_condinit.inertness import MAX_PARAMETERS, meta_parameter_count
    from hf_condinit.layouts.miniature import shrink_by_attribute

    row = {"model_type": model_type, "transformers": "", "condinit": ""}
    try:
        config = shrink_by_attribute(AutoConfig.for_model(model_type))
        auto = auto_class(config)
        size = meta_parameter_count(lambda: auto.from_config(config))  # some stay large (experts, vocab)
        if size > MAX_PARAMETERS:
            row["transformers"] = f"skipped: {size / 1e6:.0f}M parameters when shrunk by attribute"
            return row
        torch.manual_seed(0)
        auto.from_config(config)
        row["transformers"] = "ok"
    except Exception as err:
        row["transformers"] = f"{type(err).__name__}: {_one_line(err)}"
        return row
    try:
        torch.manual_seed(0)
        auto.from_config(config, condinit=True)
        row["condinit"] = "ok"
    except Exception as err:
        row["condinit"] = f"{type(err).__name__}: {_one_line(err)}"
    return row


def _one_line(err: BaseException, n: int = 300) -> str:
    return re.sub(r"\s+", " ", str(err))[:n]


def main(argv: list[str] | None = None) -> int:
    args = P.parser(__doc__, "every causal / masked LM type").parse_args(argv)
    types = args.types or lm_types()
    unknown = sorted(set(types) - set(lm_types()))
    if unknown:
        print(f"error: not causal / masked LM types of this transformers: {' '.join(unknown)}", file=sys.stderr)
        return 2
    if P.out_is_folder(args.out):
        return 2

    import hf_condinit  # noqa: F401

    supported = supported_in_table()

    def probe_row(model_type: str) -> dict:
        return {**probe(model_type), "supported_in_table": model_type in supported}

    rows, seconds = P.probe_each(
        types, probe_row,
        lambda model_type, err: {"model_type": model_type, "transformers": f"timeout: {err}", "condinit": "",
                                 "supported_in_table": model_type in supported},
        lambda row: f"{row['model_type']:32s} transformers: {row['transformers'][:60]:60s} "
                    f"condinit=True: {row['condinit'][:120]}", args.timeout)
    built = [r for r in rows if r["transformers"] == "ok"]
    accepted = [r for r in built if r["condinit"] == "ok"]
    refused = [r for r in built if r["condinit"] != "ok" and r["supported_in_table"]]
    no_attention = [r for r in refused if NO_ATTENTION_LAYER in r["condinit"]]
    stricter = [r for r in refused if r not in no_attention]
    print(f"\n{len(rows)} causal / masked LM types; transformers builds {len(built)} shrunk by attribute; "
          f"condinit=True accepted on {len(accepted)}, refused on {len(built) - len(accepted)}; "
          f"supported in docs/coverage.md, refused because the shrunk config places no softmax-attention layer "
          f"(its first layers are other mixers): {len(no_attention)} "
          f"{' '.join(r['model_type'] for r in no_attention)}; "
          f"supported but refused otherwise (must be 0): {len(stricter)}"
          f" {' '.join(r['model_type'] for r in stricter)}  ({seconds:.0f} s)")
    P.write_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
