"""The newer decoder families on real weights, the coverage tool on a fixed list, and refusals of the variants.

Each family is built from its shrunk default config (`hf_condinit.layouts.miniature.shrink_config`) through the Auto
class, as a user would: ``from_config(cfg, condinit=...)``. The checks (`hf_condinit.coverage.check_conditioned`,
`check_mimetic`) recompute what the weights must be independently of the schemes (identity, WᵀW, SVD truncation of
the redrawn targets); the full table is `python -m hf_condinit.coverage` (a benchmark, docs/coverage.md).
"""

import pytest
import torch
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from hf_condinit.coverage import auto_class, check_conditioned, check_mimetic, main
from hf_condinit.coverage_report import README_END, README_START
from hf_condinit.layouts import LayoutError
from hf_condinit.layouts.miniature import shrink_config

from utils import REPO

ISSUE_FAMILIES = ["qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "olmo2", "mixtral", "starcoder2", "smollm3",
                  "gpt_oss", "falcon", "bloom", "opt", "gpt_bigcode", "modernbert", "distilbert", "deberta-v2",
                  "electra", "xlm-roberta"]


def small(model_type, **overrides):
    config = shrink_config(AutoConfig.for_model(model_type, **overrides))
    return auto_class(config), config


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


@pytest.mark.parametrize("model_type, variant, says", [
    ("siglip_vision_model", "affine_scaled", "the attention input X was not passed"),  # no **kwargs to the function
])
def test_a_variant_that_fails_on_a_miniature_is_refused_up_front(model_type, variant, says):
    """Detected families: each variant is tried on a miniature before a model takes it (`variant_trial_refusal`)."""
    from hf_condinit.layouts import get_layout

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not in this transformers")
    auto, config = small(model_type)
    assert get_layout(config).detected
    with pytest.raises(LayoutError, match=rf"not available for model_type='{model_type}': a 2-layer miniature.*{says}"):
        auto.from_config(config, attn_implementation=variant)
    auto.from_config(config, condinit={"method": "conditioned", "seed": 0})  # the inits still apply


@pytest.mark.parametrize("model_type, says", [
    ("led", "found no attention block in LEDEncoder"),  # its Longformer encoder: other names
    ("t5gemma", "no attention layout for T5GemmaDecoder"),  # a decoder that cannot be proved alone
])
def test_a_type_whose_stacks_the_layout_does_not_reach_is_refused_up_front(model_type, says):
    """`init_trial_refusal`: the layout proved, but a conditioned build of the miniature fails: refused with the
    reason at the first lookup, before any weight of the real model is written."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type} is not in this transformers")
    auto, config = small(model_type)
    with pytest.raises(LayoutError, match=rf"model_type='?{model_type}'?.*proved, but a 2-layer miniature .* does not "
                                          rf"build with conditioned init .*{says}"):
        auto.from_config(config, condinit={"method": "conditioned", "seed": 0})


def test_a_proved_layout_the_init_does_not_reach_gives_way_to_the_next():
    """GIT: q_proj/out_proj proves on the vision tower, which initialises itself without the init; the trial sees
    that the layout's blocks are not what the init wrote, and the text stack's layout (query/key/value) is used."""
    from hf_condinit.layouts import get_layout

    auto, config = small("git")
    assert get_layout(config).name == "auto_separate:self.query/output.dense"
    assert check_conditioned(auto.from_config(config, condinit={"method": "conditioned", "seed": 0})) == 2


def test_the_init_pass_keeps_what_the_scheme_wrote():
    """ImageGPT's root `_init_weights` re-draws every c_proj weight after the blocks were initialised: mimetic's
    W_O must survive it, and the protection flags must be gone afterwards (apply_init still sees its own weights)."""
    import hf_condinit

    auto, config = small("imagegpt")
    model = auto.from_config(config, condinit={"method": "mimetic", "seed": 0})
    assert check_mimetic(model) == 2
    assert not any(getattr(p, "_is_hf_initialized", False) for p in model.parameters())
    hf_condinit.apply_init(model, "mimetic", seed=0)  # no "loaded from a checkpoint" refusal
    assert check_mimetic(model) == 2


def test_conditioned_check_on_heads_wider_than_the_model():
    """A head wider than the model (Inkling's miniature keeps 128-wide sliding-window heads at hidden 64): the
    head's rows are orthonormal (W Wᵀ = I_D), which the check accepts, and a default init still fails it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         intermediate_size=32, num_hidden_layers=2, vocab_size=64)
    model = AutoModelForCausalLM.from_config(config, condinit={"method": "conditioned", "seed": 0})
    assert check_conditioned(model) == 2
    with pytest.raises(AssertionError, match="WᵀW"):
        check_conditioned(AutoModelForCausalLM.from_config(config))


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_coverage_cli_on_a_fixed_list_writes_only_what_it_is_given(tmp_path, monkeypatch, capsys):
    """Run in an empty working folder: the table goes to --out, the counts into README's marked block, and nothing
    else appears."""
    monkeypatch.chdir(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_START}\nold\n{README_END}\nrest\n")
    assert main(["--types", "qwen3", "bloom", "mamba", "--out", "docs/coverage.md", "--readme", "README.md"]) == 0
    assert _tree(tmp_path) == ["README.md", "docs", "docs/coverage.md"]
    table = (docs / "coverage.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["qwen3"].count(" ok ") == 6  # both inits and the four variants
    assert "bloom_interleaved (table) | tensor_ops | ok | ok | refused | refused | refused | ok" in rows["bloom"]
    assert "no softmax attention" in rows["mamba"]
    assert "init supported (conditioned and mimetic, weights checked, forward/backward): **2**" in table
    text = readme.read_text()
    assert "old" not in text and text.endswith("rest\n") and "[docs/coverage.md](docs/coverage.md)" in text
    assert "(weights checked, forward/backward): **2**" in text and max(map(len, text.splitlines())) <= 120
    # a second run may replace the table it wrote itself
    assert main(["--types", "mamba", "--out", "docs/coverage.md"]) == 0
    assert "model types: 1;" in (docs / "coverage.md").read_text()


def test_the_families_summary_counts_each_type_in_each_kind_it_has(tmp_path, monkeypatch, capsys):
    """One type of each kind: Llama dense, Qwen3.5 hybrid (Gated DeltaNet layers) and gated, Jamba hybrid (Mamba
    layers), DeepSeek-V3 MLA, Mamba without softmax attention, ESMC refused with its architecture's reason (no kind
    proved)."""
    monkeypatch.chdir(tmp_path)
    types = ["llama", "qwen3_5_text", "jamba", "deepseek_v3", "mamba", "esmc"]
    missing = [t for t in types if t not in CONFIG_MAPPING]
    if missing:
        pytest.skip(f"the installed transformers has no model type {', '.join(missing)}")
    assert main(["--types", *types, "--out", "coverage.md"]) == 0
    summary = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:3]
               for line in (tmp_path / "coverage.md").read_text().split("\n| model type |")[0].splitlines()
               if line.startswith("| ") and not line.startswith("| kind")}
    assert summary == {"dense": ["1", "1"], "hybrid": ["2", "2"], "gated": ["1", "1"], "MLA": ["1", "0"],
                       "non-attention": ["1", "0"], "no proved layout": ["1", "0"]}


def test_coverage_cli_without_out_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--types", "mamba"]) == 0
    out = capsys.readouterr().out
    assert "mamba" in out and "no softmax attention" in out
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("argv, says", [
    (["--types", "lama"], "unknown model type 'lama' (did you mean 'llama'?)"),
    (["--types", "qwen3", "--out", "mine.md"], "--out mine.md exists and was not written by hf_condinit.coverage"),
    (["--types", "qwen3", "--out", "docs"], "--out docs is a folder"),
    (["--types", "qwen3", "--readme", "mine.md"], "--readme links the counts to the full table: pass --out FILE"),
    (["--types", "qwen3", "--out", "new.md", "--readme", "mine.md"], f"--readme mine.md has no {README_START}"),
])
def test_coverage_cli_refuses_in_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.md").write_text("# my notes\n")
    (tmp_path / "docs").mkdir()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m hf_condinit.coverage: error: ") and says in err, err
    assert (tmp_path / "mine.md").read_text() == "# my notes\n" and _tree(tmp_path) == ["docs", "mine.md"]


def test_the_readme_and_the_table_are_the_ones_the_tool_regenerates():
    """`--out docs/coverage.md --readme README.md` (docs/families.md) must find what it rewrites: the table's
    generated-by header and README's marked block."""
    from hf_condinit.coverage_report import GENERATED_MARK, _readme_parts

    assert GENERATED_MARK in (REPO / "docs" / "coverage.md").read_text().split("\n| ")[0]
    head, tail = _readme_parts(str(REPO / "README.md"))
    assert README_START not in head + tail and README_END not in head + tail


def test_coverage_cli_force_overwrites_a_foreign_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.md").write_text("# my notes\n")
    assert main(["--types", "mamba", "--out", "mine.md", "--force"]) == 0
    assert "Generated by `python -m hf_condinit.coverage`" in (tmp_path / "mine.md").read_text()


def test_variant_on_a_multimodal_model_goes_to_its_language_model_and_survives_save_load(tmp_path):
    from hf_condinit.attention.holder_base import iter_holders
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
