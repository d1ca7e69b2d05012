"""Hostile diffs through ``drift-audit review``: binary, non-UTF-8 content and names, a long file, renames,
mode-only changes, a submodule, a symlink, deep nesting, CRLF, our own marker as a file name, and seeded random
trees of the same. Each review exits 0 or 1 (never 2, never a traceback), its JSON loads back, every entry git
lists is in the ChangeSet with git's status, flags and line counts (nothing lost), and every format renders.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
from pathlib import Path

from bot.cli import main
from checks.model import Audit, from_json
from tests.gitrepo import GitRepo

SEED = 1701
FORMATS = ("markdown", "sarif", "junit", "html", "check-run")
NAMES = ["engine/plain.py", "engine/with space.py", "engine/café.py", "engine/<!-- drift-audit:comment -->.py",
         "engine/[x](http:e.x).py", "engine/@octocat.py", "kernels/#12.cu", "engine/ümlaut/ß.h", "-dash.py",
         "engine/.hidden", "engine/a.b.c.d.py", "engine/" + "d" * 120 + ".py"]
CONTENTS: list[bytes] = [b"def f():\n    return 1\n", b"x = 1", b"", b"\x00\x01\xff binary\x00", b"caf\xe9 = 1\n",
                         b"a = 1\r\nb = 2\r\n", b"def g(:\n", b"x = " + b"(" * 800 + b"1" + b")" * 800 + b"\n",
                         b"s = '" + b"y" * 20000 + b"'\n", "é = '😀'\n".encode(), b"\xef\xbb\xbfbom = 1\n"]


def _review(repo: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["review", str(repo), "--base", "HEAD~1", *extra])
    return code, out.getvalue(), err.getvalue()


def _git_listing(repo: Path) -> dict[str, tuple[str, str, str]]:
    """path -> (status letter, old mode, new mode), from git's own -z listing (rename pairs under the new path)."""
    raw = subprocess.run(["git", "-C", str(repo), "diff", "--raw", "-z", "-M", "HEAD~1", "HEAD"],
                         capture_output=True, check=True).stdout.split(b"\0")
    out, i = {}, 0
    while i < len(raw) - 1:
        old_mode, new_mode, _, _, status = raw[i].decode()[1:].split()
        step = 3 if status[0] in "RC" else 2
        out[raw[i + step - 1].decode("utf-8", "replace")] = (status[0], old_mode, new_mode)
        i += step
    return out


def _numstat(repo: Path) -> dict[str, tuple[str, str]]:
    raw = subprocess.run(["git", "-C", str(repo), "diff", "--numstat", "-z", "--no-renames", "HEAD~1", "HEAD"],
                         capture_output=True, check=True).stdout.split(b"\0")
    out = {}
    for entry in raw:
        if entry.count(b"\t") >= 2:
            added, removed, path = entry.split(b"\t", 2)
            out[path.decode("utf-8", "replace")] = (added.decode(), removed.decode())
    return out


def _audited(repo: Path, tmp: Path) -> Audit:
    code, out, err = _review(repo, "--format", "json")
    assert code in (0, 1) and "Traceback" not in err, (code, err[-2000:])
    audit = from_json(Audit, out)
    saved = tmp / "audit.json"
    saved.write_text(out)
    for fmt in FORMATS:  # every format renders the same audit
        buf, errs = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(errs):
            rendered = main(["report", str(saved), "--format", fmt])
        assert rendered == code and buf.getvalue().strip(), (fmt, errs.getvalue()[-1000:])
    return audit


def _nothing_lost(repo: Path, audit: Audit) -> None:
    assert audit.changes is not None
    listed = _git_listing(repo)
    files = {f.path: f for f in audit.changes.files}
    assert set(files) == set(listed), (set(files) ^ set(listed))
    counts = _numstat(repo)
    for path, (letter, old_mode, new_mode) in listed.items():
        change = files[path]
        assert change.status[0].upper() == {"T": "M"}.get(letter, letter), (path, change.status, letter)
        gitlink = "160000" in (old_mode, new_mode)
        if gitlink or counts.get(path, ("-",))[0] == "-":
            assert change.binary, path  # a submodule or a binary file: listed, flagged, no line hunks
            continue
        assert not change.binary, path
        if letter not in "RC" and not (old_mode != new_mode and counts.get(path) == ("0", "0")):
            assert (str(change.additions), str(change.deletions)) == counts[path], (path, change)
        if old_mode not in ("000000", new_mode) and new_mode != "000000":
            assert change.mode_changed, path


def test_hostile_entries_lose_nothing_and_render_in_every_format(tmp_path):
    r = GitRepo(tmp_path / "r")
    for i, name in enumerate(NAMES):
        r.write(name, CONTENTS[i % len(CONTENTS)] if i % 3 else b"def f():\n    return 1\n")
    r.write("engine/blob.bin", b"\x00\x01\x02")
    r.write("engine/mode.sh", "echo hi\n")
    r.write("engine/old.py", "def g():\n    return 2\n" * 30)
    r.write("engine/gone.py", "x = 1\n")
    latin1 = os.fsdecode(b"engine/latin\xe9.py")
    (r.path / latin1).write_bytes(b"x = 1\n")
    r.commit("base")

    r.write("engine/blob.bin", b"\x00\xff\xfe other binary\x00")
    r.chmod_x("engine/mode.sh")  # mode only
    r.mv("engine/old.py", "engine/renamed.py")
    r.write("engine/renamed.py", "def g():\n    return 2\n" * 29 + "def h():\n    return 3\n")  # rename + edit
    r.rm("engine/gone.py")
    (r.path / latin1).write_bytes(b"x = 2\n")  # a name that is not UTF-8
    for i, name in enumerate(NAMES):
        r.write(name, CONTENTS[(i + 3) % len(CONTENTS)])
    r.write("engine/long.py", "s = '" + "z" * 2_100_000 + "'\n")  # over [settings] max_file_bytes
    r.write("engine/crlf.py", "a = 1\r\nb = 3\r\n")
    r.write("engine/empty.py", "")
    os.symlink("../../../etc/passwd", r.path / "engine/link.py")
    r.git("add", "-A")
    base = r.git("rev-parse", "HEAD~0").strip()
    r.git("update-index", "--add", "--cacheinfo", f"160000,{base},vendor/sub")  # a submodule (gitlink)
    r.git("commit", "-q", "-m", "hostile head")

    audit = _audited(r.path, tmp_path)
    _nothing_lost(r.path, audit)
    files = {f.path: f for f in audit.changes.files}
    assert files["vendor/sub"].new_mode == "160000" and files["engine/link.py"].new_mode == "120000"
    assert files["engine/renamed.py"].old_path == "engine/old.py"
    assert files["engine/mode.sh"].mode_changed and not files["engine/mode.sh"].hunks


def test_seeded_random_trees_lose_nothing(tmp_path):
    rng = random.Random(SEED)
    for round_ in range(2):
        r = GitRepo(tmp_path / f"r{round_}")
        present: list[str] = []
        for name in rng.sample(NAMES, 6):
            r.write(name, rng.choice(CONTENTS))
            present.append(name)
        r.commit("base")
        for _ in range(8):
            op = rng.random()
            if op < 0.3 and present:
                r.write(rng.choice(present), rng.choice(CONTENTS))
            elif op < 0.45 and present:
                r.rm(present.pop(rng.randrange(len(present))))
            elif op < 0.6 and present:
                old = present.pop(rng.randrange(len(present)))
                new = f"moved/{round_}/{len(present)}_{Path(old).name}"
                r.mv(old, new)
                present.append(new)
            elif op < 0.7 and present:
                r.chmod_x(rng.choice(present))
            else:
                name = f"new/{rng.randrange(10**6)}_{Path(rng.choice(NAMES)).name}"
                if name not in present:
                    r.write(name, rng.choice(CONTENTS))
                    present.append(name)
        r.git("add", "-A")
        r.git("commit", "-q", "--allow-empty", "-m", "random head")
        _nothing_lost(r.path, _audited(r.path, tmp_path))


def test_paths_git_quotes_keep_their_hunks(tmp_path):
    r = GitRepo(tmp_path / "r")
    names = ["engine/tab\there.py", 'engine/quo"te.py', "engine/back\\slash.py", "engine/new\nline.py"]
    for name in names:
        r.write(name, "def f():\n    return 1\n")
    r.commit("base")
    for name in names:
        r.write(name, "def f():\n    return 2\n")
    r.commit("head")
    code, out, err = _review(r.path, "--format", "json")
    assert code in (0, 1), err
    files = {f["path"]: f for f in json.loads(out)["changes"]["files"]}
    assert {p: len(files[p]["hunks"]) for p in names} == dict.fromkeys(names, 1)


def test_a_heads_gitattributes_cannot_blind_the_diff(tmp_path):
    r = GitRepo(tmp_path / "r")
    r.write("engine/a.py", "def f():\n    return 1\n")
    r.commit("base")
    r.write(".gitattributes", "* -diff\n")  # the PR declares every file binary: no hunks, no symbols
    r.write("engine/a.py", "def f():\n    return 2\n")
    r.commit("head")  # checked out, as in a CI job on the pull request
    code, out, err = _review(r.path, "--format", "json")
    assert code in (0, 1), err
    (change,) = [f for f in json.loads(out)["changes"]["files"] if f["path"] == "engine/a.py"]
    assert not change["binary"] and len(change["hunks"]) == 1


def test_a_deep_expression_in_the_head_does_not_crash_the_review(tmp_path):
    r = GitRepo(tmp_path / "r")
    r.write("engine/a.py", "def f():\n    return 1\n")
    r.commit("base")
    r.write("engine/a.py", "def f():\n    return " + "+".join(["1"] * 30000) + "\n")  # valid Python, 30k deep
    r.commit("head")
    code, out, err = _review(r.path, "--format", "json")
    assert code in (0, 1), err
    (change,) = [f for f in json.loads(out)["changes"]["files"] if f["path"] == "engine/a.py"]
    assert len(change["hunks"]) == 1  # reviewed, not dropped
