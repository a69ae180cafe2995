"""Tiny configs per family (built in code, no downloads) and shared test helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

REPO = Path(__file__).resolve().parents[1]
# Real text and GLUE files (provenance in SOURCES.md there); never copied into the repo. Tests needing them skip
# when they are absent.
SHARED_DATA = REPO.parent / "shared" / "data"
TINYSTORIES = SHARED_DATA / "tinystories" / "TinyStories-train.sample-2MiB.txt"
WIKI_VALID = SHARED_DATA / "wikitext" / "wikitext-2-raw" / "wiki.valid.raw"
WIKI_TRAIN = SHARED_DATA / "wikitext" / "wikitext-2-raw" / "wiki.train.first999lines.raw"
GLUE_DIR = SHARED_DATA / "glue"


def needs(path: Path):
    """Mark a test to skip when a file or folder of ``../shared/data`` is missing."""
    return pytest.mark.skipif(not path.exists(), reason=f"real data not found at {path} (../shared/data)")


# transformers loads a Trainer checkpoint's optimizer state only on torch >= 2.6 (CVE-2025-32434: before it,
# torch.load(weights_only=True) could run code); below that a resume is refused by transformers itself.
needs_trainer_resume = pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6),
    reason="transformers resumes a Trainer checkpoint only on torch >= 2.6 (CVE-2025-32434)",
)


def require(path: Path) -> Path:
    """Skip the calling test (or fixture) when ``path`` is missing; return it otherwise."""
    if not path.exists():
        pytest.skip(f"real data not found at {path} (../shared/data)")
    return path


def load_script(relative_path: str, name: str | None = None):
    """Import a script of the repo (``run_clm.py``, ``benchmarks/compare.py``) as a module, once per session.

    A second import would replace ``sys.modules[name]`` with new classes, and the first module's objects (e.g. its
    ``TrainingArguments`` subclass, pickled by the Trainer into checkpoints) would no longer pickle."""
    name = name or Path(relative_path).stem
    path = (REPO / relative_path).resolve()
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def checkpoint_write_order(folder) -> list[str]:
    """The files of a checkpoint folder (relative paths) in the order they were written (mtime), its manifest last:
    the stages at which a kill during its save can stop."""
    import os

    from hf_condinit.checkpoints import MANIFEST_NAME

    files = [os.path.relpath(os.path.join(r, n), folder) for r, _, ns in os.walk(folder) for n in ns]
    return sorted(files, key=lambda rel: (rel == MANIFEST_NAME, os.stat(os.path.join(folder, rel)).st_mtime_ns))


def assert_matches_eager(model, eager, out, ref, tol: dict, backward: bool) -> None:
    """A compiled ``model`` against its ``eager`` copy after one forward each: the outputs ``out`` / ``ref`` within
    ``tol``; with ``backward``, the gradients of ``out.square().sum()`` within ``tol``, parameter by parameter; the
    buffers (α_ma included) bit-equal."""
    torch.testing.assert_close(out, ref, **tol)
    if backward:
        out.square().sum().backward()
        ref.square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m, name=name: f"{name}: {m}")
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, rtol=0, atol=0, msg=name)


def copy_files(src, dst, files) -> None:
    """Copy ``files`` (paths relative to ``src``) into ``dst``, creating folders."""
    import os
    import shutil

    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy2(os.path.join(src, rel), os.path.join(dst, rel))


# model_type -> kwargs of AutoConfig.for_model; every model_type of layouts/table.py must appear here.
MINI_CONFIGS = {
    "gpt2": dict(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0),
    "bert": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=64,
                 max_position_embeddings=32),
    "roberta": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                    vocab_size=64, max_position_embeddings=40, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "vit": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, image_size=8,
                patch_size=4),
    "deit": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, image_size=8,
                 patch_size=4),
    # two stages of one block (widths 16 and 32, 2 and 4 heads: the geometry changes per block), window 2
    "swin": dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2, image_size=16, patch_size=4,
                 mlp_ratio=2.0),
    "llama": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=64, vocab_size=64, max_position_embeddings=32, attention_bias=True),
    "mistral": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=2,
                    intermediate_size=64, vocab_size=64, max_position_embeddings=32),
    "qwen2": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=64, vocab_size=64, max_position_embeddings=32),
    "gpt_neox": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                     vocab_size=64, max_position_embeddings=32, attention_bias=True),
    "crammed_bert": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                         vocab_size=64, max_position_embeddings=32),
}

VISION_TYPES = {"vit", "deit", "swin"}


def mini_config(model_type: str, **overrides):
    return AutoConfig.for_model(model_type, **{**MINI_CONFIGS[model_type], **overrides})


def example_inputs(model_type: str, config, batch: int = 2, seq: int = 6, seed: int = 0) -> dict:
    """Model inputs that exercise every layer (token ids, or pixels for vision models)."""
    gen = torch.Generator().manual_seed(seed)
    if model_type in VISION_TYPES:
        return {"pixel_values": torch.randn(batch, config.num_channels, config.image_size, config.image_size,
                                            generator=gen)}
    return {"input_ids": torch.randint(3, config.vocab_size, (batch, seq), generator=gen)}


def gpt2_conditioned_checks(model):
    """Conditioned init on GPT-2's fused c_attn (math orientation (D, 3·H·d)): per-head QᵀQ = KᵀK = I, V = block I."""
    H, D = model.config.n_head, model.config.n_embd
    d = D // H
    for block in model.transformer.h:
        W = block.attn.c_attn.weight.detach().double()
        for part in (0, 1):
            for h in range(H):
                blk = W[:, part * D + h * d : part * D + (h + 1) * d]
                assert torch.allclose(blk.T @ blk, torch.eye(d, dtype=torch.double), atol=1e-5)
        assert torch.equal(W[:, 2 * D :], torch.eye(D, dtype=torch.double))
        assert torch.count_nonzero(block.attn.c_attn.bias) == 0
