"""The docs as a newcomer meets them: a short front page, links that lead somewhere, and lab notes
that are dated, open with their result and are all in the index."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 250

# [text](target) with a relative target; an anchor (#...) is dropped, web and mail links are not ours.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_NOTE_NAME = re.compile(r"^\d{4}-\d\d-\d\d-[a-z0-9.-]+\.md$")


def _markdown_files(root: str = ROOT):
    yield os.path.join(root, "README.md")
    for top in ("docs", os.path.join("memsearcher_jax", "bases")):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            yield from (os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".md"))


def broken_links(path: str) -> list[str]:
    """Relative link targets in the markdown file `path` that name no file or folder."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        local = target.split("#", 1)[0]
        if not os.path.exists(os.path.join(os.path.dirname(path), local)):
            out.append(target)
    return out


def test_the_link_checker_catches_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[a](there.md) [b](there.md#part) [c](gone.md) [d](https://example.org/x) [e](#top)")
    assert broken_links(str(page)) == ["gone.md"]


def test_every_relative_link_in_the_docs_leads_somewhere():
    pages = list(_markdown_files())
    assert len(pages) > 10  # the walk does find the docs
    broken = {os.path.relpath(p, ROOT): b for p in pages if (b := broken_links(p))}
    assert not broken, f"links to nothing: {broken}"


def test_the_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_lab_notes_are_dated_open_with_their_result_and_are_indexed():
    lab = os.path.join(ROOT, "docs", "lab")
    notes = sorted(n for n in os.listdir(lab) if n != "README.md")
    assert notes, "docs/lab holds the notes"
    with open(os.path.join(lab, "README.md"), encoding="utf-8") as f:
        index = f.read()
    for name in notes:
        assert _NOTE_NAME.match(name), f"{name}: a note is named YYYY-MM-DD-topic.md"
        with open(os.path.join(lab, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        assert lines[0].startswith(f"# {name[:10]}"), f"{name}: its title starts with its date"
        result = [line for line in lines[1:6] if line.startswith(">")]
        assert len(result) == 3 and result[0].startswith("> **Result.**"), f"{name}: opens with a three-line result"
        assert f"]({name})" in index, f"{name} is missing from docs/lab/README.md"
