"""The checks stage with inference: inferred rules join the config, co-change notes join the findings.

``run_checks`` is wrapped, not forked: inferred facts and rules are added to the
config it is given, so they are evaluated on base and head and classified by the
same engine as declared rules. ``[settings] infer`` (default: on when the config
declares no rule) and ``[settings] cochange`` (default: follows ``infer``) turn
the two parts on or off.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from checks.config import COCHANGE_RULE, Config
from checks.infer import calls
from checks.model import ChangeSet, Checkout, Findings, Unchecked

RunChecks = Callable[[Checkout, Config, ChangeSet], Findings]


def enabled(config: Config) -> tuple[bool, bool]:
    """(inference on, co-change on) for this config."""
    s = config.settings
    infer_on = getattr(s, "infer", None)
    if infer_on is None:
        infer_on = not config.rules
    cochange_on = getattr(s, "cochange", None)
    if cochange_on is None:
        cochange_on = bool(infer_on)
    if COCHANGE_RULE in s.disable:
        cochange_on = False
    return bool(infer_on), bool(cochange_on)


def _without(inferred: Any, off: set[str]) -> Any:
    """``[settings] disable`` names an inferred rule by the id its findings show: it does not run."""
    if not off or not any(r.id in off for r in inferred.rules):
        return inferred
    keep = [(r, line) for r, line in zip(inferred.rules, inferred.lines, strict=True) if r.id not in off]
    return replace(inferred, rules=[r for r, _ in keep], lines=[line for _, line in keep])


def with_inference(run: RunChecks) -> RunChecks:
    @functools.wraps(run)
    def run_checks(checkout: Checkout, config: Config, changes: ChangeSet) -> Findings:
        infer_on, cochange_on = enabled(config)
        if not infer_on and not cochange_on:
            return run(checkout, config, changes)
        from checks.factcache import cache_root as fact_cache_root
        from checks.infer import Inferred, declared_cover, infer, repo_cache_dir
        from checks.workspace import Tree

        s = config.settings
        base_sha = checkout.merge_base_sha or (changes.merge_base_sha if changes else "") or checkout.base_sha
        setting = getattr(s, "cache_dir", "") or ""
        # "off" (setting or $DRIFT_AUDIT_CACHE) disables the caches, as for the fact cache: not a directory named off
        cache_dir = None if fact_cache_root(setting) is None else repo_cache_dir(checkout.repo, setting)
        problems: list[Unchecked] = []
        inferred = Inferred()
        if infer_on:
            try:
                base = Tree(checkout.repo, base_sha)
                # Not verified here: the audit evaluates the base anyway, and a rule that reports
                # there is dropped below, so the check costs nothing extra.
                inferred = infer(
                    base, config.pillars, cache_dir=cache_dir, verify=False,
                    min_support=getattr(s, "infer_min_support", 4), severity=getattr(s, "infer_severity", "warning"),
                )
                inferred = declared_cover(config, inferred, base)
                inferred = _without(inferred, set(s.disable))
            except Exception as exc:  # inference is a bonus: its failure is reported, the declared rules still run
                problems.append(Unchecked("inference (checks/infer)", f"failed: {type(exc).__name__}: {exc}"))
                inferred = Inferred()
            if inferred.rules:
                config = replace(config, facts=config.facts + inferred.facts, rules=config.rules + inferred.rules)
        found = run(checkout, config, changes)
        # An inferred rule holds at base by construction; one that reported there (its fact read other
        # rows than mining saw) is not a belief of this code, and goes with all its findings.
        ours_rules = {r.id for r in inferred.rules}
        broken = {f.rule for f in found.findings if f.rule in ours_rules and f.status != "new"}
        if broken:
            found.findings = [f for f in found.findings if f.rule not in broken]
            found.rules_run = [r for r in found.rules_run if r not in broken]
        if ours_rules and any(f.rule in ours_rules for f in found.findings):
            from checks.infer.explain import explain

            found.findings = explain(found.findings, inferred.rules, inferred.facts, inferred.labels,
                                     Tree(checkout.repo, checkout.head_sha), Tree(checkout.repo, base_sha))
        ours = ours_rules | {f.id for f in inferred.facts}
        # A family whose file the PR deleted or renamed just is not checked; that is not a config problem.
        found.unchecked = [u for u in found.unchecked if not any(f"'{x}'" in u.entry for x in ours)] + problems
        ran = set(found.rules_run)
        found.inferred = [line for rule, line in zip(inferred.rules, inferred.lines) if rule.id in ran]
        found.inferred += _gone(inferred, ran, changes)
        if infer_on and not any(p.entry.startswith("inference") for p in problems):
            found.inference = base_sha  # the report can tell "nothing inferred" from "inference off"
        if infer_on and changes is not None and changes.files and calls.RULE_ID not in s.disable:
            found.findings += _calls(checkout, config, changes, base_sha, found)
        if cochange_on and changes is not None and changes.files:
            found.findings += _cochange(checkout, config, changes, base_sha, cache_dir, found)
        return found

    return run_checks


def _gone(inferred: Any, ran: set[str], changes: ChangeSet | None) -> list[str]:
    """Invariants that did not run because this PR deletes or renames a file holding one of their lists.

    That is no config problem and no drift (the list left with its file), but the review says so instead of
    acting as if nothing had been inferred.
    """
    if changes is None:
        return []
    moved: dict[str, str] = {}
    for fc in changes.files:
        if fc.status == "deleted":
            moved[fc.path] = f"deletes {fc.path}"
        elif fc.status == "renamed" and fc.old_path:
            moved[fc.old_path] = f"renames {fc.old_path} to {fc.path}"
    if not moved:
        return []
    files = {f.id: f.files for f in inferred.facts}
    out = []
    for rule, line in zip(inferred.rules, inferred.lines, strict=True):
        if rule.id in ran:
            continue
        why = sorted({moved[p] for fid in rule.facts for p in files.get(fid, []) if p in moved})
        if why:
            rid, _, what = line.partition(": ")  # the reason first: the comment clips long lines
            out.append(f"{rid}: not checked (this PR {' and '.join(why)}, which held one of its lists): {what}")
    return out


def _calls(checkout: Checkout, config: Config, changes: ChangeSet, base_sha: str, found: Findings) -> list:
    from checks.infer.rules import pillar_of

    try:
        return calls.findings(checkout.repo, changes, base_sha, checkout.head_sha,
                              pillar_of=lambda p: pillar_of(p, config.pillars),
                              severity=getattr(config.settings, "infer_severity", "warning"))
    except Exception as exc:  # a bonus like the rest of inference: its failure is reported, not fatal
        found.unchecked.append(Unchecked("call fit (checks/infer/calls.py)", f"failed: {type(exc).__name__}: {exc}"))
        return []


def _cochange(checkout: Checkout, config: Config, changes: ChangeSet, base_sha: str, cache_dir: Any,
              found: Findings) -> list:
    from checks import cochange
    from checks.infer.rules import pillar_of
    from checks.workspace import Tree

    s = config.settings
    try:
        exists = set(Tree(checkout.repo, checkout.head_sha).paths())
        return cochange.notes(
            checkout.repo, base_sha, changes, exists=exists,
            limit=getattr(s, "cochange_commits", 1000),
            min_support=getattr(s, "cochange_min_support", 10),
            min_confidence=getattr(s, "cochange_min_confidence", 0.9),
            severity=getattr(s, "cochange_severity", "warning"),
            cache_dir=cache_dir,
            pillar_of=lambda p: pillar_of(p, config.pillars),
        )
    except Exception as exc:
        found.unchecked.append(Unchecked("co-change history (checks/cochange.py)", f"failed: {type(exc).__name__}: {exc}"))
        return []


__all__ = ["with_inference", "enabled"]
