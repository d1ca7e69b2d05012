"""A synthetic DeepSeek-style engine repo with one PR the size of a real V4 bring-up.

``make_synthetic_repo(path)`` writes ≥ 2000 files (Python, C++, CUDA, headers,
a few binaries) through ``git fast-import`` — one process, no work-tree churn —
then one change of 129 files and ~50 000 changed lines: modified, added,
renamed, deleted, binary and mode-changed files, with a few non-UTF-8 lines.

    python benchmarks/synth_repo.py /tmp/synth   # prints base and head SHAs
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

_DIRS = {
    "py": ["python/engine/models", "python/engine/layers", "python/engine/weights", "python/engine/runtime",
           "python/engine/scheduler", "python/engine/utils", "tests/unit"],
    "cc": ["src/kernel", "src/runtime", "src/weights", "src/scheduler"],
    "h": ["include/mk/tasks", "include/mk/runtime", "include/mk/kernel"],
    "cu": ["kernels/attention", "kernels/moe", "kernels/gemm", "kernels/norm"],
}


def _py_file(rng: random.Random, n_funcs: int, tag: str) -> str:
    out = [f'"""Module {tag}."""', "import math", ""]
    for c in range(max(1, n_funcs // 4)):
        out.append(f"class Block{c}_{tag}:")
        for f in range(4):
            out.append(f"    def op_{f}_layer(self, x, y={rng.randint(0, 99)}):")
            for k in range(rng.randint(3, 8)):
                out.append(f"        x = x * {rng.random():.4f} + math.sqrt(y + {k})")
            out.append("        return x")
            out.append("")
    return "\n".join(out) + "\n"


def _cc_file(rng: random.Random, n_funcs: int, tag: str, cuda: bool = False) -> str:
    out = ['#include "mk/runtime/header.h"', "namespace mk {"]
    for f in range(n_funcs):
        q = "__global__ void" if cuda else "int"
        out.append(f"{q} {tag}_fn{f}(int const* params, int n) {{")
        for k in range(rng.randint(3, 9)):
            out.append(f"  int v{k} = params[{k}] * {rng.randint(1, 1000)} + n;")
        out.append("  " + ("return;" if cuda else "return n;"))
        out.append("}")
    out.append("}  // namespace mk")
    return "\n".join(out) + "\n"


def _h_file(rng: random.Random, n: int, tag: str) -> str:
    out = ["#pragma once", "namespace mk {", f"enum {tag.capitalize()}Type {{"]
    out += [f"  {tag.upper()}_{i} = {100 + i}," for i in range(n)]
    out += ["};", "}  // namespace mk"]
    return "\n".join(out) + "\n"


def _content(rng: random.Random, ext: str, tag: str, size: int) -> str:
    if ext == "py":
        return _py_file(rng, size, tag)
    if ext == "h":
        return _h_file(rng, size * 3, tag)
    return _cc_file(rng, size, tag, cuda=ext == "cu")


def _base_files(rng: random.Random, n_files: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    kinds = [("py", 0.45), ("cc", 0.25), ("h", 0.15), ("cu", 0.15)]
    i = 0
    while len(files) < n_files - 6:
        ext = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        d = rng.choice(_DIRS[ext])
        name = f"{d}/m{i:05d}.{ext}" if ext != "py" or not d.startswith("tests") else f"{d}/test_m{i:05d}.py"
        files[name] = _content(rng, ext, f"m{i}", rng.randint(4, 10)).encode()
        i += 1
    for j in range(6):
        files[f"assets/blob{j}.bin"] = bytes(rng.getrandbits(8) for _ in range(2048))
    return files


def _change(rng: random.Random, base: dict[str, bytes], change_files: int, change_lines: int):
    """Head files, renames and mode flips for a change touching ``change_files`` files."""
    head = dict(base)
    text_paths = sorted(p for p in base if not p.endswith(".bin"))
    rng.shuffle(text_paths)
    plan = {"modified": change_files - 60, "added": 35, "renamed": 10, "deleted": 8, "binary": 3, "mode": 4}
    assert sum(plan.values()) == change_files
    modes: dict[str, str] = {}
    per_file = int(change_lines * 1.08) // (plan["modified"] + plan["added"])
    it = iter(text_paths)
    for _ in range(plan["modified"]):
        p = next(it)
        lines = head[p].decode().splitlines()
        ext = p.rsplit(".", 1)[1]
        extra = _content(rng, ext, f"x{rng.randint(0, 10**6)}", max(2, per_file // 4)).splitlines()
        # rewrite a run of lines in the middle and append a block: both sides of the diff get work
        cut = len(lines) // 2
        mark = "  # changed" if ext == "py" else "  // changed"
        lines[cut:cut + 5] = [ln + mark for ln in lines[cut:cut + 5]]
        head[p] = ("\n".join(lines + extra[: per_file]) + "\n").encode()
    for k in range(plan["added"]):
        ext = rng.choice(["py", "cc", "cu", "h"])
        d = rng.choice(_DIRS[ext])
        body = _content(rng, ext, f"n{k}", max(2, per_file // 4)).splitlines()[: per_file]
        if k == 0:
            comment = "#" if ext == "py" else "//"
            body.append(f"{comment} latin-1 bytes follow: caf\xe9")  # replaced below by raw bytes
        data = ("\n".join(body) + "\n").encode()
        if k == 0:
            data = data.replace("caf\xe9".encode(), b"caf\xe9")  # not UTF-8
        head[f"{d}/new_{k:03d}.{ext}"] = data
    renames = []
    for _ in range(plan["renamed"]):
        p = next(it)
        new = p.replace("/m", "/renamed_m", 1)
        head[new] = head.pop(p) + b"# moved\n"
        renames.append((p, new))
    for _ in range(plan["deleted"]):
        head.pop(next(it))
    for j in range(plan["binary"]):
        head[f"assets/blob{j}.bin"] = bytes(rng.getrandbits(8) for _ in range(2048))
    for _ in range(plan["mode"]):
        modes[next(it)] = "100755"
    return head, modes


def _fast_import(repo: Path, commits: list[tuple[str, dict[str, bytes], dict[str, str], str | None]]) -> list[str]:
    """Write commits (message, files, modes, parent-mark) with one git fast-import; returns SHAs."""
    chunks: list[bytes] = []
    for n, (msg, files, modes, _parent) in enumerate(commits, 1):
        chunks.append(f"commit refs/heads/main\nmark :{n}\n".encode())
        chunks.append(b"author Synth <synth@example.com> 1700000000 +0000\n")
        chunks.append(b"committer Synth <synth@example.com> 1700000000 +0000\n")
        m = msg.encode()
        chunks.append(b"data %d\n%s\n" % (len(m), m))
        if n > 1:
            chunks.append(f"from :{n - 1}\n".encode())
        chunks.append(b"deleteall\n")
        for path, data in sorted(files.items()):
            mode = modes.get(path, "100644")
            chunks.append(f"M {mode} inline {path}\n".encode())
            chunks.append(b"data %d\n%s\n" % (len(data), data))
    marks_file = repo / ".git" / "synth-marks"
    proc = subprocess.run(["git", "fast-import", "--quiet", f"--export-marks={marks_file}"], cwd=repo,
                          input=b"".join(chunks), capture_output=True)
    if proc.returncode:
        raise RuntimeError(f"git fast-import failed: {proc.stderr.decode(errors='replace')}")
    marks = dict(line.split() for line in marks_file.read_text().splitlines())
    return [marks[f":{n}"] for n in range(1, len(commits) + 1)]


def make_synthetic_repo(path: str | Path, n_files: int = 2000, change_files: int = 129,
                        change_lines: int = 50_000, seed: int = 0) -> tuple[str, str]:
    repo = Path(path)
    repo.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    rng = random.Random(seed)
    base = _base_files(rng, n_files)
    head, modes = _change(rng, base, change_files, change_lines)
    base_sha, head_sha = _fast_import(repo, [("base", base, {}, None), ("bring-up", head, modes, None)])
    subprocess.run(["git", "checkout", "-q", "-f", "main"], cwd=repo, check=True)
    return base_sha, head_sha


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "/tmp/drift-audit-synth"
    b, h = make_synthetic_repo(target)
    print(b, h)


def shortstat(repo: Path, base: str, head: str) -> str:
    """``git diff --shortstat`` of the range: what the benchmarks print as the size of the change."""
    return subprocess.run(["git", "diff", "--shortstat", base, head], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def git_diff_floor(repo: Path, base: str, head: str, runs: int) -> float:
    """Median wall seconds of ``git diff --stat`` of the range in a fresh process: the anchor the review
    benchmarks divide by."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(["git", "diff", "--stat", base, head], cwd=repo, check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
