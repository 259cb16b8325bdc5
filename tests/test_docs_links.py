"""The docs' links hold: in README.md, docs/*.md and bench/README.md every relative link (and image)
names a file or folder of the tree, every '#anchor' a heading of the page it points to, and every
bench/... path the text mentions exists; a path written 'COMMIT:bench/...' (a file removed from the
tree, read with `git show COMMIT:path`) exists at that commit, where this checkout has git history."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MD_ANCHOR = re.compile(r"(?<![\w/.-])((?:\.\./)?(?:docs/)?[\w.-]+\.md)#([\w-]+)")
# bench/... in prose or code, not inside a longer path ('../bench/x' is a link, checked as one);
# 'abc1234:bench/...' is a path at a commit
# ('bench/results/x_<device>.json' names no one file: left alone)
BENCH_PATH = re.compile(r"(?<![\w/.-])(?:([0-9a-f]{7,40}):)?(bench/[\w./{},*-]*[\w/*}])(?![\w/{}*<$-])")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())   # a link: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor (outside fenced code), a repeated one with GitHub's -1, -2 suffixes."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def expand(path: str) -> list[str]:
    """'a_{1,2}.json' -> ['a_1.json', 'a_2.json'] (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", path)
    return [path[:m.start()] + x + path[m.end():] for x in m.group(1).split(",")] if m else [path]


def exists(path: Path, text: str) -> bool:
    return any(list(path.parent.glob(Path(p).name)) if "*" in p else (path.parent / Path(p).name).exists()
               for p in expand(text))


def at_commit(pairs: list[tuple[str, str]]) -> list[str]:
    """The (commit, path) pairs git does not have (none where this checkout has no history of them)."""
    try:
        git = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], capture_output=True, text=True,
                             input="".join(f"{c}^{{commit}}\n" for c, _ in pairs), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    known = {c for (c, _), line in zip(pairs, git.stdout.splitlines()) if not line.endswith("missing")}
    todo = [(c, p) for c, p in pairs if c in known]
    out = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], capture_output=True, text=True,
                         input="".join(f"{c}:{p.rstrip('/')}\n" for c, p in todo), timeout=60).stdout.splitlines()
    return [f"{c}:{p}" for (c, p), line in zip(todo, out) if line.endswith("missing")]


def problems() -> list[str]:
    bad, dated = [], []
    for page in PAGES:
        rel = page.relative_to(ROOT)
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):          # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{rel}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{rel}: link to {target}: no heading has that anchor")
        for path, anchor in MD_ANCHOR.findall(text):
            dest = (page.parent / path).resolve()
            if not dest.is_file():
                dest = (ROOT / path).resolve()
            if dest.is_file() and anchor not in anchors(dest):
                bad.append(f"{rel}: {path}#{anchor}: no heading has that anchor")
        for commit, path in BENCH_PATH.findall(text):
            if commit:
                dated.append((commit, path))
            elif not exists(ROOT / path.rstrip("/"), path.rstrip("/")):
                bad.append(f"{rel}: {path}: not in the tree")
    return sorted(set(bad)) + [f"{p}: not at that commit" for p in at_commit(sorted(set(dated)))]


def test_the_checkers_rules_by_hand():
    assert slug("The real workload: Qwen2.5-Coder-Instruct on GSM8K (4x H200, 2026-11-27)") == \
        "the-real-workload-qwen25-coder-instruct-on-gsm8k-4x-h200-2026-11-27"
    assert slug("`letter_counting` with `--precision autocast`") == "letter_counting-with---precision-autocast"
    assert expand("x_{512,1024}x512.json") == ["x_512x512.json", "x_1024x512.json"]
    text = ("(`bench/a.json`, cf39bbb:bench/results/b/, ../bench/c.py, bench/results/d_<device>.json, "
            "bench/e_{1,2}.json.")
    assert BENCH_PATH.findall(text) == [("", "bench/a.json"), ("cf39bbb", "bench/results/b/"), ("", "bench/e_{1,2}.json")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_exists(page):
    assert page.is_file()


def test_every_link_anchor_and_bench_path_holds():
    assert problems() == []
