"""Golden decode files and the near-tie-aware comparator.

Format (JSON lines, UTF-8): a header line, then one line per prompt::

    {"format": "drift-audit-golden", "version": 1, "model": "...", "mla": "naive", "dtype": "float32", ...}
    {"index": 0, "prompt": [5, 17, 3], "tokens": [88, 2, ...], "margins": [3.1, 0.02, ...]}

``margins[i]`` is the top-1 minus top-2 logit when ``tokens[i]`` was chosen. Any engine's decode suite can
write this format; ``compare`` needs only ``prompt`` and ``tokens`` from the candidate (its margins, when
present, are reported too).

A divergence is a **near-tie** when the reference's margin at that step is below the threshold: two
equivalent kernels that round differently may pick either token there. Anything else is a **break**.
The default threshold, 0.1 logits, is ~2.5 bf16 ulps at |logit| ≈ 10 (bf16 keeps 8 significant bits, so
one rounding moves a logit of 10 by up to 0.04); an fp32 comparison can pass a much smaller one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = "drift-audit-golden"
VERSION = 1
DEFAULT_NEAR_TIE = 0.1


class GoldenError(ValueError):
    """A golden file that cannot be read, or two that cannot be compared."""


@dataclass
class GoldenRecord:
    index: int
    prompt: list[int]
    tokens: list[int]
    margins: list[float] = field(default_factory=list)


@dataclass
class Golden:
    header: dict
    records: list[GoldenRecord]


def write_golden(path: str | Path, records: list[GoldenRecord], **header) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"format": FORMAT, "version": VERSION, **header}, sort_keys=True)]
    for r in records:
        lines.append(json.dumps({"index": r.index, "prompt": r.prompt, "tokens": r.tokens,
                                 "margins": [round(m, 6) for m in r.margins]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _ints(v, what: str, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise GoldenError(f"{where}: '{what}' must be a list of integer token ids")
    return v


def read_golden(path: str | Path) -> Golden:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GoldenError(f"{path}: no such golden file") from None
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise GoldenError(f"{path}: empty golden file")
    parsed = []
    for lineno, ln in lines:
        try:
            parsed.append((lineno, json.loads(ln)))
        except json.JSONDecodeError as exc:
            raise GoldenError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
    header: dict = {}
    if isinstance(parsed[0][1], dict) and parsed[0][1].get("format") == FORMAT:
        header = parsed.pop(0)[1]
        if header.get("version") != VERSION:
            raise GoldenError(f"{path}:1: golden format version {header.get('version')!r}; this reader knows {VERSION}")
    records: list[GoldenRecord] = []
    for lineno, obj in parsed:
        where = f"{path}:{lineno}"
        if not isinstance(obj, dict):
            raise GoldenError(f"{where}: expected an object with 'prompt' and 'tokens'")
        for key in ("prompt", "tokens"):
            if key not in obj:
                raise GoldenError(f"{where}: missing field '{key}'")
        margins = obj.get("margins", [])
        if not isinstance(margins, list) or not all(isinstance(m, (int, float)) for m in margins):
            raise GoldenError(f"{where}: 'margins' must be a list of numbers")
        records.append(GoldenRecord(index=int(obj.get("index", len(records))),
                                    prompt=_ints(obj["prompt"], "prompt", where),
                                    tokens=_ints(obj["tokens"], "tokens", where),
                                    margins=[float(m) for m in margins]))
    return Golden(header, records)


@dataclass
class PromptResult:
    index: int
    status: str  # "match" | "near-tie" | "break" | "short"
    match_length: int
    compared: int  # tokens compared (the reference's length)
    first_divergence: int | None = None
    expected: int | None = None
    got: int | None = None
    reference_margin: float | None = None
    candidate_margin: float | None = None


@dataclass
class Comparison:
    near_tie: float
    prompts: list[PromptResult]

    @property
    def ok(self) -> bool:
        """No real break: every prompt matched, or first diverged at a near-tie."""
        return all(p.status in ("match", "near-tie") for p in self.prompts)

    def to_dict(self) -> dict:
        return {"near_tie": self.near_tie, "ok": self.ok, "prompts": [asdict(p) for p in self.prompts]}

    def table(self) -> str:
        rows = [("prompt", "status", "match", "first div", "expected", "got", "ref margin")]
        for p in self.prompts:
            rows.append((str(p.index), p.status, f"{p.match_length}/{p.compared}",
                         "-" if p.first_divergence is None else str(p.first_divergence),
                         "-" if p.expected is None else str(p.expected), "-" if p.got is None else str(p.got),
                         "-" if p.reference_margin is None else f"{p.reference_margin:.4g}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        verdict = "OK" if self.ok else "BREAK"
        out.append(f"{verdict}: near-tie threshold {self.near_tie} logits")
        return "\n".join(out)


def compare_records(reference: list[GoldenRecord], candidate: list[GoldenRecord],
                    near_tie: float = DEFAULT_NEAR_TIE) -> Comparison:
    """Compare a candidate decode with the reference, prompt by prompt (matched by prompt ids)."""
    if near_tie < 0:
        raise GoldenError(f"near-tie threshold must be >= 0, got {near_tie}")
    by_prompt = {tuple(r.prompt): r for r in candidate}
    results = []
    for ref in reference:
        cand = by_prompt.get(tuple(ref.prompt))
        if cand is None:
            raise GoldenError(f"candidate has no decode for reference prompt {ref.index} ({ref.prompt[:8]}...)")
        n = len(ref.tokens)
        k = 0
        while k < min(n, len(cand.tokens)) and ref.tokens[k] == cand.tokens[k]:
            k += 1
        if k == n:
            results.append(PromptResult(ref.index, "match", k, n))
            continue
        if k == len(cand.tokens):  # a prefix of the reference, then nothing
            results.append(PromptResult(ref.index, "short", k, n, first_divergence=k, expected=ref.tokens[k]))
            continue
        rm = ref.margins[k] if k < len(ref.margins) else None
        cm = cand.margins[k] if k < len(cand.margins) else None
        status = "near-tie" if rm is not None and rm < near_tie else "break"
        results.append(PromptResult(ref.index, status, k, n, k, ref.tokens[k], cand.tokens[k], rm, cm))
    return Comparison(near_tie, results)


def compare_files(reference: str | Path, candidate: str | Path, near_tie: float = DEFAULT_NEAR_TIE) -> Comparison:
    return compare_records(read_golden(reference).records, read_golden(candidate).records, near_tie)
