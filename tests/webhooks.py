"""Where GitHub's own webhook payload examples live: the shared/ folder beside the checkout (or its copy
``.shared-fixtures`` inside the checkout, which a machine that gets the checkout alone is sent)."""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = next(
    (p for p in (_ROOT.parent / "shared" / "fixtures" / "github-webhooks", _ROOT / ".shared-fixtures" / "github-webhooks",
                 Path("/work/shared/fixtures/github-webhooks")) if p.is_dir()),
    _ROOT.parent / "shared" / "fixtures" / "github-webhooks",
)
