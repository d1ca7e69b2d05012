"""Checkout → ChangeSet: the merge-base diff of base..head, as ``git diff --merge-base`` shows it.

Two git calls: ``--raw -z`` for exact metadata (status, modes, blob SHAs,
rename pairs, robust to any path bytes), and a zero-context patch parsed with
unidiff for hunks. Zero context keeps each hunk to the lines that changed, so a
hunk maps to the symbol that really changed rather than to its neighbours.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

from git.diff import decode_path
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from checks.model import ChangeSet, Checkout, FileChange, Hunk
from checks.workspace import open_repo

_STATUS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "C": "copied", "T": "modified"}
_NULL_SHA = "0" * 40


class DiffError(RuntimeError):
    """The diff could not be read; names the range and git's own words."""


@dataclass
class _Raw:
    status: str
    path: str
    old_path: str | None
    old_mode: str | None
    new_mode: str | None
    old_blob: str | None
    new_blob: str | None


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _parse_raw(out: bytes) -> list[_Raw]:
    """Parse ``git diff --raw -z``: ':old new osha nsha S\\0path\\0[path2\\0]'."""
    parts = out.split(b"\0")
    rows: list[_Raw] = []
    i = 0
    while i < len(parts):
        meta = parts[i]
        if not meta.startswith(b":"):
            i += 1
            continue
        old_mode, new_mode, old_sha, new_sha, status = _decode(meta[1:]).split()
        letter = status[0]
        if letter in "RC":
            old_path, path = _decode(parts[i + 1]), _decode(parts[i + 2])
            i += 3
        else:
            old_path, path = None, _decode(parts[i + 1])
            i += 2
        rows.append(
            _Raw(
                status=_STATUS.get(letter, "modified"),
                path=path,
                old_path=old_path,
                old_mode=None if old_mode == "000000" else old_mode,
                new_mode=None if new_mode == "000000" else new_mode,
                old_blob=None if old_sha == _NULL_SHA else old_sha,
                new_blob=None if new_sha == _NULL_SHA else new_sha,
            )
        )
    return rows


def _unquote(name: str) -> str:
    """A path as git C-quotes it in patch headers (``"b/engine/tab\\there.py"``, octal UTF-8 bytes) made plain
    (GitPython's reading of git's quoting; the a/ b/ prefix is stripped by the caller)."""
    raw = decode_path(name.encode("utf-8", "surrogateescape"), has_ab_prefix=False)
    return (raw or b"").decode("utf-8", "replace")


def _strip_prefix(name: str | None) -> str | None:
    if name is None or name == "/dev/null":
        return None
    name = _unquote(name)
    return name[2:] if name[:2] in ("a/", "b/") else name


def _hunks(pf) -> list[Hunk]:
    """Zero-context hunks are one block of removed lines then one of added lines, so the header alone
    gives every changed line number; unidiff's metadata-only parse (5× faster) is enough."""
    hunks = []
    for h in pf:
        hunks.append(
            Hunk(
                old_start=h.source_start,
                old_lines=h.source_length,
                new_start=h.target_start,
                new_lines=h.target_length,
                section=h.section_header or "",
                added=list(range(h.target_start, h.target_start + h.target_length)),
                removed=list(range(h.source_start, h.source_start + h.source_length)),
            )
        )
    return hunks


def _missing_object(exc: Exception) -> bool:
    text = str(exc)
    return "unable to read" in text or "missing blob" in text or "bad object" in text


def _absent_blobs(repo, meta: list[_Raw]) -> set[str]:
    """Paths of the rows whose old or new blob this clone does not hold (``git cat-file --batch-check``)."""
    shas = sorted({sha for row in meta for sha in (row.old_blob, row.new_blob) if sha})
    if not shas:
        return set()
    try:
        out = subprocess.run(["git", f"--git-dir={repo.git_dir}", "cat-file", "--batch-check"],
                             input="\n".join(shas) + "\n", capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    missing = {line.split()[0] for line in out.splitlines() if line.endswith(" missing")}
    return {row.path for row in meta if row.old_blob in missing or row.new_blob in missing}


_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's well-known empty tree


class _GitFailed(RuntimeError):
    """A git command exited non-zero; its stderr is the message."""


def _diff(repo, *args: str) -> bytes:
    """``git diff`` over the objects alone: run in the git directory as a bare repository, so the checked-out
    head's own ``.gitattributes`` (``* -diff``, ``*.py binary``) cannot decide what the audit sees."""
    # git >= 2.42 reads a bare repository's attributes from HEAD (in a CLI checkout, the PR's head): attr.tree
    # points them at the empty tree instead; older git ignores the key and reads none in a bare repository.
    cmd = ["git", f"--git-dir={repo.git_dir}", "-c", "core.bare=true", "-c", f"attr.tree={_EMPTY_TREE}",
           "-c", "core.quotepath=false", "diff", *args]
    try:
        out = subprocess.run(cmd, cwd=repo.git_dir, capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise _GitFailed(str(exc)) from None
    if out.returncode != 0:
        raise _GitFailed(out.stderr.decode("utf-8", "replace").strip() or f"exit {out.returncode}")
    return out.stdout


def build_changeset(checkout: Checkout) -> ChangeSet:
    repo = checkout.git if checkout.git is not None else open_repo(checkout.repo)  # the pipeline's open repo
    a, b = checkout.merge_base_sha, checkout.head_sha
    common = ["--no-color", "--no-ext-diff", "-M", "--full-index"]
    try:
        raw = _diff(repo, a, b, "--raw", "-z", "--no-abbrev", *common)
    except Exception as exc:  # range or object missing
        if not _missing_object(exc):
            raise DiffError(f"git diff {a[:12]}..{b[:12]} failed: {exc}") from None
        try:  # rename detection reads blobs; the raw listing itself needs only the trees
            raw = _diff(repo, a, b, "--raw", "-z", "--no-abbrev", "--no-renames", "--no-color", "--no-ext-diff",
                        "--full-index")
        except Exception as exc2:
            raise DiffError(f"git diff {a[:12]}..{b[:12]} failed: {exc2}") from None
        common = [c for c in common if c != "-M"] + ["--no-renames"]
    meta = _parse_raw(raw)
    absent: set[str] = set()
    try:
        patch = _diff(repo, a, b, "-U0", "--src-prefix=a/", "--dst-prefix=b/", *common)
    except Exception as exc:
        absent = _absent_blobs(repo, meta) if _missing_object(exc) else set()
        if not absent:
            raise DiffError(f"git diff {a[:12]}..{b[:12]} failed: {exc}") from None
        # a partial or LFS-less clone lacks some blobs: those files are listed and mapped by path only
        skip = [f":(exclude,literal){row.path}" for row in meta if row.path in absent]
        skip += [f":(exclude,literal){row.old_path}" for row in meta if row.path in absent and row.old_path]
        try:
            patch = _diff(repo, a, b, "-U0", "--src-prefix=a/", "--dst-prefix=b/", *common, "--", ":(top)", *skip)
        except Exception as exc2:
            raise DiffError(f"git diff {a[:12]}..{b[:12]} failed: {exc2}") from None
    try:
        patched = PatchSet(_decode(patch), metadata_only=True)
    except UnidiffParseError as exc:
        raise DiffError(f"cannot parse the diff {a[:12]}..{b[:12]}: {exc}") from None

    by_path: dict[str | None, Any] = {}
    for patched_file in patched:
        path = _strip_prefix(patched_file.target_file) or _strip_prefix(patched_file.source_file)
        by_path[path] = patched_file

    files = []
    for row in meta:
        pf = by_path.get(row.path)
        binary = bool(pf is not None and pf.is_binary_file) or row.path in absent
        hunks = [] if pf is None or binary else _hunks(pf)
        files.append(
            FileChange(
                path=row.path,
                status=row.status,  # type: ignore[arg-type]  # one of _STATUS's values
                old_path=row.old_path,
                binary=binary or (row.new_mode or row.old_mode) == "160000",
                old_mode=row.old_mode,
                new_mode=row.new_mode,
                old_blob=row.old_blob,
                new_blob=row.new_blob,
                additions=sum(len(h.added) for h in hunks),
                deletions=sum(len(h.removed) for h in hunks),
                hunks=hunks,
            )
        )
    return ChangeSet(base_sha=checkout.base_sha, head_sha=checkout.head_sha,
                     merge_base_sha=checkout.merge_base_sha, files=files)
