"""What the conditioned init writes, measured: orthogonality errors per layout and dtype, and κ(J) at init.

Part 1, for every layout adapter (one small model per family, 2 layers, hidden 256, 4 heads; Llama/Mistral/Qwen2
with GQA) and for fp32 and bf16 parameters, after ``from_config(..., condinit="conditioned")``:

- ``qk_orth``: max over layers, heads and roles q/k of ``max |W_hᵀ W_h − I|`` (W_h the (D, d) head block in math
  orientation, computed in float64 from the stored weights);
- ``v_ident``: max over layers of ``max |W_V − block identity|`` (``value_init="block_identity"``, the default).

Part 2, the attention-Jacobian condition number κ(J) (METHODS.md §6, method ``eig``) at init of a 4-layer,
256-wide, 4-head GPT-2 (vocab 1024) for the default, mimetic and conditioned init (seed 0), on a fixed probe of
``--probe-size`` × ``--probe-length`` random tokens with distinct first tokens: per layer the mean over heads under
the causal mask the model uses, and without it (``include_unmasked``).

Part 3 (``--parts vit_kappa``, needs an image file; ~4 CPU-minutes per init): κ(J) at init of layer 0 of the vision
harness's ViT (``configs/vit-cpu-cifar.json``: 65 tokens, 128 wide, 4 heads of 32) for the same three inits (seed
0), on the first image of ``--image-file`` (a ``datasets`` parquet file with an ``img`` column), per head, with
``method="svd"``. The default ``eig`` path cannot resolve κ above ~1e6 and its SVD refinement stops at
``SVD_REFINE_MAX_ELEMENTS``; this probe's J is 2,080 × 12,288, so the vision harness reports lower bounds, and this
part gives the resolved values.

    python benchmarks/init_report.py                 # parts 1 and 2, prints Markdown tables
    python benchmarks/init_report.py --parts vit_kappa --image-file ../shared/data/cifar10/test_dev.parquet
    python benchmarks/init_report.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageClassification)

import hf_condinit  # noqa: E402
from hf_condinit.layouts import get_layout  # noqa: E402

WIDTH = dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=2, intermediate_size=512)
FAMILIES = {
    "gpt2": dict(n_layer=2, n_embd=256, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=0),
    "bert": dict(WIDTH, vocab_size=64),
    "roberta": dict(WIDTH, vocab_size=64, pad_token_id=1),
    "vit": dict(WIDTH, image_size=8, patch_size=4),
    "deit": dict(WIDTH, image_size=8, patch_size=4),
    "llama": dict(WIDTH, num_key_value_heads=2, vocab_size=64),
    "mistral": dict(WIDTH, num_key_value_heads=1, vocab_size=64),
    "qwen2": dict(WIDTH, num_key_value_heads=2, vocab_size=64),
    "gpt_neox": dict(WIDTH, vocab_size=64),
    "crammed_bert": dict(WIDTH, vocab_size=64),
}


def orthogonality(model) -> dict[str, float]:
    """``qk_orth`` and ``v_ident`` (see the module docstring) over every attention block of ``model``."""
    layout = get_layout(model)
    qk, v = 0.0, 0.0
    for _, block in layout.attention_modules(model):
        g = layout.geometry(block, model.config)
        projections = layout.projections(block, g)
        for role in ("q", "k"):
            p = projections[role]
            for w in p.heads(p.weight.detach()):
                w = w.double()
                qk = max(qk, (w.T @ w - torch.eye(w.shape[1], dtype=torch.double)).abs().max().item())
        p = projections["v"]
        heads = torch.cat([w.double() for w in p.heads(p.weight.detach())], dim=1)  # (D, H_kv·d)
        target = torch.eye(g.hidden, dtype=torch.double)[:, : heads.shape[1]]
        v = max(v, (heads - target).abs().max().item())
    return {"qk_orth": qk, "v_ident": v}


def part_orthogonality() -> list[dict]:
    rows = []
    for model_type, kwargs in FAMILIES.items():
        for dtype in (torch.float32, torch.bfloat16):
            config = AutoConfig.for_model(model_type, **kwargs)
            model = AutoModel.from_config(config, condinit={"method": "conditioned", "seed": 0}, dtype=dtype)
            rows.append({"model_type": model_type, "layout": get_layout(model).name,
                         "dtype": str(dtype).replace("torch.", ""), **orthogonality(model)})
    return rows


def part_kappa(probe_size: int, probe_length: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(1, 1024, (probe_size, probe_length), generator=gen)
    probe[:, 0] = torch.arange(1, probe_size + 1)  # distinct first tokens (METHODS.md §6)
    config = AutoConfig.for_model("gpt2", n_layer=4, n_embd=256, n_head=4, vocab_size=1024, n_positions=256,
                                 bos_token_id=0, eos_token_id=0)
    rows = []
    for method in ("default", "mimetic", "conditioned"):
        model = AutoModelForCausalLM.from_config(config, condinit={"method": method, "seed": 0}).eval()
        report = hf_condinit.attention_jacobian_condition_number(model, probe, include_unmasked=True)
        layers = [lc.to_dict() for lc in report.layers]
        rows.append({"method": method, "causal": [lc["mean"] for lc in layers],
                     "unmasked": [lc["unmasked_mean"] for lc in layers], "seconds": report.seconds})
    return rows


def part_vit_kappa(image_file: str) -> list[dict]:
    import datasets
    from transformers import ViTImageProcessorPil

    from hf_condinit.vision import ImageTransform

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "vit-cpu-cifar.json")
    config = AutoConfig.from_pretrained(path)
    image = datasets.load_dataset("parquet", data_files={"probe": image_file}, split="probe[:1]")
    size = (config.image_size, config.image_size)
    proc = ViTImageProcessorPil(size={"height": size[0], "width": size[1]})  # the script's default processor
    transform = ImageTransform("img", "label", size, proc.image_mean, proc.image_std, train=False)
    pixels = torch.stack(transform({"img": image["img"]})["pixel_values"])  # (1, 3, H, W), as evaluation sees it
    rows = []
    for method in ("default", "mimetic", "conditioned"):
        model = AutoModelForImageClassification.from_config(config, condinit={"method": method, "seed": 0}).eval()
        report = hf_condinit.attention_jacobian_condition_number(model, pixels, layers=[0], method="svd")
        heads = report.layers[0].heads
        rows.append({"method": method, "kappa": [h.kappa for h in heads],
                     "lower_bound": [h.kappa_is_lower_bound for h in heads], "seconds": report.seconds})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["orthogonality", "kappa"],
                   choices=["orthogonality", "kappa", "vit_kappa"])
    p.add_argument("--probe-size", type=int, default=2)
    p.add_argument("--probe-length", type=int, default=16)
    p.add_argument("--image-file", default=None, help="parquet file with an `img` column (part vit_kappa)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args()
    torch.manual_seed(0)
    out = {}
    if "orthogonality" in args.parts:
        out["orthogonality"] = part_orthogonality()
        print("| model type | layout | dtype | max abs(WᵀW − I), Q/K heads | max abs(W_V − I) |\n|---|---|---|---|---|")
        for r in out["orthogonality"]:
            print(f"| {r['model_type']} | {r['layout']} | {r['dtype']} | {r['qk_orth']:.2e} | {r['v_ident']:.2e} |")
    if "kappa" in args.parts:
        out["kappa"] = part_kappa(args.probe_size, args.probe_length)
        print(f"\nκ(J) at init, GPT-2 4×256, probe {args.probe_size}×{args.probe_length}, mean over heads per layer:")
        print("| init | causal (layers 0..3) | unmasked (layers 0..3) | s |\n|---|---|---|---|")
        for r in out["kappa"]:
            fmt = lambda v: " / ".join(f"{x:.3g}" for x in v)  # noqa: E731
            print(f"| {r['method']} | {fmt(r['causal'])} | {fmt(r['unmasked'])} | {r['seconds']:.1f} |")
    if "vit_kappa" in args.parts:
        if not args.image_file or not os.path.isfile(args.image_file):
            p.error("--parts vit_kappa needs --image-file FILE (a parquet file with an `img` column)")
        out["vit_kappa"] = part_vit_kappa(args.image_file)
        print("\nκ(J) at init, ViT 6×128 (vit-cpu-cifar), layer 0, one image, method svd, per head:")
        print("| init | κ per head (* = lower bound) | s |\n|---|---|---|")
        for r in out["vit_kappa"]:
            ks = " / ".join(f"{k:.3g}{'*' if lb else ''}" for k, lb in zip(r["kappa"], r["lower_bound"]))
            print(f"| {r['method']} | {ks} | {r['seconds']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
