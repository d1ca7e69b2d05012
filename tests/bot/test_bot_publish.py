"""Publishing through real PyGithub: marker upsert, the 65 536 limit, annotation batches that resume."""

from __future__ import annotations

import time

import pytest
from github import Auth, Github

from bot.github import GitHubApp
from bot.publish import COMMENT_LIMIT, COMMENT_MARKER, Publisher, split_comment
from bot.settings import BotSettings, SettingsError, load_settings
from checks.model import Annotation, Report

SHA = "c" * 40


def _app(base: str, state, **kw) -> GitHubApp:
    return GitHubApp(
        BotSettings(
            app_id=state.app_id,
            private_key=state.private_key,
            webhook_secret="s",
            github_url=base,
            seconds_between_requests=0,
            seconds_between_writes=0,
            **kw,
        )
    )


def _repo(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.add_pull("octo/eng", 4, head_sha=SHA, base_sha="d" * 40)
    return _app(base, state).client(1).get_repo("octo/eng"), state


def _report(n_annotations: int = 0, markdown: str = f"{COMMENT_MARKER}\nok") -> Report:
    anns = [
        Annotation(path=f"engine/f{i}.py", start_line=i + 1, end_line=i + 1, level="warning", message=f"m{i}")
        for i in range(n_annotations)
    ]
    return Report(
        verdict="fail",
        headline="drift",
        markdown=markdown,
        check_title="1 finding",
        check_summary="summary",
        annotations=anns,
    )


def test_comment_is_found_by_marker_and_edited(ghstub):
    repo, state = _repo(ghstub)
    state.add_comment("octo/eng", 4, f"quoting the bot: {COMMENT_MARKER}", user="someone")  # a human's comment
    pub = Publisher(repo, login="drift-audit[bot]")
    first = pub.upsert_comment(4, f"{COMMENT_MARKER}\nv1")
    second = pub.upsert_comment(4, f"{COMMENT_MARKER}\nv2")
    assert first == second and state.comments[first]["body"].endswith("v2")
    assert state.comments_on("octo/eng", 4)[0]["body"].startswith("quoting")  # untouched
    assert state.count("POST", "/issues/4/comments") == 1


def test_overflow_goes_to_the_check_run(ghstub):
    repo, state = _repo(ghstub)
    big = COMMENT_MARKER + "\n" + "\n".join(f"| row {i} | {'x' * 60} |" for i in range(2000))
    comment, overflow = split_comment(big, "http://bot/audits/job-1")
    assert len(comment) <= COMMENT_LIMIT and comment + overflow != big and overflow.strip()
    assert "check run" in comment and big.startswith(comment[: len(comment) - 200])
    pub = Publisher(repo, login="drift-audit[bot]")
    pub.upsert_comment(4, comment)
    run = pub.start_check(SHA, "job:1", "http://bot/audits/job-1")
    pub.finish_check(run, _report(markdown=big), overflow=overflow)
    stored = state.check_runs[run.id]
    assert stored["conclusion"] == "failure" and stored["output"]["text"].startswith(overflow.strip()[:100])
    assert len(stored["output"]["text"]) <= 65535


def test_annotations_go_in_batches_of_50_and_resume_without_duplicates(ghstub):
    repo, state = _repo(ghstub)
    pub = Publisher(repo, login="drift-audit[bot]")
    run = pub.start_check(SHA, "job:2", None)
    report = _report(130)
    pub._annotate(run, report.annotations[:50], {"title": "t", "summary": "s"})  # an attempt that died after 1 batch
    again = pub.start_check(SHA, "job:2", None)  # the retry finds the same run by external_id
    assert again.id == run.id
    pub.finish_check(again, report)
    posted = state.annotations[run.id]
    assert [a["message"] for a in posted] == [f"m{i}" for i in range(130)]
    assert (
        state.count("PATCH", f"/check-runs/{run.id}") == 1 + 2 + 1
    )  # first attempt, the remaining 80 as 50 + 30, completion


def test_installation_token_is_refreshed_before_expiry(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.token_ttl = 1.5
    app = _app(base, state, token_refresh_margin=1.0)
    client = app.client(1)
    client.get_repo("octo/eng")
    time.sleep(0.6)
    client.get_repo("octo/eng")
    assert len(state.tokens) == 2 and state.count("GET", "/repos/octo/eng", 401) == 0
    state.token_length = 4000  # GitHub is lengthening tokens: nothing may assume a size
    fresh = _app(base, state).client(1)
    assert fresh.get_repo("octo/eng").full_name == "octo/eng"
    assert max(len(t) for t in state.tokens) >= 4000


def test_settings_from_env_and_file_keep_secrets_out_of_repr(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nsecret-bits\n-----END PRIVATE KEY-----\n")
    cfg = tmp_path / "bot.toml"
    cfg.write_text(
        f'app_id = 12\nprivate_key_file = "{key}"\nworkers = 3\ngithub_url = "https://ghe.example/api/v3/"\n'
    )
    s = load_settings(cfg, env={"DRIFT_AUDIT_WEBHOOK_SECRET": "hush", "DRIFT_AUDIT_AUDIT_DRAFTS": "yes"})
    assert (s.app_id, s.workers, s.audit_drafts, s.github_url) == (12, 3, True, "https://ghe.example/api/v3")
    assert "secret-bits" not in repr(s) and "hush" not in repr(s) and "hush" not in str(s.redacted())
    s.require_app()
    with pytest.raises(SettingsError, match="DRIFT_AUDIT_WEBHOOK_SECRET"):
        load_settings(cfg, env={}).require_app()
    cfg.write_text("app_idd = 1\n")
    with pytest.raises(SettingsError, match="unknown setting 'app_idd'"):
        load_settings(cfg, env={})
    with pytest.raises(SettingsError, match="workers must be int"):
        load_settings(None, env={"DRIFT_AUDIT_WORKERS": "many"})


def test_ghe_base_url_is_honoured():
    from tests.ghstub import start_stub

    base, state, stop = start_stub(prefix="/api/v3")
    try:
        state.add_repo("octo/eng")
        repo = _app(base, state).client(1).get_repo("octo/eng")
        assert repo.full_name == "octo/eng" and all(
            p.startswith("/repos") or p.startswith("/app") for _, p, _ in state.requests
        )
        assert Github(auth=Auth.Token("x"), base_url=base)  # PyGithub accepts the GHE-style root
    finally:
        stop()


def test_a_create_that_landed_before_failing_is_not_sent_twice(ghstub):
    from tests.ghstub import Fault

    repo, state = _repo(ghstub)
    state.fault = Fault(
        rate=1.0, kinds=(502,), methods=("POST",), paths=("/issues/4/comments", "/check-runs"), after_apply=True
    )
    pub = Publisher(repo, login="drift-audit[bot]")
    cid = pub.upsert_comment(4, f"{COMMENT_MARKER}\nonce")
    run = pub.start_check(SHA, "job:9", None)
    assert [c["id"] for c in state.comments_on("octo/eng", 4)] == [cid]
    assert [c["id"] for c in state.check_runs_for("octo/eng", SHA)] == [run.id]
    assert state.faults_injected == 2
