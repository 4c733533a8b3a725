"""The documentation holds together: links resolve, named paths exist, the README stays short.

Checked in ``README.md`` and every ``docs/*.md``:

* every relative Markdown link ``[text](target)`` names an existing file, and its
  ``#anchor``, when there is one and the target is Markdown, names a heading there
  (GitHub's heading slugs);
* every path of the repository named in code (`` `trainopt/decide/` ``, a fenced block) and
  every dotted ``trainopt.x.y`` module exists, so a moved module cannot leave a stale name;
* the README stays a five-minute read, keeps the test command where CI reads it, and links
  every page of ``docs/``.

Each checker is also fed a planted mistake, so none of them can pass by seeing nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200
# Top-level folders of the repository: a path in code that starts with one of them must exist.
TOP_FOLDERS = ("trainopt", "tests", "benchmarks", "examples", "configs", "docs")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*)" % "|".join(TOP_FOLDERS))
MODULE = re.compile(r"(?<![\w./-])(trainopt(?:\.[A-Za-z_]\w*)+)")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_code(text: str) -> tuple[list[str], list[str]]:
    """The prose lines (outside fenced blocks) and the code: fenced blocks' lines and inline code spans."""
    prose, code = [], []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
        else:
            prose.append(line)
            code += [m.group(2) for m in INLINE_CODE.finditer(line)]
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    prose, _ = split_code(text)
    found = []
    for line in prose:
        line = INLINE_CODE.sub("", line)  # a link written inside backticks is code, not a link
        found += [m.group(1) for m in LINK.finditer(line)]
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``path`` that names no file, or a heading its file does not have."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if SCHEME.match(target):
            continue  # https:, mailto: ...
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path.resolve()
        if not resolved.exists():
            problems.append(f"{path.name}: link {target!r} names no file ({resolved})")
            continue
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{path.name}: link {target!r} leaves the repository")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{path.name}: link {target!r}: {resolved.name} has no heading #{anchor}")
    return problems


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """Repository paths and ``trainopt.x.y`` modules named in code that do not exist."""
    _, code = split_code(text)
    problems = []
    for chunk in code:
        for m in PATH.finditer(chunk):
            name = m.group(1).rstrip(".,:;")
            if not (any(root.glob(name.rstrip("/"))) if "*" in name else (root / name).exists()):
                problems.append(f"path {name!r} does not exist")
        for m in MODULE.finditer(chunk):
            if not module_exists(m.group(1), root):
                problems.append(f"module {m.group(1)!r} does not exist")
    return problems


def module_exists(dotted: str, root: Path = ROOT) -> bool:
    """A module or package, or a name defined in one (``trainopt.load_settings``)."""
    def source(parts: list[str]) -> Path | None:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    parts = dotted.split(".")
    if source(parts):
        return True
    parent = source(parts[:-1])
    return parent is not None and re.search(rf"\b{re.escape(parts[-1])}\b", parent.read_text(encoding="utf-8")) is not None


def too_long(text: str, limit: int = MAX_README_LINES) -> bool:
    return len(text.splitlines()) > limit


# ---- the documentation as it is ------------------------------------------------------------------


def test_the_docs_folder_exists():
    assert (DOCS / "index.md").is_file()
    assert len(doc_files()) > 2


def test_every_relative_link_resolves():
    problems = [p for path in doc_files() for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_every_named_path_and_module_exists():
    problems = [f"{path.relative_to(ROOT)}: {p}" for path in doc_files() for p in missing_paths(path.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_short_read():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert not too_long(README.read_text(encoding="utf-8")), f"README.md has {lines} lines, at most {MAX_README_LINES}"


def test_the_readme_and_the_index_link_every_docs_page():
    pages = {p.name for p in DOCS.glob("*.md")}
    for source, expected in ((README, pages), (DOCS / "index.md", pages - {"index.md"})):
        named = {Path(t.partition("#")[0]).name for t in links(source.read_text(encoding="utf-8"))}
        assert expected <= named, f"{source.relative_to(ROOT)} does not link {sorted(expected - named)}"


def test_the_test_command_stays_where_ci_reads_it():
    lines = README.read_text(encoding="utf-8").splitlines()
    at = lines.index("<!-- test-command -->")
    assert lines[at + 1] == "```bash"
    assert "pytest" in lines[at + 2]


# ---- the checkers can fail ----------------------------------------------------------------------


def test_the_link_checker_reports_planted_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# A heading: with `code`\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[fine](other.md) [fine too](other.md#a-heading-with-code) [web](https://example.com)\n"
        "[gone](missing.md) [no such heading](other.md#not-a-heading) `[in code](nowhere.md)`\n"
        "[self](#nothing-here)\n"
        "```\n[in a block](nowhere.md)\n```\n"
    )
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert "missing.md" in problems[0]
    assert "#not-a-heading" in problems[1]
    assert "#nothing-here" in problems[2]


def test_the_path_checker_reports_planted_missing_paths():
    text = (
        "`trainopt/decide/` and `trainopt/errors.py` and `python -m trainopt.contract.boundary` and\n"
        "`trainopt.load_settings` are there; `trainopt/nowhere.py`, `benchmarks/gone.py` and\n"
        "```\npython -m trainopt.decide.nowhere\n```\n"
        "are not; neither is `trainopt.errors.NoSuchError`. trainopt/in_prose.py is not code.\n"
    )
    assert missing_paths(text) == [
        "path 'trainopt/nowhere.py' does not exist",
        "path 'benchmarks/gone.py' does not exist",
        "module 'trainopt.decide.nowhere' does not exist",
        "module 'trainopt.errors.NoSuchError' does not exist",
    ]


def test_the_length_check_fails_on_a_long_readme():
    assert too_long("line\n" * (MAX_README_LINES + 1))
    assert not too_long("line\n" * MAX_README_LINES)


def test_slugs_follow_github():
    assert slug("Where the trials are kept: `--storage`") == "where-the-trials-are-kept---storage"
    assert slug("The margin's price at the measured interleaved noise (sd 0.09)") == (
        "the-margins-price-at-the-measured-interleaved-noise-sd-009"
    )


# ---- the pages name what the repository holds ----------------------------------------------------


def unnamed_modules(page_text: str, root: Path = ROOT) -> list[str]:
    """Modules of the package that a page names neither by path nor by file name in code."""
    _, code = split_code(page_text)
    named = "\n".join(code)

    def names(word: str) -> bool:
        return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", named) is not None

    missing = []
    for path in sorted((root / "trainopt").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name == "__init__.py":
            continue
        # A subpackage listed as a whole (`workloads/`, `export/`, `frameworks/`) names its modules.
        if len(path.relative_to(root / "trainopt").parts) >= 3 and names(path.parent.name + "/"):
            continue
        if not names(path.name) and rel not in named:
            missing.append(rel)
    return missing


def test_the_architecture_page_names_every_module():
    missing = unnamed_modules((DOCS / "architecture.md").read_text(encoding="utf-8"))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_development_page_lists_every_benchmark():
    text = (DOCS / "development.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"`benchmarks/{p.name}`" not in text]
    assert not missing, f"docs/development.md's benchmark table does not list {missing}"


def test_the_module_check_reports_a_planted_unnamed_module(tmp_path):
    (tmp_path / "trainopt" / "decide").mkdir(parents=True)
    (tmp_path / "trainopt" / "decide" / "named.py").write_text("")
    (tmp_path / "trainopt" / "decide" / "forgotten.py").write_text("")
    assert unnamed_modules("the rule (`named.py`)", root=tmp_path) == ["trainopt/decide/forgotten.py"]
