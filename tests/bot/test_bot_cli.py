"""``drift-audit serve``: import-light registration and clear errors for bad settings."""

from __future__ import annotations

import subprocess
import sys

from bot.cli import main


def test_serve_module_is_import_light():
    code = (
        "import sys, bot.serve_cli; heavy = [m for m in ('torch', 'triton', 'git', 'github', 'tree_sitter', "
        "'uvicorn', 'starlette') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_serve_reports_missing_and_bad_settings(tmp_path, capsys, monkeypatch):
    for name in ("APP_ID", "PRIVATE_KEY", "PRIVATE_KEY_FILE", "WEBHOOK_SECRET"):
        monkeypatch.delenv(f"DRIFT_AUDIT_{name}", raising=False)
    assert main(["serve", "--settings", str(tmp_path / "nope.toml")]) == 2
    assert "settings file not found" in capsys.readouterr().err
    cfg = tmp_path / "bot.toml"
    cfg.write_text("app_id = 5\n")
    assert main(["serve", "--settings", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "DRIFT_AUDIT_PRIVATE_KEY" in err and "DRIFT_AUDIT_WEBHOOK_SECRET" in err
    cfg.write_text("app_id = 5\nwebhook_secret = [1\n")
    assert main(["serve", "--settings", str(cfg)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_serve_refuses_a_database_written_by_a_newer_build(tmp_path, capsys, monkeypatch):
    import sqlite3

    from bot.queue import SqliteJobStore

    db = tmp_path / "jobs.db"
    SqliteJobStore(str(db)).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")
    for name, value in (("APP_ID", "5"), ("PRIVATE_KEY", "pem"), ("WEBHOOK_SECRET", "s")):
        monkeypatch.setenv(f"DRIFT_AUDIT_{name}", value)
    assert main(["serve", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert str(db) in err and "newer drift-audit" in err and "--db" in err
