"""A 150-file PR's comment, rendered in headless Chromium, shows its first finding in the first screen."""

from __future__ import annotations

import pytest

from benchmarks import comment_layout


@pytest.mark.skipif(comment_layout.chromium() is None, reason="no Chromium here")
def test_first_finding_is_in_the_first_screen(tmp_path):
    base, head = comment_layout.build_pr(tmp_path / "synth", n_files=300, change_files=141)
    markdown, _ = comment_layout.comment_now(tmp_path / "synth", base, head)
    y = comment_layout.first_finding_y(comment_layout.chromium(), markdown, tmp_path)
    assert 0 < y < comment_layout.SCREEN[1] / 2, y
    # and the same measure sees a finding pushed below the fold
    pushed = markdown.replace("#### Findings", "#### Findings\n\n" + "filler line\n\n" * 80, 1)
    assert comment_layout.first_finding_y(comment_layout.chromium(), pushed, tmp_path) > comment_layout.SCREEN[1]
