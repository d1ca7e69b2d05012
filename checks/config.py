"""The repo config, ``.github/drift-audit.toml``, always read from the base commit.

Reading it from the base means a PR cannot weaken its own audit. Validation
errors name the file, the line and the fix, because the person reading them is
editing TOML, not Python.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

CONFIG_PATH = ".github/drift-audit.toml"
DEFAULT_SOURCE = "built-in default (checks/default.toml)"

SEVERITIES = ("error", "warning", "note")
SUITE_KINDS = ("parity", "decode", "unit")
FACT_LANGS = ("python", "c", "cpp", "cuda", "regex", "path")


INFERRED_PREFIX = "inferred-"  # every inferred rule's id starts so (checks/infer/rules.py)
COCHANGE_RULE = "co-change"  # the rule id of co-change notes (checks/cochange.py)


class ConfigError(ValueError):
    """A config problem, already phrased as ``file:line: what is wrong; the fix``."""


@dataclass
class Pillar:
    id: str
    title: str
    paths: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)  # "path-glob::qualified-name-pattern"


@dataclass
class Fact:
    """Rows pulled out of code. Kind-specific keys stay in ``options`` for checks/facts.py."""

    id: str
    lang: str
    files: list[str]
    query: str | None = None  # tree-sitter query (lang python/c/cpp/cuda)
    regex: str | None = None  # regex (lang regex, or any lang)
    options: dict[str, Any] = field(default_factory=dict)
    line: int = 0


@dataclass
class Rule:
    id: str
    kind: str
    facts: list[str] = field(default_factory=list)
    pillar: str = "other"
    severity: str = "error"
    message: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # kind-specific, validated by the kind
    line: int = 0
    source: str = "declared"  # "declared" | "pack" | "inferred": copied onto each Finding
    evidence: list[str] = field(default_factory=list)  # inferred rules: support and example rows


@dataclass
class Suite:
    id: str
    kind: str
    command: str
    runners: list[str] = field(default_factory=lambda: ["cpu"])
    paths: list[str] = field(default_factory=list)
    pillars: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    requires: str | None = None  # e.g. "cc >= 12.0"
    timeout: float = 900.0
    golden: str | None = None  # decode suites: golden JSONL to compare the command's output with
    line: int = 0


FAIL_ON = ("new-error", "new-warning", "any-error", "never")


@dataclass
class Settings:
    run_all: list[str] = field(default_factory=list)  # path globs that select every suite
    import_graph: bool = True  # select pytest files whose imports reach a changed module
    # Test files wherever a repo keeps them (tests/, test/, unit_tests/, beside the code), as the tests pillar.
    test_paths: list[str] = field(default_factory=lambda: ["**/test_*.py", "**/*_test.py"])
    packs: list[str] = field(default_factory=list)  # built-in rule packs to include
    fail_on: str = "new-error"  # which findings fail the verdict (FAIL_ON)
    disable: list[str] = field(default_factory=list)  # rule ids (a pack's included) that do not run
    max_file_bytes: int = 2_000_000  # facts skip larger files (generated code), and say so
    quiet: list[str] = field(default_factory=list)  # path globs whose parse notes are not reported
    cache_dir: str = ""  # fact-row cache; default $DRIFT_AUDIT_CACHE or $XDG_CACHE_HOME/drift-audit
    gpu_runner: str = ""  # runner label for implicit test files whose imports need a GPU (runner/select.py)
    symbol_selection: bool = True  # select tests by the names a change touches, not only its modules
    runner_labels: list[str] = field(default_factory=list)  # [[suite]] runners beyond cpu and sm70..sm129
    # Inference (checks/infer) and co-change history (checks/cochange.py); docs/inference.md.
    infer: bool | None = None  # inferred rules; None: on when the config declares no rule
    infer_min_support: int = 4  # names a relation must hold at base to become a rule
    infer_severity: str = "warning"
    cochange: bool | None = None  # "likely missed" notes; None: follows infer
    cochange_commits: int = 1000  # history window
    cochange_min_support: int = 10  # past commits that changed both files (5 was noise in every replayed repo)
    cochange_min_confidence: float = 0.9  # share of A's commits that also changed B
    cochange_severity: str = "warning"  # "error" lets a missed co-change fail the check


@dataclass
class Config:
    pillars: list[Pillar]
    facts: list[Fact] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    suites: list[Suite] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    source: str = DEFAULT_SOURCE

    def pillar(self, pillar_id: str) -> Pillar | None:
        return next((p for p in self.pillars if p.id == pillar_id), None)


# --------------------------------------------------------------------------- parsing

_TOP_KEYS = {"pillar", "fact", "rule", "suite", "settings"}


class _Lines:
    """Finds the line of the n-th ``[[table]]`` and of keys inside it, for error messages."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers: dict[str, list[int]] = {}
        for i, raw in enumerate(self.lines, 1):
            m = re.match(r"\s*\[\[\s*([\w.-]+)\s*\]\]", raw) or re.match(r"\s*\[\s*([\w.-]+)\s*\]", raw)
            if m:
                self.headers.setdefault(m.group(1), []).append(i)

    def table(self, name: str, index: int) -> int:
        found = self.headers.get(name, [])
        return found[index] if index < len(found) else 0

    def assign(self, name: str) -> int:
        """The first line assigning ``name = ...`` (a table written as a key)."""
        pattern = re.compile(rf"\s*{re.escape(name)}\s*=")
        return next((i for i, raw in enumerate(self.lines, 1) if pattern.match(raw)), 0)

    def key(self, name: str, index: int, key: str) -> int:
        start = self.table(name, index)
        if not start:
            return 0
        for i in range(start, len(self.lines)):  # lines[start] is the line after the header
            if re.match(r"\s*\[", self.lines[i]):
                break
            if re.match(rf"\s*{re.escape(key)}\s*=", self.lines[i]):
                return i + 1
        return start


# cpu, or a GPU family by compute capability (sm70 … sm129, an optional letter: sm90a); a typo such as sm999
# would otherwise be "needs sm999" on every run, forever
RUNNER_LABEL = re.compile(r"cpu|sm(?:[7-9]\d|1[0-2]\d)[a-z]?")


def _closest(word: str, options: list[str] | tuple[str, ...]) -> str:
    import difflib

    match = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean '{match[0]}'?" if match else f"use one of: {', '.join(options)}"


class _Reader:
    def __init__(self, source: str, text: str):
        self.source = source
        self.where = _Lines(text)

    def fail(self, table: str, index: int, key: str | None, problem: str, fix: str) -> None:
        line = self.where.key(table, index, key) if key else self.where.table(table, index)
        at = f"{self.source}:{line}" if line else self.source
        entry = f"[[{table}]] #{index + 1}" + (f", key '{key}'" if key else "")
        raise ConfigError(f"{at}: {entry}: {problem}; {fix}")

    def str_list(self, table: str, index: int, entry: dict, key: str, required: bool = False) -> list[str]:
        value = entry.get(key, [])
        if isinstance(value, str):
            value = [value]
        if required and not value:
            self.fail(table, index, key, f"'{key}' is missing or empty", f'add {key} = ["..."]')
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(table, index, key, f"'{key}' must be a list of strings", f'write {key} = ["a", "b"]')
        return value

    def string(self, table: str, index: int, entry: dict, key: str, required: bool = True) -> str | None:
        value = entry.get(key)
        if value is None:
            if required:
                self.fail(table, index, None, f"missing required key '{key}'", f'add {key} = "..."')
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            self.fail(table, index, key, f"'{key}' must be a non-empty string", f'write {key} = "..."')
        return value

    def need(self, table: str, index: int, entry: dict, key: str) -> str:
        """A required non-empty string."""
        value = self.string(table, index, entry, key)
        assert value is not None  # string() raised otherwise
        return value

    def at(self, name: str) -> str:
        """``source:line`` of a top-level table or key, for errors about its shape."""
        return f"{self.source}:{self.where.table(name, 0) or self.where.assign(name) or 1}"

    def entries(self, data: dict, name: str) -> list[dict]:
        value = data.get(name, [])
        if isinstance(value, dict):
            raise ConfigError(f"{self.at(name)}: '{name}' must be an array of tables; write [[{name}]], not [{name}]")
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(
                f"{self.at(name)}: '{name}' must be an array of tables; write each entry as a [[{name}]] header "
                f"followed by its keys, not {name} = ..."
            )
        return value


def parse_config(text: str, source: str = CONFIG_PATH, *, include_default_pillars: bool = False) -> Config:
    """Parse and validate config text. Raises ConfigError naming file, line and fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+)", str(exc))
        # tomllib names no line when the text ends inside a value; the last line is where it was cut.
        line = at.group(1) if at else str(len(text.splitlines()) or 1) if "end of document" in str(exc) else None
        where = f"{source}:{line}" if line else source
        raise ConfigError(f"{where}: invalid TOML: {exc}; fix the syntax at that position") from None
    r = _Reader(source, text)
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"{source}:{r.where.table(key, 0) or 1}: unknown top-level key '{key}'; {_closest(key, sorted(_TOP_KEYS))}"
            )

    pillars: list[Pillar] = []
    for i, e in enumerate(r.entries(data, "pillar")):
        pid = r.need("pillar", i, e, "id")
        pillars.append(
            Pillar(
                id=pid,
                title=r.string("pillar", i, e, "title", required=False) or pid,
                paths=r.str_list("pillar", i, e, "paths"),
                symbols=r.str_list("pillar", i, e, "symbols"),
            )
        )
        for s in pillars[-1].symbols:
            if "::" not in s:
                r.fail("pillar", i, "symbols", f"symbol pattern '{s}' has no '::'", 'write "path-glob::qualified.name*"')
        unknown = set(e) - {"id", "title", "paths", "symbols"}
        if unknown:
            k = sorted(unknown)[0]
            r.fail("pillar", i, k, f"unknown key '{k}'", _closest(k, ["id", "title", "paths", "symbols"]))
    if not pillars or include_default_pillars:
        pillars = (pillars or []) + [p for p in default_config().pillars if p.id not in {q.id for q in pillars}]
    if not any(p.id == "other" for p in pillars):
        pillars.append(Pillar(id="other", title="Other", paths=[]))
    _unique(r, "pillar", [p.id for p in pillars])
    pillar_ids = [p.id for p in pillars]

    raw = data.get("settings", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{r.at('settings')}: 'settings' must be a table; write one [settings] header, not [[settings]]")
    settings = Settings()
    for key, value in raw.items():
        if not hasattr(settings, key):
            line = r.where.key("settings", 0, key)
            raise ConfigError(f"{source}:{line}: [settings] unknown key '{key}'; {_closest(key, list(vars(settings)))}")
        want = bool if key in ("infer", "cochange") else type(getattr(settings, key))  # optional booleans
        line = r.where.key("settings", 0, key)
        if type(value) is not want or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            shape = "a list of strings" if want is list else want.__name__
            raise ConfigError(f"{source}:{line}: [settings] '{key}' must be {shape}; fix its value")
        if key == "fail_on" and value not in FAIL_ON:
            raise ConfigError(f"{source}:{line}: [settings] fail_on '{value}' is unknown; {_closest(str(value), FAIL_ON)}")
        if key == "max_file_bytes" and value <= 0:
            raise ConfigError(f"{source}:{line}: [settings] max_file_bytes must be positive; write max_file_bytes = 2000000")
        setattr(settings, key, value)
    facts: list[Fact] = []
    for i, e in enumerate(r.entries(data, "fact")):
        fid = r.need("fact", i, e, "id")
        lang = r.string("fact", i, e, "lang", required=False) or ("regex" if "regex" in e else "")
        if lang not in FACT_LANGS:
            r.fail("fact", i, "lang", f"unknown lang '{lang}'", _closest(lang, FACT_LANGS))
        query = r.string("fact", i, e, "query", required=False)
        if query:
            query_problem = _lint_query(query)
            if query_problem:
                r.fail("fact", i, "query", query_problem, "see docs/rules.md#when-a-fact-cannot-run")
        regex = r.string("fact", i, e, "regex", required=False)
        if lang == "path" and (query or regex):
            r.fail("fact", i, "lang", "a lang 'path' fact's rows are the files its globs select; it takes no query or regex",
                   "remove query/regex, or set lang to the language")
        if not query and not regex and lang != "path":
            r.fail("fact", i, None, "a fact needs 'query' (tree-sitter) or 'regex'", 'add query = "(...) @key"')
        if lang == "regex" and not regex:
            r.fail("fact", i, "lang", "lang 'regex' needs a 'regex' key", 'add regex = "..." or set lang to the language')
        if regex:
            try:
                re.compile(regex, re.M)
            except re.error as exc:
                r.fail("fact", i, "regex", f"regex does not compile: {exc}", "fix the pattern (Python re syntax)")
        known = {"id", "lang", "files", "query", "regex"}
        facts.append(
            Fact(
                id=fid,
                lang=lang,
                files=r.str_list("fact", i, e, "files", required=True),
                query=query,
                regex=regex,
                options={k: v for k, v in e.items() if k not in known},
                line=r.where.table("fact", i),
            )
        )
    for i, fact in enumerate(facts):
        problem = _validate_fact(fact)
        if problem:
            r.fail("fact", i, None, problem, "see docs/rules.md#facts for the options")
    _unique(r, "fact", [f.id for f in facts])
    pack_facts, pack_rules = _packs(settings.packs, source, f"{source}:{r.where.key('settings', 0, 'packs') or 1}")
    facts += [f for f in pack_facts if f.id not in {x.id for x in facts}]
    fact_ids = [f.id for f in facts]

    rules: list[Rule] = []
    for i, e in enumerate(r.entries(data, "rule")):
        rid = r.need("rule", i, e, "id")
        kind = r.need("rule", i, e, "kind")
        kinds = _rule_kinds()
        if kinds and kind not in kinds:
            r.fail("rule", i, "kind", f"unknown rule kind '{kind}'", _closest(kind, sorted(kinds)))
        used = r.str_list("rule", i, e, "facts")
        for f in used:
            if f not in fact_ids:
                r.fail("rule", i, "facts", f"fact '{f}' is not defined", _closest(f, fact_ids) if fact_ids else "add a [[fact]] with that id")
        pillar = r.string("rule", i, e, "pillar", required=False) or "other"
        if pillar not in pillar_ids:
            r.fail("rule", i, "pillar", f"unknown pillar '{pillar}'", _closest(pillar, pillar_ids))
        severity = r.string("rule", i, e, "severity", required=False) or "error"
        if severity not in SEVERITIES:
            r.fail("rule", i, "severity", f"unknown severity '{severity}'", _closest(severity, SEVERITIES))
        known = {"id", "kind", "facts", "pillar", "severity", "message"}
        rule = Rule(
            id=rid,
            kind=kind,
            facts=used,
            pillar=pillar,
            severity=severity,
            message=r.string("rule", i, e, "message", required=False),
            options={k: v for k, v in e.items() if k not in known},
            line=r.where.table("rule", i),
        )
        rule_problem = _validate_rule(rule)
        if rule_problem:
            bad_key, text, fix = rule_problem
            r.fail("rule", i, bad_key, text, fix)
        rules.append(rule)
    _unique(r, "rule", [x.id for x in rules])
    _check_fields(r, rules, facts)

    suites: list[Suite] = []
    for i, e in enumerate(r.entries(data, "suite")):
        sid = r.need("suite", i, e, "id")
        kind = r.need("suite", i, e, "kind")
        if kind not in SUITE_KINDS:
            r.fail("suite", i, "kind", f"unknown suite kind '{kind}'", _closest(kind, SUITE_KINDS))
        runners = r.str_list("suite", i, e, "runners") or ["cpu"]
        for lbl in runners:
            if not (RUNNER_LABEL.fullmatch(lbl) or lbl in settings.runner_labels):
                labels = ["cpu", "sm80", "sm90", "sm100", "sm120", *settings.runner_labels]
                r.fail("suite", i, "runners", f"unknown runner label '{lbl}'",
                       f"{_closest(lbl, labels)} (a label of your own: list it in [settings] runner_labels)")
        pls = r.str_list("suite", i, e, "pillars")
        for p in pls:
            if p not in pillar_ids:
                r.fail("suite", i, "pillars", f"unknown pillar '{p}'", _closest(p, pillar_ids))
        timeout = e.get("timeout", 900)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            r.fail("suite", i, "timeout", "timeout must be a positive number of seconds", "write timeout = 600")
        requires = r.string("suite", i, e, "requires", required=False)
        if requires and not re.fullmatch(r"\s*cc\s*(>=|<=|==|>|<)\s*\d+(\.\d+)?\s*", requires):
            r.fail("suite", i, "requires", f"cannot read requirement '{requires}'", 'write requires = "cc >= 12.0"')
        unknown = set(e) - {"id", "kind", "command", "runners", "paths", "pillars", "symbols", "requires", "timeout", "golden"}
        if unknown:
            k = sorted(unknown)[0]
            r.fail("suite", i, k, f"unknown key '{k}'", "remove it or check the spelling")
        suites.append(
            Suite(
                id=sid,
                kind=kind,
                command=r.need("suite", i, e, "command"),
                runners=runners,
                paths=r.str_list("suite", i, e, "paths"),
                pillars=pls,
                symbols=r.str_list("suite", i, e, "symbols"),
                requires=requires,
                timeout=float(timeout),
                golden=r.string("suite", i, e, "golden", required=False),
                line=r.where.table("suite", i),
            )
        )
    _unique(r, "suite", [s.id for s in suites])

    known = {x.id for x in rules}
    for x in pack_rules:  # a pack rule whose pillar this repo does not declare reports under "other"
        if x.id not in known:
            rules.append(replace(x, source="pack", pillar=x.pillar if x.pillar in pillar_ids else "other"))
    all_ids = [x.id for x in rules]
    for rid in settings.disable:  # inferred ids and co-change exist only at audit time: checks/infer/hook.py drops them
        if rid not in all_ids and not rid.startswith(INFERRED_PREFIX) and rid != COCHANGE_RULE:
            line = r.where.key("settings", 0, "disable")
            raise ConfigError(f"{source}:{line}: [settings] disable: no rule '{rid}'; {_closest(rid, all_ids)}")
    rules = [x for x in rules if x.id not in settings.disable]
    return Config(pillars=pillars, facts=facts, rules=rules, suites=suites, settings=settings, source=source)


def _check_fields(r: _Reader, rules: list[Rule], facts: list[Fact]) -> None:
    """Every FACT.FIELD a rule reads must be a field of that fact: a misspelled one would
    otherwise read as absent and the rule would silently find nothing."""
    try:
        from checks.facts import fields_of
        from checks.rules import REGISTRY
    except ImportError:
        return
    by_id = {f.id: f for f in facts}
    for i, rule in enumerate(rules):
        kind = REGISTRY.get(rule.kind)
        if kind is None or kind.refs is None:
            continue
        try:
            used = kind.refs(rule)
        except Exception:  # the kind's validate already reported unreadable options
            continue
        for option, fid, fld in used:
            fields = fields_of(by_id[fid]) if fid in by_id else None
            if fields is not None and fld not in fields:
                default = "" if option in rule.options else f" (the default of '{option}')"
                r.fail("rule", i, option if option in rule.options else None,
                       f"'{option}' reads '{fid}.{fld}'{default}, but fact '{fid}' has no field '{fld}' "
                       f"(its fields: {', '.join(sorted(fields))})",
                       _closest(fld, sorted(fields)) if option in rule.options else f"set {option} = \"...\" to one of them")


def _unique(r: _Reader, table: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for i, x in enumerate(ids):
        if x in seen:
            r.fail(table, i, "id", f"duplicate id '{x}'", "give each entry its own id")
        seen.add(x)


def _rule_kinds() -> set[str]:
    """Rule kinds the checks registry knows; empty while the registry is not importable."""
    try:
        from checks.rules import REGISTRY
    except ImportError:
        return set()
    return set(REGISTRY)


def _validate_rule(rule: Rule) -> tuple[str | None, str, str] | None:
    """Ask the rule kind to validate its own options: (key, problem, fix), or None."""
    try:
        from checks.rules import REGISTRY
    except ImportError:
        return None
    kind = REGISTRY.get(rule.kind)
    validate = getattr(kind, "validate", None)
    return validate(rule) if validate else None


def _lint_query(text: str) -> str | None:
    try:
        from checks.facts import lint_query
    except ImportError:
        return None
    return lint_query(text)


def _validate_fact(fact: Fact) -> str | None:
    """The fact extractor's own option check, phrased for the config error; None when fine."""
    try:
        from checks.facts import FactError, validate_options
    except ImportError:
        return None
    try:
        validate_options(fact)
    except FactError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


@lru_cache(maxsize=16)
def _pack_config(name: str) -> Config:
    """A built-in pack, parsed once per process (its text never changes while it runs)."""
    text = resources.files("checks.packs").joinpath(f"{name}.toml").read_text()
    return parse_config(text, f"rule pack '{name}'", include_default_pillars=True)


def _packs(names: list[str], source: str, at: str = "") -> tuple[list[Fact], list[Rule]]:
    """Facts and rules of the built-in rule packs named in [settings] packs (checks/packs/<name>.toml)."""
    facts: list[Fact] = []
    rules: list[Rule] = []
    for name in names:
        try:
            pack = _pack_config(name)
        except (FileNotFoundError, ModuleNotFoundError):
            known = sorted(p.name[:-5] for p in resources.files("checks.packs").iterdir() if p.name.endswith(".toml"))
            raise ConfigError(
                f"{at}: [settings] packs: unknown rule pack '{name}'; {_closest(name, known)} (docs/rules.md)"
            ) from None
        facts += pack.facts
        rules += pack.rules
    return facts, rules


def default_config() -> Config:
    text = resources.files("checks").joinpath("default.toml").read_text()
    cfg = parse_config(text, DEFAULT_SOURCE)
    cfg.source = DEFAULT_SOURCE
    return cfg


def load_config(repo: Any, commit: str) -> Config:
    """Read the config from ``commit``'s git objects (a git.Repo and a sha), or the built-in default."""
    try:
        blob = repo.commit(commit).tree / CONFIG_PATH
    except KeyError:
        return default_config()
    raw = blob.data_stream.read()
    short = repo.commit(commit).hexsha[:12]
    source = f"{CONFIG_PATH}@{short}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 (byte {exc.start}); save the file as UTF-8") from None
    return parse_config(text, source)
