"""benchmarks/rerun_record.py: a record re-run through the harness is reproduced bit for bit (exit 0), and a record
whose numbers differ from what its spec trains to is reported by field (exit 1). Reference: the harness's own record
of a tiny run, written to a file as compare.py writes it."""

import json

import pytest

from utils import load_script


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    load_script("benchmarks/compare.py", "hf_condinit_bench_compare")
    import _common as C
    import _lm_run as LM

    tmp = tmp_path_factory.mktemp("rerun_record")
    text = tmp / "stories.txt"
    text.write_text("\n<|endoftext|>\n".join(f"Story {i}: the {['cat', 'boat', 'ball'][i % 3]} was lost at {i % 7}, "
                                              f"then found by {['Tom', 'Lily'][i % 2]}." for i in range(400)))
    data = C.prepare_data([str(text)], vocab_size=300, block_size=32, cache_dir=str(tmp / "cache"))
    spec = LM.TrainSpec(arm="spectral", seed=2, n_layer=1, n_embd=32, n_head=2, block_size=32, batch_size=4, steps=6,
                        lr=3e-3, eval_every=3, eval_blocks=4, log_every=1, kappa_at=(), diag_probe=(2, 16))
    rec = LM.train_run(spec, data, LM.trainer_folder(str(tmp / "trainer"), spec))
    path = tmp / "seed2.json"
    path.write_text(json.dumps(rec))
    return path


def test_a_record_is_reproduced_and_a_changed_one_is_not(record, tmp_path, capsys):
    tool = load_script("benchmarks/rerun_record.py", "hf_condinit_bench_rerun_record")
    assert tool.main([str(record), "--work", str(tmp_path / "work")]) == 0
    assert "identical (batches" in capsys.readouterr().out
    changed = json.loads(record.read_text())
    changed["final_eval_loss"] += 1e-7
    changed["train_batches_sha256"] = "0" * 64
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    assert tool.main([str(tmp_path / "changed.json"), "--work", str(tmp_path / "work")]) == 1
    assert "differs in train_batches_sha256, final_eval_loss" in capsys.readouterr().out


def test_not_a_harness_record_is_one_line(tmp_path, capsys):
    tool = load_script("benchmarks/rerun_record.py", "hf_condinit_bench_rerun_record")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        tool.main([str(tmp_path / "x.json")])
    assert e.value.code == 2 and "not the record of an LM run of the harness" in capsys.readouterr().err
