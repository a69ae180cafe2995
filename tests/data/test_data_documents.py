"""``hf_condinit.data.documents``: several files / directories read in a fixed order as whole documents."""

import pytest

from hf_condinit.data.documents import documents_dataset, expand_text_paths, read_documents, split_documents

from utils import SHARED_DATA, require

WIKI = """ = Alpha =

 Alpha is first .
 = = History = =

 It has a section .

 = Beta =

 Beta is second .

 = Gamma =

 Gamma . 
 = Delta =
 Delta .
"""


def test_split_documents_rules():
    assert split_documents("a b\n<|endoftext|>\nc\n<|endoftext|>\n\n") == ["a b", "c"]
    docs = split_documents(WIKI)
    assert [d.splitlines()[0].strip() for d in docs] == ["= Alpha =", "= Beta =", "= Gamma =", "= Delta ="]
    assert "= = History = =" in docs[0]  # a section heading does not start a document
    assert split_documents("one\n\ntwo\nthree\n") == ["one", "two", "three"]  # < 4 articles: lines


def test_files_and_directories_in_order(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("b1\n<|endoftext|>\nb2\n<|endoftext|>\n")
    (d / "a.raw").write_text("a1\n<|endoftext|>\n")
    (d / "sub" / "c.txt").write_text("c1\n<|endoftext|>\n")
    (d / "notes.md").write_text("not text data")
    single = tmp_path / "z.txt"
    single.write_text("z1\n<|endoftext|>\n")
    assert expand_text_paths([str(single), str(d)]) == [str(single), str(d / "a.raw"), str(d / "b.txt"),
                                                        str(d / "sub" / "c.txt")]
    assert read_documents([str(single), str(d)]) == ["z1", "a1", "b1", "b2", "c1"]
    # a file's last document never merges with the next file's first (no separator at the end of a.raw's text)
    (d / "a.raw").write_text("a1\n<|endoftext|>\na2")
    assert read_documents([str(d)])[:3] == ["a1", "a2", "b1"]
    # max_bytes reads the first bytes of the concatenation
    assert read_documents([str(single), str(d)], max_bytes=len("z1\n<|endoftext|>\n") + 2) == ["z1", "a1"]


def test_bad_paths_name_the_flag(tmp_path):
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    (tmp_path / "data.json").write_text('{"text": "x"}')
    for paths, needle in (([str(tmp_path / "missing.txt")], "does not exist"),
                          ([str(empty_dir)], "no text files"),
                          ([str(tmp_path / "data.json")], "plain text")):
        with pytest.raises(ValueError, match=needle) as err:
            expand_text_paths(paths, "eval-file")
        assert "--eval-file" in str(err.value)


def test_documents_dataset_split():
    ds = documents_dataset([f"doc{i}" for i in range(40)], 0.05)
    assert ds["validation"]["text"] == ["doc0", "doc1"] and ds["train"]["text"][0] == "doc2"
    assert len(ds["train"]) == 38
    with pytest.raises(ValueError, match="too few documents"):
        documents_dataset(["only"], 0.05)


def test_wikitext_parts_give_the_documents_of_the_whole_file():
    """The three WikiText-2 train parts were cut at article boundaries: split part by part, they give exactly the
    documents of their concatenation (the official wiki.train.raw)."""
    parts = [str(require(SHARED_DATA / "wikitext" / "wikitext-2-raw" / f"wiki.train.part{i}of3.raw")) for i in (1, 2, 3)]
    whole = "".join(open(p, encoding="utf-8").read() for p in parts)
    docs = read_documents(parts)
    assert docs == split_documents(whole)
    assert len(docs) == 215 + 243 + 171  # SOURCES.md: documents per part
