"""Config mistakes are errors naming file:line, the entry and the fix, never a traceback; and the
settings that shape which rules run (packs, disable, fail_on) do what docs/rules.md says."""

from __future__ import annotations

import random
import re

import pytest

from checks.config import ConfigError, parse_config
from checks.packs import sample as shape

FACTS = '''
[[fact]]
id = "calls"
lang = "python"
files = ["*.py"]
query = "(call function: (identifier) @key arguments: (argument_list) @n)"
len = ["n"]

[[fact]]
id = "params"
lang = "cpp"
files = ["*.cc"]
query = "(function_declarator declarator: (identifier) @key parameters: (parameter_list) @nparams)"
len = ["nparams"]
'''


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "cfg.toml")
    return str(exc.value)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_misspelled_field_reference_is_an_error_with_did_you_mean():
    text = FACTS + '\n[[rule]]\nid = "arity"\nkind = "join-equal"\nfacts = ["calls", "params"]\nequal = ["calls.n", "params.nparamz"]\n'
    msg = error_of(text)
    assert msg.startswith(f"cfg.toml:{line_of(text, 'equal =')}: [[rule]] #1, key 'equal'")
    assert "fact 'params' has no field 'nparamz'" in msg and "did you mean 'nparams'?" in msg


def test_default_field_that_the_fact_lacks_is_an_error():
    text = FACTS + '\n[[rule]]\nid = "p"\nkind = "pinned"\nfacts = ["calls"]\nvalue = "1"\n'
    msg = error_of(text)
    assert "'calls.value' (the default of 'field')" in msg and 'set field = "..."' in msg


def test_predicate_outside_its_pattern_is_an_error():
    text = FACTS.replace(
        'query = "(call function: (identifier) @key arguments: (argument_list) @n)"',
        'query = \'(call function: (identifier) @key arguments: (argument_list) @n) (#eq? @key "op")\'',
    )
    msg = error_of(text)
    assert msg.startswith(f"cfg.toml:{line_of(text, '#eq?')}: [[fact]] #1, key 'query'")
    assert "outside its pattern's parentheses" in msg and "move it inside" in msg


def test_single_backslash_regex_escape_in_a_query_is_an_error():
    text = FACTS.replace(
        'query = "(call function: (identifier) @key arguments: (argument_list) @n)"',
        'query = "(call function: (identifier) @key arguments: (argument_list) @n (#match? @key \\"^\\\\w+_op$\\"))"',
    )
    assert "\\w+_op" in text  # the query text holds one backslash: the query language reads it as 'w'
    msg = error_of(text)
    assert "'\\w' in a string" in msg and "double the backslash" in msg and msg.startswith("cfg.toml:")
    fixed = text.replace("\\\\w+_op", "\\\\\\\\w+_op")
    assert parse_config(fixed, "cfg.toml").facts[0].query.count("\\\\w") == 1


def test_pack_rules_run_under_other_when_their_pillar_is_not_declared_and_carry_source_pack():
    text = '[[pillar]]\nid = "mine"\npaths = ["src/**"]\n\n[settings]\npacks = ["persistent_kernel"]\n'
    config = parse_config(text, "cfg.toml")
    pack = [r for r in config.rules if r.id.startswith("pk-")]
    assert pack and all(r.pillar == "other" and r.source == "pack" for r in pack)


def test_disable_and_same_id_override_of_pack_rules():
    text = (
        '[settings]\npacks = ["persistent_kernel"]\ndisable = ["pk-metadata-bare-operand"]\n\n'
        '[[rule]]\nid = "pk-dispatch-name"\nkind = "same-set"\nfacts = ["pk_enum_tasks", "pk_name_map"]\nseverity = "warning"\n'
    )
    rules = {r.id: r for r in parse_config(text, "cfg.toml").rules}
    assert "pk-metadata-bare-operand" not in rules
    assert rules["pk-dispatch-name"].severity == "warning" and rules["pk-dispatch-name"].source == "declared"
    msg = error_of(text.replace('disable = ["pk-metadata-bare-operand"]', 'disable = ["pk-metadata-bare-opernd"]'))
    assert msg.startswith("cfg.toml:3: [settings] disable: no rule 'pk-metadata-bare-opernd'")
    assert "did you mean 'pk-metadata-bare-operand'?" in msg


@pytest.mark.parametrize(
    "setting, needle",
    [
        ('fail_on = "new-errors"', "did you mean 'new-error'?"),
        ("fail_on = 1", "'fail_on' must be str"),
        ("max_file_bytes = 0", "max_file_bytes must be positive"),
        ('quiet = "third_party/**"', "'quiet' must be a list of strings"),
        ("packs = [1]", "'packs' must be a list of strings"),
    ],
)
def test_bad_settings(setting, needle):
    msg = error_of(f"[settings]\n{setting}\n")
    assert msg.startswith("cfg.toml:2: [settings]") and needle in msg


def test_fail_on_reaches_the_findings():
    from checks.model import Finding, Findings

    f = Finding("r", "other", "warning", "m")
    assert parse_config('[settings]\nfail_on = "new-warning"\n').settings.fail_on == "new-warning"
    assert Findings([f], fail_on="new-warning").failing == [f] and Findings([f]).failing == []


# --------------------------------------------------------------------------- fuzz

SEED_CONFIG = shape.CONFIG + '''
[[suite]]
id = "unit"
kind = "unit"
command = "pytest -q"
runners = ["cpu", "sm90"]
paths = ["src/**"]
timeout = 600

'''

VALUES = ['["sm90"]', "5", "-1", "0.5", "true", '""', '"x"', "{ a = 1 }", "[1, 2]", '[["a"]]', "[]", "{}",
          '"(call) @key"', '"(unclosed"', '"[[x]]"', "[{ a = 1 }]", '"join-equal"', '"no_such"', '"**"']


def _mutate(lines: list[str], rng: random.Random) -> list[str]:
    out = list(lines)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(out))
        line = out[i]
        op = rng.random()
        m = re.match(r"^(\s*[\w.-]+\s*=\s*)(.*)$", line)
        if m and op < 0.55:
            out[i] = m.group(1) + rng.choice(VALUES)  # a wrong type or value for the key
        elif m and op < 0.7:
            out[i] = rng.choice(["id", "kind", "facts", "files", "lang", "query", "suite", "pillar", "rule",
                                 "fact", "settings", "equal", "range", "scope", "count", "key"]) + " = " + m.group(2)
        elif op < 0.8:
            del out[i]  # a missing key or table header
        elif op < 0.9 and line.startswith("[["):
            out[i] = line.replace("[[", "[").replace("]]", "]")  # bad nesting
        else:
            out.insert(i, rng.choice(["[[suite]]", "[[rule]]", "[[fact]]", "[settings]", "[[pillar]]", 'suite = ["sm90"]',
                                      "rule = 5", "fact = { id = 1 }", "[rule.x]", "[[settings]]"]))
    return out


def test_fuzzed_configs_give_config_errors_with_file_and_line_never_a_crash():
    rng = random.Random(1411)
    lines = SEED_CONFIG.splitlines()
    parse_config(SEED_CONFIG, "cfg.toml")  # the seed itself is valid
    errors = accepted = 0
    for _ in range(2500):
        text = "\n".join(_mutate(lines, rng)) + "\n"
        try:
            parse_config(text, "cfg.toml")
            accepted += 1
        except ConfigError as exc:
            errors += 1
            msg = str(exc)
            assert re.match(r"^cfg\.toml(:\d+)?: \S", msg), msg
            if "invalid TOML" not in msg:
                assert re.match(r"^cfg\.toml:\d+: ", msg), (msg, text)
    assert errors > 1000 and accepted > 100, (errors, accepted)
