"""The README's two commands stay true: CI runs exactly the README's test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```sh\n")[1:]
    return [b.split("```", 1)[0].strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    commands = _readme_commands()
    test_cmd = next(c for c in commands if "pytest" in c)
    install, _, run = test_cmd.partition("&& ")
    assert install.startswith("python3 -m venv .venv")
    ci = (ROOT / ".ci" / "run").read_text()
    assert run in ci, "the test command in .ci/run must be the README's"


def test_readme_main_command_runs_the_demo():
    commands = _readme_commands()
    assert len(commands) == 2, "a newcomer needs exactly two commands"
    assert commands[0].endswith("drift-audit demo")
