"""No secret leaves the process: not the App's private key, the webhook secret, the results key or an installation
token, whatever text an error carries (a library or git echoing a header or a URL). A failing job's reason reaches
the check run, the details page, the job table and the log; each is checked for every secret."""

from __future__ import annotations

import base64
import logging

from bot.mirror import MirrorError, Mirrors
from bot.security import Redactor
from bot.settings import BotSettings
from tests.bot.conftest import REPO, RESULTS_KEY, SECRET, pr_payload, wait_for
from tests.bot.test_bot_commands import _live


def _leaky(token: str, private_key: str) -> str:
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    pem_line = private_key.strip().splitlines()[1]
    return (f"> GET /info/refs HTTP/1.1\n> Authorization: Basic {basic}\n> token {token}\n"
            f"error: cannot lock ref 'refs/heads/[x](http://e.example) @octocat <img src=x>'\n"  # PR text, echoed
            f"secret={SECRET} results_key={RESULTS_KEY}\n{pem_line}\n{private_key}")


def test_an_error_that_quotes_every_secret_is_published_without_them(bot_factory, engine_repo, monkeypatch, caplog):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 71, head_sha=head, base_sha=base)
    bot = make(start_workers=False, max_attempts=2)
    seen: list[str] = []

    def fetch(self, repo, clone_url, shas, token=None):  # a verbose git (GIT_CURL_VERBOSE) failing mid-fetch
        seen.append(token or "")
        raise MirrorError(_leaky(token or "", bot.settings.private_key))

    monkeypatch.setattr(Mirrors, "fetch", fetch)
    with caplog.at_level(logging.INFO):
        bot.service.start()
        bot.deliver("pull_request", pr_payload("opened", number=71, head=head, base=base))
        bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "failed" and seen and all(seen)

    secrets = Redactor(bot.settings, bot.service.app.issued_tokens).secrets()
    assert set(seen) <= set(secrets) and SECRET in secrets and RESULTS_KEY in secrets
    run = wait_for(lambda: next((r for r in state.check_runs_for(REPO, head) if r["status"] == "completed"), None))
    published = {
        "check run": str(run["output"]),
        "details page": bot.http.get(run["details_url"]).text,
        "job table": job.error + job.result,
        "log": caplog.text,
        "comments": str(state.comments),
    }
    assert "MirrorError" in published["check run"] and "***" in published["check run"]  # the reason, redacted
    assert "@octocat" in run["output"]["summary"] and _live(run["output"]["summary"]) == []  # and quoted inertly
    for where, text in published.items():
        leaked = [s[:8] + "…" for s in secrets if s in text]
        assert leaked == [], f"{where} shows {leaked}"


def test_the_redactor_covers_the_key_whole_and_by_line_and_skips_trivial_values():
    settings = BotSettings(webhook_secret="hunter2-but-longer", results_key="k" * 32,
                           private_key="-----BEGIN RSA PRIVATE KEY-----\nAAAABBBBCCCC\nDDDDEEEE\n-----END RSA PRIVATE KEY-----\n")
    redact = Redactor(settings, lambda: ["ghs_" + "t" * 36])
    text = ("hunter2-but-longer " + "k" * 32 + " AAAABBBBCCCC DDDDEEEE ghs_" + "t" * 36 + " "
            + base64.b64encode(("x-access-token:ghs_" + "t" * 36).encode()).decode())
    assert set(redact(text).split()) == {"***"}
    assert Redactor(BotSettings(webhook_secret="main"))("main branch") == "main branch"  # too short to be one


def test_settings_never_show_secrets_or_url_credentials():
    settings = BotSettings(app_id=1, webhook_secret="whsec-value", results_key="rk-value-32", private_key="PEM-BODY",
                           github_url="https://svc:ghp_tokenvalue@ghe.example/api/v3")
    for shown in (repr(settings), str(settings), str(settings.redacted())):
        assert not [s for s in ("whsec-value", "rk-value-32", "PEM-BODY", "ghp_tokenvalue") if s in shown], shown
        assert "ghe.example/api/v3" in shown and "<set>" in shown
    assert "ghp_tokenvalue" not in Redactor(settings)("GET https://svc:ghp_tokenvalue@ghe.example/api/v3/app failed")
