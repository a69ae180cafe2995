"""The families of issue 19 on real weights, the coverage tool on a fixed list, and refusals of the variants.

Each family is built from its shrunk default config (`hf_condinit.layouts.miniature.shrink_config`) through the Auto
class, as a user would: ``from_config(cfg, condinit=...)``. The checks (`hf_condinit.coverage.check_conditioned`,
`check_mimetic`) recompute what the weights must be independently of the schemes (identity, WᵀW, SVD truncation of
the redrawn targets); the full table is `python -m hf_condinit.coverage` (a benchmark, docs/coverage.md).
"""

import pytest
import torch
from transformers import AutoConfig

from hf_condinit.coverage import _auto_class, check_conditioned, check_mimetic, main
from hf_condinit.layouts import LayoutError
from hf_condinit.layouts.miniature import shrink_config

ISSUE_FAMILIES = ["qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "olmo2", "mixtral", "starcoder2", "smollm3",
                  "gpt_oss", "falcon", "bloom", "opt", "gpt_bigcode", "modernbert", "distilbert", "deberta-v2",
                  "electra", "xlm-roberta"]


def small(model_type, **overrides):
    config = shrink_config(AutoConfig.for_model(model_type, **overrides))
    return _auto_class(config), config


@pytest.mark.parametrize("model_type", ISSUE_FAMILIES)
def test_issue_families_take_both_inits_checked_on_the_real_weights(model_type):
    auto, config = small(model_type)
    for method, check in (("conditioned", check_conditioned), ("mimetic", check_mimetic)):
        torch.manual_seed(0)
        model = auto.from_config(config, condinit={"method": method, "seed": 0})
        assert check(model) == 2, method


def test_checks_fail_on_other_weights():
    auto, config = small("qwen3")
    default = auto.from_config(config)
    with pytest.raises(AssertionError, match="WᵀW"):
        check_conditioned(default)
    conditioned = auto.from_config(config, condinit={"method": "conditioned", "seed": 0})
    with pytest.raises(AssertionError, match="relative error"):
        check_mimetic(conditioned)


def test_multimodal_model_gets_the_init_on_its_language_model():
    auto, config = small("llava")
    model = auto.from_config(config, condinit={"method": "conditioned", "seed": 0})
    assert check_conditioned(model) == 2  # the language model's blocks; the vision tower keeps its own init
    vision_q = next(m.weight for n, m in model.named_modules() if "vision" in n and n.endswith("q_proj"))
    gram = vision_q[:16] @ vision_q[:16].T
    assert not torch.allclose(gram, torch.eye(16), atol=1e-3)


@pytest.mark.parametrize("model_type, variant, reason", [
    ("gpt_oss", "attention_sink", "s_aux"),
    ("gemma2", "affine_scaled", "soft-capped"),
])
def test_variants_are_refused_before_any_work_with_the_reason(model_type, variant, reason):
    auto, config = small(model_type)
    with pytest.raises(LayoutError, match=rf"attn_implementation='{variant}' is not available.*{reason}"):
        auto.from_config(config, attn_implementation=variant)


def test_coverage_cli_on_a_fixed_list(tmp_path, capsys):
    out, readme = tmp_path / "coverage.md", tmp_path / "README.md"
    readme.write_text("# x\n<!-- coverage:start -->\nold\n<!-- coverage:end -->\nrest\n")
    assert main(["--types", "qwen3", "bloom", "mamba", "--out", str(out), "--readme", str(readme)]) == 0
    table = out.read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["qwen3"].count(" ok ") == 6  # both inits and the four variants
    assert "bloom_interleaved (table) | tensor_ops | ok | ok | refused | refused | refused | ok" in rows["bloom"]
    assert "no softmax attention" in rows["mamba"]
    assert "init supported (conditioned and mimetic, weights checked, forward/backward): **2**" in table
    text = readme.read_text()
    assert "old" not in text and "`qwen3`" in text and text.endswith("rest\n")
    assert main(["--types", "not_a_model_type", "--out", str(out)]) == 2


def test_variant_on_a_multimodal_model_goes_to_its_language_model_and_survives_save_load(tmp_path):
    from hf_condinit.modules import iter_holders
    from hf_condinit.layouts.miniature import miniature_inputs

    auto, config = small("idefics3")  # its vision tower has no layout: it must keep SDPA, not fail
    model = auto.from_config(config, attn_implementation="attention_sink").eval()
    names = [n for n, _ in iter_holders(model)]
    assert len(names) == 2 and all(n.startswith("text_model.") for n in names)
    with torch.no_grad():
        for _, holder in iter_holders(model):
            holder.logit.fill_(0.5)
    inputs = miniature_inputs(model)
    model.save_pretrained(tmp_path)
    reloaded = auto.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs)[0], model(**inputs)[0])
