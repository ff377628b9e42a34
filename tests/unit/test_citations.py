"""Every document the repository cites is in the repository, and every cited section of docs/methods.md exists."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = ROOT / "docs" / "methods.md"
SKIP_SUFFIXES = {".png", ".parquet", ".bin", ".npy", ".deb", ".gz", ".zip", ".xz", ".tar", ".ftz", ".db"}


def _tracked_text() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in names:
        path = ROOT / name
        if path.suffix in SKIP_SUFFIXES or name.startswith("tests/fixtures/") or not path.is_file():
            continue
        try:
            out[name] = path.read_text()
        except UnicodeDecodeError:
            continue
    return out


def test_no_citation_of_a_document_outside_the_repository():
    outside = re.compile(r"\bSPEC(\.md| §|, units| units)|\bDESIGN\.md\b|\bSTYLE(\.md| §)")
    hits = [f"{name}:{n}: {line.strip()[:100]}" for name, text in _tracked_text().items()
            if name != "tests/unit/test_citations.py"
            for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not hits, "citations of documents that are not in the repository:\n" + "\n".join(hits)


def test_every_cited_markdown_file_exists():
    cited = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.md|README\.md)\b")
    missing = []
    for name, text in _tracked_text().items():
        for match in cited.finditer(text):
            ref = match.group(1)
            if not (ROOT / ref).is_file():
                missing.append(f"{name}: {ref}")
    assert not missing, "cited documents missing from the repository:\n" + "\n".join(sorted(set(missing)))


def test_every_cited_methods_section_exists():
    sections = set(re.findall(r"^## §(\d+) ", METHODS.read_text(), flags=re.M))
    assert sections == {str(n) for n in range(1, 17)}
    bad = []
    for name, text in _tracked_text().items():
        for match in re.finditer(r"docs/methods\.md §(\d+)(?:[–/-]§?(\d+))?", text):
            for number in filter(None, match.groups()):
                if number not in sections:
                    bad.append(f"{name}: §{number}")
    assert not bad, "citations of sections docs/methods.md does not have:\n" + "\n".join(bad)
