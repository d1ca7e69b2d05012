"""same-set: the keys of N facts agree, e.g. every enum task has a name, a dispatch and a kernel.

Options:
  ignore     key globs never reported (``["*_BEGIN", "*_END"]``).
  exceptions ``{fact = ["KEY", ...]}``: keys that fact may lack.
  extra_ok   facts that may hold keys the others lack (e.g. a header that also
             includes common files); their extra keys are not reported.
  per_file   facts whose files are each compared on their own (one per-arch
             ``task_header.cuh`` missing an include is a finding even when
             another arch has it).

A finding's identity is the key; the places it is missing from are its state, so
adding the key to one of two missing places is "improved", not a new finding.
"""

from __future__ import annotations

from checks.config import Rule
from checks.model import Finding
from checks.rules.base import (
    Problem,
    Rows,
    RuleKind,
    by_key,
    check_options,
    facts_named,
    finding,
    keys_of,
    loc,
    need_facts,
)

OPTIONS = {"ignore": list, "exceptions": dict, "extra_ok": list, "per_file": list}


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS) or need_facts(rule, 2)
    if problem:
        return problem
    for key in ("extra_ok", "per_file"):
        problem = facts_named(rule, key, rule.options.get(key, []))
        if problem:
            return problem
    for f, keys in rule.options.get("exceptions", {}).items():
        problem = facts_named(rule, "exceptions", [f])
        if problem:
            return problem
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return "exceptions", f"exceptions for '{f}' must be a list of keys", f'write {f} = ["KEY"]'
    return None


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    opts = rule.options
    exceptions = {f: set(keys) for f, keys in opts.get("exceptions", {}).items()}
    extra_ok = set(opts.get("extra_ok", []))
    # Members: (label, fact id, rows by key). A per-file fact is one member per file.
    members: list[tuple[str, str, dict]] = []
    for f in rule.facts:
        if f in opts.get("per_file", []):
            files = sorted({r.path for r in rows.get(f, [])})
            for path in files:
                members.append((f"{f} ({path})", f, by_key([r for r in rows[f] if r.path == path])))
        else:
            members.append((f, f, by_key(rows.get(f, []))))
    out: list[Finding] = []
    for key in keys_of(rule, (m for _, _, m in members)):
        have = [(label, fid, m[key]) for label, fid, m in members if key in m]
        if all(fid in extra_ok for _, fid, _ in have):
            continue
        missing = [label for label, fid, m in members if key not in m and key not in exceptions.get(fid, set())]
        if not missing:
            continue
        present = ", ".join(label for label, _, _ in have)
        written = next((rs[0].written for _, _, rs in have if rs[0].written), "")
        name = f"'{written}' (compared as '{key}')" if written else f"'{key}'"
        detail = f"{name} is in {present} but missing from {', '.join(missing)}"
        locations = [loc(rs[0], f"{label} has '{rs[0].written or key}'") for label, _, rs in have]
        out.append(finding(rule, detail, locations, [key], missing=missing))
    return out


KIND = RuleKind("same-set", "the keys of N facts agree", validate, evaluate)
