"""Where a reviewer meets the findings: the rendered comment of a 150-file PR, in a browser.

    python benchmarks/comment_layout.py [--files 2000] [--screenshot docs/comment-150-files.png]
                                        [--before REV] [--smoke]

Builds a bring-up-sized PR (benchmarks/synth_repo.py's synthetic engine, 141 changed files, with the
demo's drifting task wiring on top: 150 files), reviews it, renders the comment as GitHub would
(markdown-it-py, GitHub-like CSS) in headless Chromium, and reports, in one run:
- the comment's size against GitHub's 65 536-character limit (the anchor);
- how far down the page the first finding starts, against one screen (900 px, the anchor);
- with ``--before REV``: the same for the comment that revision of drift-audit renders.
``--screenshot`` saves the first screen. ``--smoke`` uses a 300-file repo and skips the browser
sections where no Chromium is installed (saying so).
"""

from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.synth_repo import make_synthetic_repo, shortstat  # noqa: E402

SCREEN = (1280, 900)
COMMENT_LIMIT = 65_536
CSS = """
body{margin:0;background:#fff;font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI","Noto Sans",Helvetica,
Arial,sans-serif;color:#1f2328}
.timeline{max-width:900px;margin:24px auto;padding:0 16px}
.comment{border:1px solid #d0d7de;border-radius:6px}
.header{background:#f6f8fa;border-bottom:1px solid #d0d7de;padding:8px 16px;color:#59636e;border-radius:6px 6px 0 0}
.header b{color:#1f2328}
.body{padding:16px;overflow-wrap:break-word}
h3{font-size:1.25em;margin:0 0 16px;padding-bottom:.3em;border-bottom:1px solid #d1d9e0b3}
h4{font-size:1em;margin:24px 0 16px}
p,ul,table,blockquote,details,pre{margin:0 0 16px}
ul{padding-left:2em}ul ul{margin:0}li+li{margin-top:.25em}
code{font:85% ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#818b981f;padding:.2em .4em;
border-radius:6px}
pre{background:#f6f8fa;padding:16px;border-radius:6px;overflow:auto}pre code{background:none;padding:0}
table{border-collapse:collapse;display:block;overflow:auto}td,th{border:1px solid #d1d9e0;padding:6px 13px}
blockquote{margin:0 0 16px;padding:0 1em;color:#59636e;border-left:.25em solid #d1d9e0}
a{color:#0969da;text-decoration:none}sub{font-size:85%}summary{cursor:pointer}
"""
# Only in the page that is measured, never in the screenshot: it writes where the first finding starts.
MEASURE = """<script>
const h = [...document.querySelectorAll('h4')].find(e => e.textContent.trim().startsWith('Findings')
                                                        || e.textContent.trim().startsWith('Drift checks'));
let el = h; while (el && el.tagName !== 'UL') el = el.nextElementSibling;
const li = el ? el.querySelector('li') : null;
document.title = 'y=' + (li ? Math.round(li.getBoundingClientRect().top + window.scrollY) : -1);
</script>"""


def build_pr(root: Path, n_files: int, change_files: int) -> tuple[str, str]:
    """The synthetic bring-up change with the demo's engine and its drifting task under it: base2 is the
    synthetic base plus the demo's base tree (its config included), head2 the synthetic head plus the
    demo's head tree, a child of base2."""
    from bot.demo import demo_trees

    base, head = make_synthetic_repo(root, n_files=n_files, change_files=change_files,
                                     change_lines=50_000 * change_files // 129)
    demo_base, demo_head = demo_trees()

    def commit_over(tree_of: str, parent: str, files: dict[str, str], message: str) -> str:
        env = {"GIT_INDEX_FILE": str(root / ".git" / "layout-index"), "GIT_AUTHOR_NAME": "Synth",
               "GIT_AUTHOR_EMAIL": "synth@example.com", "GIT_COMMITTER_NAME": "Synth",
               "GIT_COMMITTER_EMAIL": "synth@example.com", "PATH": "/usr/bin:/bin"}

        def git(*args: str, data: bytes | None = None) -> str:
            return subprocess.run(["git", *args], cwd=root, env=env, input=data, capture_output=True,
                                  check=True).stdout.decode().strip()

        git("read-tree", tree_of)
        for path, text in files.items():
            blob = git("hash-object", "-w", "--stdin", data=text.encode())
            git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
        return git("commit-tree", git("write-tree"), "-p", parent, "-m", message)

    base2 = commit_over(base, base, demo_base, "engine with five tasks")
    head2 = commit_over(head, base2, demo_head, "bring-up, and the topk_softmax task")
    return base2, head2


def comment_now(root: Path, base: str, head: str) -> tuple[str, float]:
    from checks.model import AuditRequest
    from runner.pipeline import plan
    from runner.report import Context, report

    start = time.perf_counter()
    audit = plan(AuditRequest(repo=str(root), base=base, head=head))
    md = report(audit, Context(blob_url=f"https://github.com/example/engine/blob/{head}")).markdown
    return md, time.perf_counter() - start


def comment_at(rev: str, root: Path, base: str, head: str, work: Path) -> str:
    """The comment that drift-audit at ``rev`` renders for the same range, from an export of that tree."""
    tree = work / f"drift-audit-{rev[:12]}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = subprocess.run([sys.executable, "-m", "bot.cli", "review", str(root), "--base", base, "--head", head],
                         cwd=tree, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "."})
    if out.returncode not in (0, 1):
        raise RuntimeError(f"drift-audit at {rev}: exit {out.returncode}: {out.stderr[-500:]}")
    return out.stdout


def page(markdown: str, *, measure: bool) -> str:
    from markdown_it import MarkdownIt

    body = MarkdownIt("gfm-like", {"html": True}).render(markdown)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>comment</title><style>{CSS}</style></head>"
            "<body><div class='timeline'><div class='comment'><div class='header'><b>drift-audit</b> bot "
            f"commented</div><div class='body'>{body}</div></div></div>{MEASURE if measure else ''}</body></html>")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser(browser: str, work: Path, *args: str) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={work / 'chromium-profile'}", f"--window-size={SCREEN[0]},{SCREEN[1]}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


def first_finding_y(browser: str, markdown: str, work: Path) -> int:
    target = work / f"measure-{time.monotonic_ns()}.html"
    target.write_text(page(markdown, measure=True), encoding="utf-8")
    dom = _browser(browser, work, "--dump-dom", target.as_uri())
    title = dom.split("<title>", 1)[1].split("</title>", 1)[0] if "<title>" in dom else ""
    if not title.startswith("y="):
        raise RuntimeError(f"the measuring page did not report a position: {html.unescape(title)!r}")
    return int(title[2:])


def screenshot(browser: str, markdown: str, work: Path, png: Path) -> None:
    target = work / "screenshot.html"
    target.write_text(page(markdown, measure=False), encoding="utf-8")
    png.parent.mkdir(parents=True, exist_ok=True)
    _browser(browser, work, "--virtual-time-budget=5000", f"--screenshot={png.resolve()}", target.as_uri())
    if not png.is_file() or png.stat().st_size < 10_000:
        raise RuntimeError(f"Chromium wrote no screenshot to {png}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000, help="files in the synthetic repo")
    ap.add_argument("--change", type=int, default=141, help="files the synthetic change touches (+9 of the demo)")
    ap.add_argument("--screenshot", type=Path, help="save the first screen of the comment as PNG here")
    ap.add_argument("--before", metavar="REV", help="also measure the comment drift-audit at REV renders")
    ap.add_argument("--smoke", action="store_true", help="small repo; browser sections skipped without Chromium")
    args = ap.parse_args()
    if args.smoke:
        args.files = 300

    failures = 0
    work = Path(tempfile.mkdtemp(prefix="drift-audit-layout-"))
    try:
        base, head = build_pr(work / "synth", args.files, args.change)
        files = subprocess.run(["git", "diff", "--name-only", f"{base}...{head}"], cwd=work / "synth",
                               capture_output=True, text=True, check=True).stdout.split()
        print(f"repo: {args.files} files; PR: {len(files)} files, {shortstat(work / 'synth', base, head)}")
        now, seconds = comment_now(work / "synth", base, head)
        comments = {"this tree": now}
        if args.before:
            try:
                comments[f"at {args.before}"] = comment_at(args.before, work / "synth", base, head, work)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"section 'before' failed: {exc}")
                failures += 1
        print(f"\nreview + render of this tree: {seconds:.2f} s\n")
        print(f"{'comment':<18}{'chars':>8}{'× limit':>9}{'first finding y':>17}{'× screen':>10}")
        print("-" * 62)
        browser = chromium()
        for name, md in comments.items():
            y_text, ratio_text = "no browser", ""
            if browser:
                try:
                    y = first_finding_y(browser, md, work)
                    y_text, ratio_text = f"{y} px", f"{y / SCREEN[1]:.2f}"
                except (RuntimeError, subprocess.SubprocessError) as exc:
                    print(f"section 'measure {name}' failed: {exc}")
                    failures += 1
            print(f"{name:<18}{len(md):>8}{len(md) / COMMENT_LIMIT:>9.2f}{y_text:>17}{ratio_text:>10}")
        print(f"\nscreen: {SCREEN[0]}×{SCREEN[1]} px; limit: {COMMENT_LIMIT} characters")
        if not browser:
            print("no Chromium here: the browser sections were skipped (apt-get install chromium)")
            if not args.smoke:
                failures += 1
        elif args.screenshot:
            try:
                screenshot(browser, now, work, args.screenshot)
                print(f"screenshot: {args.screenshot}")
            except (RuntimeError, subprocess.SubprocessError) as exc:
                print(f"section 'screenshot' failed: {exc}")
                failures += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
