"""Repo config: validation names file, line and fix; the base commit's config always wins."""

import pytest

from checks.config import ConfigError, default_config, load_config, parse_config
from checks.workspace import open_repo


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, ".github/drift-audit.toml")
    return str(info.value)


def test_default_has_the_four_checklist_pillars_tests_and_other():
    ids = [p.id for p in default_config().pillars]
    assert ids == ["weights", "topology", "wiring", "runtime", "tests", "other"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[pillar]]\nid = "a"\npaths = ["x/**"]\nglobs = ["y"]\n', ".github/drift-audit.toml:4: [[pillar]] #1, key 'globs'"),
        ('[[pillar]]\nid = "a"\nsymbols = ["no-separator"]\n', "has no '::'"),
        ('[[suite]]\nid = "s"\nkind = "parity"\ncommand = "pytest"\nrunners = ["h100"]\n', ":5: [[suite]] #1, key 'runners'"),
        ('[[suite]]\nid = "s"\nkind = "parity"\ncommand = "pytest"\ntimeout = -1\n', "timeout must be a positive"),
        ('[[suite]]\nid = "s"\nkind = "parity"\ncommand = "pytest"\nrequires = "arch is hopper"\n', 'write requires = "cc >= 12.0"'),
        ('[[suite]]\nid = "s"\nkind = "parity"\n', "missing required key 'command'"),
        ('[[fact]]\nid = "f"\nlang = "rust"\nfiles = ["a"]\nquery = "(x)"\n', "unknown lang 'rust'"),
        ('[[fact]]\nid = "f"\nlang = "cpp"\nfiles = ["a"]\n', "needs 'query'"),
        ('[[fact]]\nid = "f"\nlang = "regex"\nfiles = ["a"]\nregex = "("\n', "regex does not compile"),
        ('[[rule]]\nid = "r"\nkind = "same-set"\nfacts = ["missing"]\n', "fact 'missing' is not defined"),
        ('[[rule]]\nid = "r"\nkind = "same-set"\npillar = "wirng"\n', "did you mean 'wiring'?"),
        ("[pillar]\nid = 'x'\n", "write [[pillar]], not [pillar]"),
        ("[[pillar]\n", "invalid TOML"),
        ('[[pillar]]\nid = "a"\npaths = \'\'\'x/**\n', ".github/drift-audit.toml:3: invalid TOML"),  # cut in a string
        ("[settings]\nrun_al = []\n", "did you mean 'run_all'?"),
        ('[[suite]]\nid = "a"\nkind = "unit"\ncommand = "x"\n[[suite]]\nid = "a"\nkind = "unit"\ncommand = "y"\n', "duplicate id 'a'"),
    ],
)
def test_validation_errors_name_line_and_fix(text, expected):
    message = error_of(text)
    assert expected in message
    assert message.startswith(".github/drift-audit.toml")
    assert ";" in message  # every message carries a fix after the problem


def test_user_pillars_get_other_added():
    cfg = parse_config('[[pillar]]\nid = "kernels"\npaths = ["kernels/**"]\n')
    assert [p.id for p in cfg.pillars] == ["kernels", "other"]


def test_config_is_read_from_the_base_commit(repo):
    repo.write(".github/drift-audit.toml", '[[pillar]]\nid = "strict"\npaths = ["**"]\n')
    base = repo.commit("base config")
    # The PR tries to weaken its own audit, and the work tree holds something else again.
    repo.write(".github/drift-audit.toml", '[[pillar]]\nid = "weak"\npaths = []\n')
    head = repo.commit("weaken")
    repo.write(".github/drift-audit.toml", "not toml at all [[[")
    git_repo = open_repo(repo.root)
    cfg = load_config(git_repo, base)
    assert [p.id for p in cfg.pillars] == ["strict", "other"]
    assert cfg.source == f".github/drift-audit.toml@{base[:12]}"
    assert [p.id for p in load_config(git_repo, head).pillars] == ["weak", "other"]


def test_missing_config_means_builtin_default(repo):
    repo.write("a.py", "x = 1\n")
    sha = repo.commit("no config")
    cfg = load_config(open_repo(repo.root), sha)
    assert cfg.source.startswith("built-in default")


def test_non_utf8_config_is_a_clear_error(repo):
    repo.write(".github/drift-audit.toml", b"# caf\xe9\n")
    sha = repo.commit("latin-1 config")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(open_repo(repo.root), sha)


def test_repo_rules_may_use_pack_facts():
    cfg = parse_config(
        '[settings]\npacks = ["persistent_kernel"]\n'
        '[[rule]]\nid = "mine"\nkind = "same-set"\nfacts = ["pk_enum_tasks", "pk_name_map"]\n'
    )
    assert "mine" in [r.id for r in cfg.rules]
    assert {"pk_enum_tasks", "pk_name_map"} <= {f.id for f in cfg.facts}
    # the pack's own rules come along; pillars this repo lacks report under "other"
    pack_rules = [r for r in cfg.rules if r.id != "mine"]
    assert pack_rules and all(r.pillar in {p.id for p in cfg.pillars} for r in pack_rules)


def test_fact_options_are_checked_when_the_config_loads():
    message = error_of('[[fact]]\nid = "f"\nlang = "cpp"\nfiles = ["a.h"]\nquery = "(x) @key"\nscope = "enum"\n')
    assert ".github/drift-audit.toml:1: [[fact]] #1" in message and "scope" in message


def test_unknown_pack_is_named():
    assert "unknown rule pack 'nope'" in error_of('[settings]\npacks = ["nope"]\n')


@pytest.mark.parametrize("label,hint", [("sm999", "did you mean 'sm90'?"), ("sm9", "did you mean 'sm90'?"),
                                        ("rocm", "use one of: cpu, sm80, sm90, sm100, sm120")])
def test_a_runner_label_typo_is_a_config_error(label, hint):
    suite = f'[[suite]]\nid = "s"\nkind = "parity"\ncommand = "pytest"\nrunners = ["cpu", "{label}"]\n'
    message = error_of(suite)
    assert message.startswith(".github/drift-audit.toml:5: [[suite]] #1, key 'runners': ")
    assert f"unknown runner label '{label}'" in message and hint in message
    assert "[settings] runner_labels" in message


def test_gpu_families_and_declared_labels_load():
    cfg = parse_config('[settings]\nrunner_labels = ["h100-large"]\n'
                       '[[suite]]\nid = "s"\nkind = "parity"\ncommand = "pytest"\n'
                       'runners = ["cpu", "sm80", "sm90a", "sm100", "sm120", "h100-large"]\n')
    assert cfg.suites[0].runners == ["cpu", "sm80", "sm90a", "sm100", "sm120", "h100-large"]
