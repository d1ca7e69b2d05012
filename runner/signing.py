"""Signed GPU results: the recording step HMACs results.json, the collector refuses what it cannot verify.

The tested code runs on the same machine as the step that uploads its
results, so anything it can write it can forge. What it cannot do is compute
a MAC under a key it never sees. Each dispatch has its own key,

    dispatch key = HMAC-SHA256(repo key, "drift-audit dispatch v1" | repo | audit id | label | head sha)
    repo key     = HMAC-SHA256(bot key,  "drift-audit repo key v1" | repo)

The bot holds ``DRIFT_AUDIT_RESULTS_KEY`` (the bot key); each repository's
Actions secret ``DRIFT_AUDIT_RESULTS_KEY`` holds its repo key (print it with
``python -m runner.signing repo-key OWNER/NAME``). Only the recording step
names that secret, after the tested code's step has ended; the dispatch key
is derived there and never written down. ``results.sig`` binds the MAC to the
dispatch and to the SHA-256 of the exact results.json bytes.

``record`` also refuses results that cannot be what ``runner.execute`` saw:
other audit, head or label; suites missing, repeated or not in the plan; or
"nothing failed" when runner.execute's step did not succeed. Those become
``error`` rows, signed, so a forged "passed" is reported as tampering rather
than dropped.

Standard library only, and runnable as a script (``python -I runner/signing.py``)
so the recording step can run isolated from anything the workspace holds.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

ENV_KEY = "DRIFT_AUDIT_RESULTS_KEY"
SIG_FILE = "results.sig"
VERSION = 1
FAILED = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}
# a command that runs pytest (runner.local asks it too; this module is standard library only, so it holds it)
PYTEST = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?(?:pytest|py\.test)(?:\s|$)|python[\d.]*\s+-m\s+pytest\b")


class SignatureError(ValueError):
    """The results are unsigned, signed for another dispatch, or altered after signing."""


@dataclass(frozen=True)
class Dispatch:
    """What one workflow_dispatch was for; every field is bound into its key and its signature."""

    repo: str
    audit_id: str
    label: str
    head_sha: str

    def fields(self) -> list[str]:
        return [self.repo, self.audit_id, self.label, self.head_sha]


def _mac(key: bytes, *parts: str) -> bytes:
    return hmac.new(key, "\x00".join(parts).encode(), hashlib.sha256).digest()


def repo_key(bot_key: str | bytes, repo: str) -> bytes:
    """The key a repository's Actions secret holds: one repo's secret does not sign for another."""
    raw = bot_key.encode() if isinstance(bot_key, str) else bot_key
    if not raw:
        raise SignatureError(f"no results key: set {ENV_KEY} on the bot (and each repo's Actions secret)")
    return _mac(raw, "drift-audit repo key v1", repo)


def dispatch_key(key_of_repo: bytes, dispatch: Dispatch) -> bytes:
    return _mac(key_of_repo, "drift-audit dispatch v1", *dispatch.fields())


def sign(results: bytes, key_of_repo: bytes, dispatch: Dispatch) -> bytes:
    """``results.sig`` for these exact results.json bytes."""
    digest = hashlib.sha256(results).hexdigest()
    mac = _mac(dispatch_key(key_of_repo, dispatch), "results", digest).hex()
    sig = {"v": VERSION, "alg": "hmac-sha256", **dict(zip(("repo", "audit_id", "label", "head_sha"),
                                                          dispatch.fields(), strict=True)),
           "sha256": digest, "mac": mac}
    return (json.dumps(sig, indent=2) + "\n").encode()


def verify(results: bytes, signature: bytes | None, key_of_repo: bytes, dispatch: Dispatch) -> None:
    """Raise ``SignatureError`` unless ``signature`` is this dispatch's MAC over ``results``."""
    if signature is None:
        raise SignatureError(f"the artifact has no {SIG_FILE}: results not recorded by the workflow's signing step")
    try:
        sig = json.loads(signature)
    except (ValueError, UnicodeDecodeError):
        raise SignatureError(f"{SIG_FILE} is not JSON") from None
    if not isinstance(sig, dict) or sig.get("v") != VERSION or not isinstance(sig.get("mac"), str):
        raise SignatureError(f"{SIG_FILE} is not a version {VERSION} signature")
    for name, want in zip(("repo", "audit_id", "label", "head_sha"), dispatch.fields(), strict=True):
        if sig.get(name) != want:
            raise SignatureError(f"{SIG_FILE} is for {name} {sig.get(name)!r}, not {want!r}")
    expected = _mac(dispatch_key(key_of_repo, dispatch), "results", hashlib.sha256(results).hexdigest()).hex()
    if not hmac.compare_digest(expected, sig["mac"]):
        raise SignatureError("the results do not match their signature (altered, or signed with another key)")


# --------------------------------------------------------------------------- the recording step


def _suite_rows(plan: dict, label: str) -> list[tuple[str, str]]:
    return sorted((s["id"], s["runner"]) for s in plan.get("suites", []) if s.get("runner") == label)


def checked_results(raw: bytes | None, plan: dict, dispatch: Dispatch, suites_outcome: str) -> tuple[dict, list[str]]:
    """The results to sign, and the problems found. A problem replaces the suites' rows with ``error`` rows
    that say what was wrong, so the comment shows tampering instead of a pass."""
    expected = _suite_rows(plan, dispatch.label)
    problems: list[str] = []
    data: Any = None
    if raw is None:
        problems.append("runner.execute wrote no results")
    else:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            problems.append("results.json is not JSON")
    if isinstance(data, dict):
        if data.get("audit_id") != dispatch.audit_id or data.get("head_sha") != dispatch.head_sha:
            problems.append(f"results are for {data.get('audit_id')!r} at {str(data.get('head_sha'))[:12]!r}")
        listed = data.get("suites")
        suites: list = listed if isinstance(listed, list) else []
        rows = sorted((str(s.get("suite")), str(s.get("runner"))) for s in suites if isinstance(s, dict))
        if rows != expected:
            problems.append(f"results list suites {rows}, the plan has {expected}")
        failed = any(isinstance(s, dict) and s.get("outcome") in FAILED for s in suites)
        if suites_outcome != "success" and not failed:
            problems.append(f"runner.execute's step ended '{suites_outcome}' but the results report no failure")
        if suites_outcome == "success" and failed:
            problems.append("runner.execute's step succeeded but the results report a failure")
        commands = {(str(s.get("id")), str(s.get("runner"))): str(s.get("command", "")) for s in plan.get("suites", [])
                    if isinstance(s, dict)}
        silent = sorted(str(s.get("suite")) for s in suites if isinstance(s, dict) and s.get("outcome") == "passed"
                        and not s.get("cases")
                        and PYTEST.search(commands.get((str(s.get("suite")), str(s.get("runner"))), "")))
        if silent:  # pytest always reports its cases: none means it never wrote its report (os._exit(0) in a
            # conftest.py of the head: the process "succeeds" having run nothing)
            problems.append(f"pytest suite(s) {', '.join(silent)} passed without reporting a single test case")
    elif data is not None:
        problems.append("results.json is not a Results object")
    if not problems:
        return data, []
    reason = "results refused by the recording step: " + "; ".join(problems)
    refused = [{"suite": sid, "runner": runner, "outcome": "error", "duration": 0.0, "reason": reason}
               for sid, runner in expected]
    return {"audit_id": dispatch.audit_id, "head_sha": dispatch.head_sha, "suites": refused, "devices": []}, problems


def record(raw_path: str, plan_path: str, out_dir: str, dispatch: Dispatch, suites_outcome: str,
           key_of_repo: bytes) -> list[str]:
    """Write ``out_dir``/results.json and results.sig; return the problems found (empty when clean)."""
    try:
        with open(raw_path, "rb") as fh:
            raw: bytes | None = fh.read(64 * 1024 * 1024)
    except OSError:
        raw = None
    with open(plan_path, "rb") as fh:
        plan = json.loads(fh.read())
    if isinstance(plan, dict) and "plan" in plan and "audit_id" not in plan:
        plan = plan["plan"]
    results, problems = checked_results(raw, plan, dispatch, suites_outcome)
    body = raw if not problems and raw is not None else (json.dumps(results, indent=2) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "wb") as fh:
        fh.write(body)
    with open(os.path.join(out_dir, SIG_FILE), "wb") as fh:
        fh.write(sign(body, key_of_repo, dispatch))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -I runner/signing.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="check runner.execute's results and sign them (the recording step)")
    for name in ("--raw", "--plan", "--out", "--repo", "--audit-id", "--label", "--head-sha", "--outcome"):
        rec.add_argument(name, required=True)
    rk = sub.add_parser("repo-key", help=f"print the Actions secret {ENV_KEY} for one repository")
    rk.add_argument("repo", help="OWNER/NAME")
    args = parser.parse_args(argv)
    secret = os.environ.get(ENV_KEY, "")
    if not secret:
        print(f"error: {ENV_KEY} is not set", file=sys.stderr)
        return 2
    if args.command == "repo-key":
        print(repo_key(secret, args.repo).hex())
        return 0
    try:
        key_of_repo = bytes.fromhex(secret)
    except ValueError:
        key_of_repo = b""
    if len(key_of_repo) != 32:
        print(f"error: {ENV_KEY} must be the repository's key as printed by `repo-key` (64 hex digits)",
              file=sys.stderr)
        return 2
    dispatch = Dispatch(args.repo, args.audit_id, args.label, args.head_sha)
    problems = record(args.raw, args.plan, args.out, dispatch, args.outcome, key_of_repo)
    for p in problems:
        print(f"::error::{p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
