"""Seeded fuzz of the repo config (``.github/drift-audit.toml``): mutated copies of this repository's own config,
both as data (wrong types, missing and unknown keys, duplicate ids, regexes and tree-sitter queries that do not
compile, hostile strings) and as text (a character inserted, the file cut short), and bytes that are not UTF-8.

Each either parses into a ``Config`` or raises ``ConfigError`` whose message names the file (and the line, when
the problem has one); never another exception, which the bot would retry as a crash and the CLI would print as
a traceback.
"""

from __future__ import annotations

import copy
import json
import random
import re
import tomllib
from pathlib import Path

from checks.config import ConfigError, load_config, parse_config
from tests.gitrepo import commit, init_repo

SEED = 6502
MUTANTS = 250
TEXT_MUTANTS = 120
SOURCE = ".github/drift-audit.toml@abc123"
CONFIG = (Path(__file__).resolve().parents[2] / ".github" / "drift-audit.toml").read_text()
WEIRD = ["", " ", "x" * 3000, 0, -1, 2**63 - 1, 1.5, True, [], [1, "a"], [""], {"a": 1}, {}, "((((", "(?P<key>",
         "(?P<key>a)(?P<key>b)", "[", "(identifier) @key", "(nonexistent_node) @key", "**/../../*", "/etc/passwd",
         "\u202e\u0000", "sm999", "sm90", "cpu", "error", "warning", "same-set", "arity", "pinned", "python", "cpp",
         "regex", "nope", ["sm90", "sm90"], ["**"], "a" * 200, "é😀", "{path}", "{nope}"]
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def _dump(data: dict) -> str:
    out: list[str] = []
    for name, value in data.items():
        if isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
            for entry in value:
                out.append(f"[[{_key(name)}]]")
                out += [f"{_key(k)} = {_value(v)}" for k, v in entry.items()]
                out.append("")
        elif isinstance(value, dict):
            out.append(f"[{_key(name)}]")
            out += [f"{_key(k)} = {_value(v)}" for k, v in value.items()]
            out.append("")
        else:
            out.insert(0, f"{_key(name)} = {_value(value)}")
    return "\n".join(out) + "\n"


def _mutate(data: dict, rng: random.Random) -> dict:
    d = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        table = rng.choice(["pillar", "fact", "rule", "suite", "settings"])
        op = rng.random()
        if table == "settings":
            d.setdefault("settings", {})[rng.choice(["fail_on", "max_file_bytes", "disable", "packs", "nope"])] = \
                copy.deepcopy(rng.choice(WEIRD))
            continue
        entries = d.setdefault(table, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            continue  # already written as a value by an earlier step
        if op < 0.08:
            d[table] = copy.deepcopy(rng.choice(WEIRD))  # the table written as a value
        elif op < 0.15 and entries:
            entries.append(copy.deepcopy(rng.choice(entries)))  # a duplicate id
        elif entries:
            entry = rng.choice(entries)
            key = rng.choice([*entry, "nope", "query", "regex", "files", "runners", "kind"])
            if rng.random() < 0.2:
                entry.pop(key, None)
            else:
                entry[key] = copy.deepcopy(rng.choice(WEIRD))
    return d


def _checked(text: str, source: str = SOURCE) -> str:
    """Parse; return "ok" or the error's message, after checking it names the file."""
    try:
        parse_config(text, source)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(source), message
        return message
    return "ok"


def test_mutated_configs_parse_or_say_where_and_why():
    rng = random.Random(SEED)
    data = tomllib.loads(CONFIG)
    assert _checked(_dump(data)) == "ok"  # the emitter writes what it read
    outcomes = {"ok": 0, "error": 0, "with line": 0}
    for _ in range(MUTANTS):
        mutant = _dump(_mutate(data, rng))
        message = _checked(mutant)  # any other exception fails the test
        if message == "ok":
            outcomes["ok"] += 1
            continue
        outcomes["error"] += 1
        outcomes["with line"] += bool(re.match(rf"{re.escape(SOURCE)}:\d+: ", message))
    assert outcomes["ok"] > 5 and outcomes["error"] > MUTANTS // 2, outcomes
    assert outcomes["with line"] > outcomes["error"] * 0.8, outcomes  # almost every error points at a line


def test_text_damage_is_a_config_error_with_the_line():
    rng = random.Random(SEED + 1)
    for _ in range(TEXT_MUTANTS):
        text = CONFIG
        at = rng.randrange(len(text))
        op = rng.random()
        if op < 0.4:
            text = text[:at] + rng.choice(['"', "'", "[", "]", "=", "\n", "\\", "{", "\x00", "é", "[[", "\t"]) + text[at:]
        elif op < 0.7:
            text = text[:at]  # cut short
        else:
            text = text[:at] + text[at + rng.randint(1, 40):]
        message = _checked(text)
        if "invalid TOML" in message:  # always a line, even for a file cut inside a string
            assert re.match(rf"{re.escape(SOURCE)}:\d+: invalid TOML", message), message


def test_a_config_that_is_not_utf8_names_the_file_and_the_byte(tmp_path):
    repo = init_repo(tmp_path / "r")
    sha = commit(repo, {"README.md": "x\n"}, "base")
    (repo / ".github").mkdir()
    (repo / ".github" / "drift-audit.toml").write_bytes(CONFIG.encode()[:200] + b"\xff\xfe" + CONFIG.encode()[200:])
    sha = commit(repo, {}, "config in latin-1")
    import git

    try:
        load_config(git.Repo(repo), sha)
    except ConfigError as exc:
        assert str(exc).startswith(f".github/drift-audit.toml@{sha[:12]}: not UTF-8 (byte 200)"), exc
    else:
        raise AssertionError("a config that is not UTF-8 loaded")
