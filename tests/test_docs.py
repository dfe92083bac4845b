"""The docs a newcomer reads stay usable: every result file is quoted and every quoted file
exists, commands name no machine-specific folders, headings carry no internal labels, and the
README's links resolve inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "docs" / "results.md"
RESULTS_DIR = ROOT / "docs" / "results"

# A markdown link into docs/results/ from docs/results.md: [text](results/FILE)
LINK = re.compile(r"\]\(results/([^)#\s]+)\)")


def _links() -> set[str]:
    return set(LINK.findall(RESULTS_MD.read_text(encoding="utf-8")))


def test_every_result_file_is_linked_from_results_md():
    files = {p.name for p in RESULTS_DIR.iterdir() if p.is_file()}
    unlinked = sorted(files - _links())
    assert not unlinked, f"docs/results/ files no link in docs/results.md points at (link them or git rm them): {unlinked}"


def test_every_results_link_points_at_a_file():
    missing = sorted(name for name in _links() if not (RESULTS_DIR / name).is_file())
    assert not missing, f"docs/results.md links to files that are not in docs/results/: {missing}"


def test_results_md_names_no_machine_specific_folders():
    text = RESULTS_MD.read_text(encoding="utf-8")
    found = sorted(set(re.findall(r"(?<![\w.])/(?:tmp|work|home|root|Users)/[^\s`)]*", text)))
    assert not found, f"absolute paths in docs/results.md (use relative run folders): {found}"


def test_headings_carry_no_internal_labels():
    bad = [line for line in RESULTS_MD.read_text(encoding="utf-8").splitlines()
           if line.startswith("#") and re.search(r"\bsession\b|\bissue\s*#?\d+|#\d+\b", line, re.IGNORECASE)]
    assert not bad, f"internal labels in docs/results.md headings: {bad}"


def test_readme_links_resolve_inside_the_repository():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)", text) + re.findall(r"`((?:docs|\.\./)[^`\s]*\.md)`", text)
    for target in targets:
        if re.match(r"[a-z]+://", target):
            continue
        path = (ROOT / target).resolve()
        assert ROOT in path.parents or path == ROOT, f"README links outside the repository: {target}"
        assert path.exists(), f"README links to a missing file: {target}"
