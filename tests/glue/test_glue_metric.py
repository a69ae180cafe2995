"""The shipped GLUE `evaluate` module vs sklearn / scipy, loaded offline by path; GLUE scores and table."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import evaluate
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from hf_condinit.glue import GLUE_METRIC_PATH, format_glue_table, glue_average, glue_metric_config_name, glue_task_score
from hf_condinit.glue import load_glue_metric

RNG = np.random.default_rng(0)
N = 200


def _labels(n_classes=2):
    refs = RNG.integers(0, n_classes, N)
    preds = np.where(RNG.random(N) < 0.7, refs, RNG.integers(0, n_classes, N))
    return preds, refs


def test_metric_module_is_shipped_as_a_file():
    assert os.path.isfile(GLUE_METRIC_PATH) and GLUE_METRIC_PATH.endswith(".py")


def test_cola_matthews():
    preds, refs = _labels()
    out = load_glue_metric("cola").compute(predictions=preds, references=refs)
    assert set(out) == {"matthews_correlation"}
    assert out["matthews_correlation"] == pytest.approx(matthews_corrcoef(refs, preds), abs=1e-12)


def test_stsb_pearson_spearman():
    refs = RNG.uniform(0, 5, N)
    preds = refs + RNG.normal(0, 1.0, N)
    out = load_glue_metric("stsb").compute(predictions=preds, references=refs)
    assert set(out) == {"pearson", "spearmanr"}
    # the module stores float32, so compare with the float32 values
    p32, r32 = preds.astype(np.float32), refs.astype(np.float32)
    assert out["pearson"] == pytest.approx(pearsonr(p32, r32)[0], abs=1e-6)
    assert out["spearmanr"] == pytest.approx(spearmanr(p32, r32)[0], abs=1e-6)
    assert 0.5 < out["pearson"] < 1.0


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_f1_and_accuracy(task):
    preds, refs = _labels()
    out = load_glue_metric(task).compute(predictions=preds, references=refs)
    assert set(out) == {"accuracy", "f1"}
    assert out["accuracy"] == pytest.approx(float((preds == refs).mean()))
    assert out["f1"] == pytest.approx(f1_score(refs, preds))


@pytest.mark.parametrize("task", ["sst2", "qnli", "rte", "wnli", "mnli", "mnli_matched", "mnli_mismatched"])
def test_accuracy_tasks(task):
    preds, refs = _labels(3 if task.startswith("mnli") else 2)
    out = load_glue_metric(task).compute(predictions=preds, references=refs)
    assert out == {"accuracy": pytest.approx(float((preds == refs).mean()))}


def test_load_by_path_with_evaluate_and_aliases():
    metric = evaluate.load(GLUE_METRIC_PATH, "rte")
    assert metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0]) == {"accuracy": 0.75}
    assert glue_metric_config_name("SST-2") == "sst2"
    assert glue_metric_config_name("STS-B") == "stsb"
    assert glue_metric_config_name("mnli-mm") == "mnli_mismatched"
    with pytest.raises(ValueError, match="Unknown GLUE task 'squad'"):
        load_glue_metric("squad")
    with pytest.raises(KeyError, match="Unknown GLUE metric configuration"):
        evaluate.load(GLUE_METRIC_PATH, "squad")


def test_task_scores_and_table():
    per_task = {
        "mnli": {"eval_accuracy": 0.80, "eval_accuracy_mm": 0.82},
        "qqp": {"eval_f1": 0.80, "eval_accuracy": 0.90},
        "qnli": {"eval_accuracy": 0.90},
        "sst2": {"eval_accuracy": 0.92},
        "cola": {"eval_matthews_correlation": 0.40},
        "stsb": {"eval_pearson": 0.86, "eval_spearmanr": 0.84},
        "mrpc": {"eval_f1": 0.90, "eval_accuracy": 0.86},
        "rte": {"eval_accuracy": 0.60},
    }
    assert glue_task_score("mnli", per_task["mnli"]) == pytest.approx(81.0)
    assert glue_task_score("qqp", per_task["qqp"]) == pytest.approx(85.0)
    assert glue_task_score("stsb", per_task["stsb"]) == pytest.approx(85.0)
    assert glue_task_score("cola", per_task["cola"]) == pytest.approx(40.0)
    avg, n = glue_average(per_task)
    assert n == 8 and avg == pytest.approx((81 + 85 + 90 + 92 + 40 + 85 + 88 + 60) / 8)
    table = format_glue_table([("default", per_task), ("partial", {"rte": {"eval_accuracy": 0.5}})])
    lines = table.strip().splitlines()
    assert lines[0].startswith("| Run | MNLI (m/mm) | QQP (F1/acc) | QNLI | SST-2 | CoLA (MCC) | STS-B (P/S) |")
    assert "| default | 80.0/82.0 | 80.0/90.0 | 90.0 | 92.0 | 40.0 | 86.0/84.0 | 90.0/86.0 | 60.0 | 77.6 |" in table
    assert lines[-1].endswith("| 50.0 | 50.0 (1/8) |")
