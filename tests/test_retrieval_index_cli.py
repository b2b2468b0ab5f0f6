"""`index --out`: a failed or interrupted run leaves nothing behind and an old index untouched;
bad paths are messages before any work; `serve-retriever --host` names a bad host (issue 82)."""
import builtins
import contextlib
import json
import os

import pytest

import retrieval.cli
import retrieval.corpus
from retrieval.cli import main
from retrieval.loading import load_retriever
from tests.assets import minilm_encoder_dir
from tests.file_trees import snapshot as _tree


def _run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _lines(ids, word="things"):
    return "".join(json.dumps({"id": str(i), "contents": f"Title {i}\npassage key{i} about {word}"}) + "\n"
                   for i in ids)


def _corpus(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _type_args(kind: str) -> list[str]:
    return ["--index-type", "bm25"] if kind == "bm25" else ["--encoder", minilm_encoder_dir(), "--no-progress"]


def _ids_found(index_dir: str, query: str) -> list[str]:
    return [h.id for h in load_retriever(index_dir).search([query], 3)[0]]


# A different corpus whose third line is bad: the run stops after reading two passages (the
# state that used to leave docs.jsonl rewritten under the old manifest).
BAD_THIRD_LINE = _lines(["n1", "n2"], "zebras") + '{"id": "bad", "title": "no contents"}\n' + _lines(["n3"], "zebras")


@pytest.mark.parametrize("kind", ["bm25", pytest.param("flat", marks=pytest.mark.slow)])
def test_overwrite_stopped_by_a_bad_line_leaves_the_old_index_whole(kind, tmp_path, capsys):
    good = _corpus(tmp_path, "good.jsonl", _lines(range(8)))
    out = tmp_path / "idx"
    code, msg = _run(capsys, "index", "--corpus", good, "--out", str(out), *_type_args(kind))
    assert code == 0, msg
    (out / "NOTES.md").write_text("the user's note")  # "touching nothing else"
    before = _tree(out)
    bad = _corpus(tmp_path, "bad.jsonl", BAD_THIRD_LINE)
    code, msg = _run(capsys, "index", "--corpus", bad, "--out", str(out), *_type_args(kind), "--overwrite")
    assert code == 2 and "corpus line 3" in msg, msg
    assert _tree(out) == before  # byte for byte: the old index, untouched
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "idx"]  # no staging left
    assert _ids_found(str(out), "key3")[0] == "3"  # it loads and searches
    # the retry the message advises replaces it, and keeps the user's note
    code, msg = _run(capsys, "index", "--corpus", bad, "--out", str(out), *_type_args(kind), "--overwrite",
                     "--skip-bad-lines")
    assert code == 0 and "indexed 3 passages" in msg, msg
    assert load_retriever(str(out)).search(["zebras"], 5)[0][0].id in ("n1", "n2", "n3")
    assert (out / "NOTES.md").read_text() == "the user's note"
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "idx"]


def test_overwrite_from_dense_to_bm25_leaves_no_stale_faiss_file(tmp_path, capsys, monkeypatch):
    """An index's files are replaced as a set: an old index.faiss is not kept beside a new bm25/."""
    out = tmp_path / "idx"
    out.mkdir()
    for name, body in (("manifest.json", "{}"), ("index.faiss", "old vectors")):
        (out / name).write_text(body)
    (out / "docs").mkdir()
    (out / "docs" / "docs.jsonl").write_text("old")
    good = _corpus(tmp_path, "good.jsonl", _lines(range(4)))
    code, msg = _run(capsys, "index", "--corpus", good, "--out", str(out), "--index-type", "bm25", "--overwrite")
    assert code == 0, msg
    assert sorted(os.listdir(out)) == ["bm25", "docs", "manifest.json"]
    assert _ids_found(str(out), "key2")[0] == "2"


def test_overwrite_through_a_link_replaces_the_index_it_points_to(tmp_path, capsys):
    """--out a symlink to an index: the index is staged beside its target, the link stays a link."""
    good = _corpus(tmp_path, "good.jsonl", _lines(range(4)))
    real = tmp_path / "store" / "idx"
    assert main(["index", "--corpus", good, "--out", str(real), "--index-type", "bm25"]) == 0
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    other = _corpus(tmp_path, "other.jsonl", _lines(["z1", "z2"], "zebras"))
    code, msg = _run(capsys, "index", "--corpus", other, "--out", str(link), "--index-type", "bm25", "--overwrite")
    assert code == 0 and "indexed 2 passages" in msg, msg
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _ids_found(str(real), "keyz2")[0] == "z2"
    assert sorted(os.listdir(tmp_path / "store")) == ["idx"]  # no staging left beside the target


def _interrupting(after: int, error: BaseException):
    real = retrieval.corpus.read_corpus

    def read(*args, **kwargs):
        for n, passage in enumerate(real(*args, **kwargs)):
            if n == after:
                raise error
            yield passage
    return read


@pytest.mark.parametrize("error, code", [
    (KeyboardInterrupt(), None),                                    # Ctrl-C mid-build
    (OSError(28, "No space left on device"), 2),                    # a write or read that fails mid-build
])
def test_a_build_that_fails_midway_leaves_nothing_and_the_old_index(error, code, tmp_path, capsys, monkeypatch):
    good = _corpus(tmp_path, "good.jsonl", _lines(range(6)))
    out = tmp_path / "idx"
    assert main(["index", "--corpus", good, "--out", str(out), "--index-type", "bm25"]) == 0
    before = _tree(out)
    monkeypatch.setattr(retrieval.corpus, "read_corpus", _interrupting(3, error))
    argv = ["index", "--corpus", good, "--out", str(out), "--index-type", "bm25", "--overwrite"]
    if code is None:
        with pytest.raises(KeyboardInterrupt):
            main(argv)
    else:
        assert main(argv) == code
        err = capsys.readouterr().err
        assert "No space left on device" in err and str(out) in err and "untouched" in err, err
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["good.jsonl", "idx"]
    fresh = tmp_path / "a" / "b" / "new"  # a new --out: neither it nor the parents made for it stay
    with pytest.raises(KeyboardInterrupt) if code is None else contextlib.nullcontext():
        main(["index", "--corpus", good, "--out", str(fresh), "--index-type", "bm25"])
    assert sorted(os.listdir(tmp_path)) == ["good.jsonl", "idx"]


def test_a_swap_that_fails_puts_the_old_index_back(tmp_path, capsys, monkeypatch):
    """The moment of the swap: a rename that fails half-way moves the old entries back."""
    good = _corpus(tmp_path, "good.jsonl", _lines(range(6)))
    out = tmp_path / "idx"
    assert main(["index", "--corpus", good, "--out", str(out), "--index-type", "bm25"]) == 0
    before = _tree(out)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if os.fspath(dst) == str(out / "manifest.json") and len([c for c in calls if c[1] == dst]) == 1:
            raise OSError(5, "Input/output error")  # the new index's manifest, the first time only
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    other = _corpus(tmp_path, "other.jsonl", _lines(range(3), "zebras"))
    code, msg = _run(capsys, "index", "--corpus", other, "--out", str(out), "--index-type", "bm25", "--overwrite")
    assert code == 2 and "Input/output error" in msg, (calls, msg)
    monkeypatch.setattr(os, "replace", real)
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["good.jsonl", "idx", "other.jsonl"]


@pytest.mark.parametrize("bad_line, flag", [
    ('{"id": "x", "title": "no contents"}\n', "--skip-bad-lines"),
    (_lines([1]), "--dedupe"),
])
def test_a_failed_index_leaves_nothing_and_the_advised_retry_runs(bad_line, flag, tmp_path, capsys):
    corpus = _corpus(tmp_path, "c.jsonl", _lines(range(3)) + bad_line + _lines([7]))
    out = tmp_path / "idx"
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(out), "--index-type", "bm25")
    assert code == 2 and flag in msg, msg
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["c.jsonl"]
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(out), "--index-type", "bm25", flag)
    assert code == 0 and "indexed 4 passages" in msg, msg
    # into an empty directory of the user's: it stays, empty, after a failure
    empty = tmp_path / "empty"
    empty.mkdir()
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(empty), "--index-type", "bm25")
    assert code == 2 and os.listdir(empty) == []
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", "empty", "idx"]
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(empty), "--index-type", "bm25", flag)
    assert code == 0 and "indexed 4 passages" in msg, msg


# ----------------------------------------------------------------------------- paths: messages before any work

def _no_reading(monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("the corpus was read before the paths were checked")
    monkeypatch.setattr(retrieval.corpus, "read_corpus", read)


def test_a_directory_as_corpus_is_named(tmp_path, capsys, monkeypatch):
    _no_reading(monkeypatch)
    code, msg = _run(capsys, "index", "--corpus", str(tmp_path), "--out", str(tmp_path / "idx"),
                     "--index-type", "bm25")
    assert code == 2 and "is a directory" in msg and "jsonl file" in msg and "not found" not in msg, msg
    code, msg = _run(capsys, "index", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "idx"),
                     "--index-type", "bm25")
    assert code == 2 and "not found" in msg, msg
    assert os.listdir(tmp_path) == []


def _refuse_open_of(monkeypatch, path: str):
    real = builtins.open

    def guarded(file, *args, **kwargs):
        if os.fspath(file) == path:
            raise PermissionError(13, "Permission denied", path)
        return real(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", guarded)


@pytest.mark.parametrize("how", [
    pytest.param("chmod", marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod-000 file")),
    "refused open",  # the same refusal as the kernel gives a non-root user, for a root test run
])
def test_an_unreadable_corpus_is_a_message_before_any_work(how, tmp_path, capsys, monkeypatch):
    corpus = _corpus(tmp_path, "c.jsonl", _lines(range(3)))
    if how == "chmod":
        os.chmod(corpus, 0)
    else:
        _refuse_open_of(monkeypatch, corpus)
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(tmp_path / "idx"), "--index-type", "bm25")
    assert code == 2 and "cannot read" in msg and corpus in msg and "Permission denied" in msg, msg
    assert "Traceback" not in msg and sorted(os.listdir(tmp_path)) == ["c.jsonl"]


def _refuse_mkdir_under(monkeypatch, parent: str):
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        if os.path.dirname(os.path.abspath(os.fspath(path))) == parent:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", mkdir)


def test_an_existing_out_that_is_not_writable_is_a_message_before_any_work(tmp_path, capsys, monkeypatch):
    """An empty --out the user cannot write (os.access answers as the kernel would for them)."""
    corpus = _corpus(tmp_path, "c.jsonl", _lines(range(3)))
    out = tmp_path / "theirs"
    out.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if os.fspath(path) == str(out)
                        else real(path, mode, **kw))
    _no_reading(monkeypatch)
    code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(out), "--index-type", "bm25")
    assert code == 2 and f"{out} is not writable" in msg, msg
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", "theirs"] and os.listdir(out) == []


@pytest.mark.parametrize("how", [
    pytest.param("chmod", marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes a chmod-555 directory")),
    "refused mkdir",  # what the kernel answers a non-root user, for a root test run
])
def test_out_under_a_read_only_directory_is_a_message_before_any_work(how, tmp_path, capsys, monkeypatch):
    corpus = _corpus(tmp_path, "c.jsonl", _lines(range(3)))
    locked = tmp_path / "locked"
    locked.mkdir()
    if how == "chmod":
        os.chmod(locked, 0o555)
    else:
        _refuse_mkdir_under(monkeypatch, str(locked))
    _no_reading(monkeypatch)
    try:
        code, msg = _run(capsys, "index", "--corpus", corpus, "--out", str(locked / "idx"), "--index-type", "bm25")
    finally:
        os.chmod(locked, 0o755)
    assert code == 2 and str(locked) in msg and "Permission denied" in msg and "writable" in msg, msg
    assert "Traceback" not in msg and os.listdir(locked) == []


# ----------------------------------------------------------------------------- serve-retriever --host

@pytest.fixture()
def bm25_index(tmp_path):
    out = str(tmp_path / "idx")
    assert main(["index", "--corpus", _corpus(tmp_path, "c.jsonl", _lines(range(3))), "--out", out,
                 "--index-type", "bm25"]) == 0
    return out


def test_serve_names_a_host_that_is_no_address(bm25_index, capsys, monkeypatch):
    import retrieval.server

    monkeypatch.setattr(retrieval.server, "serve", lambda *a, **k: pytest.fail("served on a bad host"))
    code, msg = _run(capsys, "serve-retriever", "--index", bm25_index, "--host", "999.1.1.1", "--port", "8123")
    assert code == 2 and "--host '999.1.1.1'" in msg and "not a valid" in msg and "--port" not in msg, msg
    # a well-formed address this machine does not have (TEST-NET-1, RFC 5737)
    code, msg = _run(capsys, "serve-retriever", "--index", bm25_index, "--host", "192.0.2.1", "--port", "8123")
    assert code == 2 and "--host '192.0.2.1'" in msg and "not an address of this machine" in msg, msg
    assert "--port" not in msg
