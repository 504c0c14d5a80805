"""The repository's Markdown links resolve inside the repository: a newcomer following one never lands on a file
that is not there, or outside the checkout (the design once lived in ../shared, beside the repo, not in it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the lent GPU machine's staging scripts live beside the checkout, not in it: only its recipes may name them
DEVICE_RECIPES = ("bench/device/", "train/device/")
OUTSIDE = "outside this repository"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def tracked(pattern: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", pattern], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        return [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked source tree)
        return [p for p in ROOT.rglob(pattern) if ".venv" not in p.parts]


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", md.read_text())
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub("", md.read_text())  # code blocks show commands, not links
    out = []
    targets = [(t, "link") for t in LINK.findall(CODE.sub("", text))]
    targets += [(c.split()[0], "path") for c in CODE.findall(text) if c.startswith(("./", "../"))]
    for target, kind in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if root not in dest.parents and dest != root:
            out.append(f"{target} ({kind}) leaves the repository")
        elif not dest.exists():
            out.append(f"{target} ({kind}) does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target} ({kind}): no heading #{anchor} in {dest.relative_to(root)}")
    return out


@pytest.mark.parametrize("md", tracked("*.md"), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(md):
    assert broken_links(md) == []


def test_only_device_recipes_name_the_shared_directory_and_say_it_is_outside():
    offenders = []
    for path in tracked("*"):
        if path.suffix in (".json", ".png", ".npz", ".safetensors", ".gguf") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "../shared" not in text:
            continue
        rel = str(path.relative_to(ROOT))
        if rel == "tests/test_docs.py":  # this check, and its probe
            continue
        if not rel.startswith(DEVICE_RECIPES):
            offenders.append(f"{rel}: names ../shared")
        elif OUTSIDE not in text:
            offenders.append(f"{rel}: names ../shared without saying it is {OUTSIDE}")
    assert offenders == []


def test_the_checks_catch_what_they_are_for(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "design.md").write_text("# Design\n\n## Known gaps\n")
    md = root / "docs" / "guide.md"
    md.write_text("See `../shared/DESIGN.md` and [the design](../../shared/DESIGN.md), [gaps](design.md#known-gaps), "
                  "[here](design.md#no-such-heading) and [there](missing.md).\n\n```\nbash ../x.sh\n```\n")
    assert broken_links(md, root) == [
        "../../shared/DESIGN.md (link) leaves the repository",
        "design.md#no-such-heading (link): no heading #no-such-heading in docs/design.md",
        "missing.md (link) does not exist",
        "../shared/DESIGN.md (path) does not exist",
    ]
