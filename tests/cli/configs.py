"""One small config the CLI tests share: a pinned LIMIT the change can break."""

PINNED_CONFIG = """
[[fact]]
id = "limits"
lang = "regex"
files = ["engine/*.py"]
regex = '(?P<key>LIMIT) = (?P<value>\\d+)'

[[rule]]
id = "limit-pinned"
kind = "pinned"
facts = ["limits"]
values = { LIMIT = "8" }
pillar = "runtime"
severity = "error"
"""
