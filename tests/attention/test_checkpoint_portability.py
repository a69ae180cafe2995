"""A checkpoint whose forward needs hf_condinit loads exactly in plain transformers, or refuses.

Checkpoints of every variant (GPT-2: affine_scaled, attention_sink, preconditioned, unmerged spectral; Llama:
affine_scaled, attention_sink, spectral; BERT: affine_scaled, preconditioned) are saved with non-trivial holder
values, then loaded in ONE subprocess where ``import hf_condinit`` raises (a meta-path blocker): with
``trust_remote_code=True`` the logits must equal the saved model's (≤ 1e-5); an Auto class without it, and the
family's concrete class, must raise (never a plain model). Plain checkpoints (conditioned init, merged spectral) stay
plain. The same for the output folders of tiny ``run_clm.py`` runs.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM  # noqa: E402

import hf_condinit  # noqa: E402
from hf_condinit.attention.compile_guard import compile_refusal  # noqa: E402
from hf_condinit.attention.portable import PORTABLE_FILE, bundle_source, loading_instructions  # noqa: E402
from hf_condinit.attention.reference import randomise_holders  # noqa: E402

from utils import TINYSTORIES, load_script, needs  # noqa: E402

CONFIGS = {
    "gpt2": dict(n_layer=2, n_embd=32, n_head=4, vocab_size=101, n_positions=64, bos_token_id=0, eos_token_id=0),
    "llama": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64, vocab_size=101, bos_token_id=0, eos_token_id=0, pad_token_id=0),
    "bert": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=101,
                 max_position_embeddings=64),
}
CASES = [
    ("gpt2", "affine_scaled"), ("gpt2", "attention_sink"), ("gpt2", "preconditioned"), ("gpt2", "spectral"),
    ("llama", "affine_scaled"), ("llama", "attention_sink"), ("llama", "spectral"),
    ("bert", "affine_scaled"), ("bert", "preconditioned"),
]
CONCRETE = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertForMaskedLM"}

# Runs in a fresh interpreter: hf_condinit cannot be imported; prints one JSON line per checkpoint.
PLAIN_LOADER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "hf_condinit":
                raise ImportError("hf_condinit is blocked in this test")
    sys.meta_path.insert(0, Blocker())
    import torch, transformers
    from transformers.utils import logging
    logging.set_verbosity_error()

    def attempt(fn):
        try:
            model = fn()
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        return {"loaded": type(model).__name__}

    jobs, results = json.loads(sys.argv[1]), {}
    for job in jobs:  # refusals first: a trust_remote_code load registers the variants for the whole process
        path, auto, concrete = job["path"], getattr(transformers, job["auto"]), job["concrete"]
        out = results[path] = {"path": path}
        out["auto"] = attempt(lambda: auto.from_pretrained(path))
        if concrete:
            out["concrete"] = attempt(lambda: getattr(transformers, concrete).from_pretrained(path))
    for job in jobs:
        path, out = job["path"], results[job["path"]]
        ref = torch.load(path + "/ref.pt")
        model = getattr(transformers, job["auto"]).from_pretrained(path, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = model(**ref["inputs"]).logits
        out["class"] = type(model).__name__
        out["maxdiff"] = (logits - ref["logits"]).abs().max().item()
        out["passes_requests"] = any(getattr(h, "__name__", "") == "pass_attention_request"
                                     for h in model._forward_pre_hooks.values())
        out["refuses_compile"] = any(getattr(h, "__name__", "") == "_refuse_compile_hook"
                                     for h in model._forward_pre_hooks.values())
        if job.get("resave"):  # saved again by plain transformers: still portable, still the same model
            again = job["resave"]
            model.save_pretrained(again)
            out["resaved_sdpa"] = attempt(lambda: getattr(transformers, job["auto"]).from_pretrained(
                again, trust_remote_code=True, attn_implementation="sdpa"))
            reloaded = getattr(transformers, job["auto"]).from_pretrained(again, trust_remote_code=True).eval()
            with torch.no_grad():
                out["resaved_maxdiff"] = (reloaded(**ref["inputs"]).logits - ref["logits"]).abs().max().item()
        print()  # HF's "[y/N]" prompt ends without a newline
        print(json.dumps(out), flush=True)
    """
)


def _plain_load(jobs: list[dict]) -> dict[str, dict]:
    assert "hf_condinit" not in os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", PLAIN_LOADER, json.dumps(jobs)], stdin=subprocess.DEVNULL,  # HF prompts on stdin
        capture_output=True, text=True, env=env, cwd="/", timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line[line.index('{"path"'):]) for line in proc.stdout.splitlines() if '{"path"' in line]
    return {r["path"]: r for r in results}


def _build(family: str, kind: str):
    config = AutoConfig.for_model(family, **CONFIGS[family])
    cls = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    if kind == "spectral":
        model = cls.from_config(config, condinit={"method": "default", "spectral_lambda": 10.0})
    else:
        model = cls.from_config(config, condinit=True, attn_implementation=kind)
    randomise_holders(model, seed=3)
    return model.eval(), cls


def _inputs(family: str) -> dict:
    ids = torch.randint(1, 101, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0 if family == "llama" else 1  # left padding (Llama)
    mask[1, -4:] = 0 if family == "bert" else 1  # right padding (BERT)
    return {"input_ids": ids, "attention_mask": mask}


def _save_with_reference(model, path, inputs):
    model.save_pretrained(path)
    with torch.no_grad():
        torch.save({"inputs": inputs, "logits": model(**inputs).logits}, os.path.join(path, "ref.pt"))


def test_every_variant_loads_exactly_or_refuses_without_the_plugin(tmp_path):
    jobs, models = [], {}
    for family, kind in CASES:
        model, cls = _build(family, kind)
        path = str(tmp_path / f"{family}-{kind}")
        _save_with_reference(model, path, _inputs(family))
        config = json.loads(open(os.path.join(path, "config.json")).read())
        assert config["model_type"] == "condinit_" + family and os.path.exists(os.path.join(path, PORTABLE_FILE))
        # with the plugin imported, loading (with or without trust_remote_code) goes through the plugin, bit-exact
        for trust in (False, True):
            again = cls.from_pretrained(path, trust_remote_code=trust).eval()
            assert type(again) is type(model) and again.config.model_type == family
            ref = torch.load(os.path.join(path, "ref.pt"))
            with torch.no_grad():
                assert torch.equal(again(**ref["inputs"]).logits, ref["logits"])
        jobs.append({"path": path, "auto": cls.__name__, "concrete": CONCRETE[family]})
        if (family, kind) == ("gpt2", "affine_scaled"):
            jobs[-1]["resave"] = str(tmp_path / "resaved")
        models[path] = kind, model
    results = _plain_load(jobs)
    for path, (kind, _) in models.items():
        r = results[path]
        assert r["class"].startswith("CondInit"), r
        assert r["maxdiff"] <= 1e-5, r
        assert r["passes_requests"] == (kind != "spectral"), r  # attention weights requested under compile
        # torch.compile refused where the plugin refuses it (torch < 2.7, e.g. the floors; affine_scaled / spectral
        # on 2.11): a portable checkpoint never compiles to wrong gradients either
        assert r["refuses_compile"] == (compile_refusal(models[path][1].config) is not None), r
        assert "trust_remote_code=True" in r["auto"].get("error", ""), r
        if kind != "spectral":  # a concrete class refuses the unregistered attention implementation
            assert f'attn_implementation="{kind}"' in r["concrete"].get("error", ""), r
        if "resaved_maxdiff" in r:
            assert r["resaved_maxdiff"] <= 1e-5, r
            resaved = json.loads((tmp_path / "resaved" / "config.json").read_text())  # a concrete class still refuses
            assert resaved["attn_implementation"] == "affine_scaled" and resaved["model_type"] == "condinit_gpt2"
            assert (tmp_path / "resaved" / PORTABLE_FILE).exists()
            assert "trained with attention variant 'affine_scaled'" in r["resaved_sdpa"].get("error", ""), r
        print(f"{os.path.basename(path)}: plain load with trust_remote_code, max |Δlogits| = {r['maxdiff']:.2e}")


def test_plain_checkpoints_stay_plain(tmp_path):
    config = AutoConfig.for_model("gpt2", **CONFIGS["gpt2"])
    conditioned = AutoModelForCausalLM.from_config(config, condinit=True)
    merged = hf_condinit.merge_spectral(
        AutoModelForCausalLM.from_config(config, condinit={"method": "default", "spectral_lambda": 10.0})
    )
    for name, model in (("conditioned", conditioned), ("merged", merged)):
        path = tmp_path / name
        model.save_pretrained(path)
        config_json = json.loads((path / "config.json").read_text())
        assert config_json["model_type"] == "gpt2" and "auto_map" not in config_json, name
        assert not (path / PORTABLE_FILE).exists(), name
        assert "A plain transformers checkpoint" in loading_instructions(model)
        assert "AutoModelForCausalLM.from_pretrained(path)" in loading_instructions(model)


def test_a_family_transformers_does_not_ship_saves_as_before(tmp_path):
    """Crammed BERT (registered by hf_condinit): no portable file (plain transformers refuses its model type)."""
    from utils import mini_config

    model = AutoModelForMaskedLM.from_config(mini_config("crammed_bert"), attn_implementation="affine_scaled")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "crammed_bert"
    assert not (tmp_path / PORTABLE_FILE).exists()
    assert "registered by hf_condinit" in loading_instructions(model)
    assert AutoModelForMaskedLM.from_pretrained(tmp_path).config.condinit_attention == "affine_scaled"


def test_push_to_hub_from_save_pretrained_is_refused_before_anything_is_written(tmp_path):
    model, _ = _build("gpt2", "preconditioned")
    with pytest.raises(ValueError, match=r"call model.push_to_hub\(repo_id\) instead"):
        model.save_pretrained(tmp_path / "out", push_to_hub=True)
    assert not (tmp_path / "out").exists()


def test_bundle_imports_only_torch_and_transformers(tmp_path):
    """What HF's dynamic-module loader checks before running the file: no relative import, only installed packages."""
    from transformers.dynamic_module_utils import get_imports, get_relative_imports

    source = bundle_source("gpt2")
    path = tmp_path / PORTABLE_FILE
    path.write_text(source)
    assert get_relative_imports(path) == []
    allowed = {"__future__", "dataclasses", "math", "typing", "torch", "transformers"}  # the standard library, torch, HF
    assert {name.split(".")[0] for name in get_imports(path)} <= allowed
    assert "hf_condinit" not in {name.split(".")[0] for name in get_imports(path)}
    compile(source, PORTABLE_FILE, "exec")


@pytest.mark.slow
@needs(TINYSTORIES)
def test_run_clm_outputs_load_without_the_plugin(ts_file, tmp_path):
    run_clm = load_script("run_clm.py")
    jobs, kinds = [], {}
    runs = {
        "affine_scaled": ["--attention", "affine_scaled"],
        "attention_sink": ["--attention", "attention_sink"],
        "preconditioned": ["--attention", "preconditioned"],
        "spectral": ["--spectral_lambda", "10"],
    }
    for kind, flags in runs.items():
        out = tmp_path / kind
        run_clm.main([
            "--output_dir", str(out), "--use_cpu", "--disable_tqdm", "true", "--report_to", "none",
            "--cache_dir", str(tmp_path / "cache"), "--seed", "7", "--model_config", "gpt2-tiny",
            "--train_file", ts_file, "--block_size", "32", "--tokenizer_vocab_size", "512", "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--do_train", "--save_strategy", "no",
            "--learning_rate", "1e-2", *flags,
        ])  # fmt: skip
        card = (out / "README.md").read_text()  # the model card says which kind of checkpoint and how to load it
        assert "## How to load" in card and "from_pretrained(path, trust_remote_code=True)" in card
        assert ("unmerged spectral" if kind == "spectral" else f"attention variant `{kind}`") in card
        trained = AutoModelForCausalLM.from_pretrained(out).eval()  # the plugin's (bit-exact) load
        if kind == "affine_scaled":
            assert trained.transformer.h[0].attn.condinit_affine.alpha_ma.abs().sum() > 0  # trained α_ma
        inputs = {"input_ids": torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))}
        with torch.no_grad():
            torch.save({"inputs": inputs, "logits": trained(**inputs).logits}, out / "ref.pt")
        jobs.append({"path": str(out), "auto": "AutoModelForCausalLM", "concrete": None})
        kinds[str(out)] = kind
    results = _plain_load(jobs)
    for path, kind in kinds.items():
        r = results[path]
        assert r["maxdiff"] <= 1e-5 and "trust_remote_code=True" in r["auto"]["error"], r
        print(f"run_clm {kind}: plain load with trust_remote_code, max |Δlogits| = {r['maxdiff']:.2e}")
