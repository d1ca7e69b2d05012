"""`drift-audit serve` without its settings names every way to give each one, as the docs do."""

from __future__ import annotations

import pytest

from bot.settings import SettingsError, load_settings


def test_missing_key_names_the_key_file_too(tmp_path):
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={}).require_app()
    message = str(info.value)
    assert message.startswith("missing setting(s): DRIFT_AUDIT_APP_ID, DRIFT_AUDIT_PRIVATE_KEY or "
                              "DRIFT_AUDIT_PRIVATE_KEY_FILE, DRIFT_AUDIT_WEBHOOK_SECRET"), message
    key = tmp_path / "app.pem"
    key.write_text("-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n")
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={"DRIFT_AUDIT_PRIVATE_KEY_FILE": str(key)}).require_app()
    assert "PRIVATE_KEY" not in str(info.value)  # the file counts as the key
