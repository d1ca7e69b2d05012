"""GitHub's published webhook payload schemas (octokit/webhooks, MIT; see LICENSE.md), read by ``bot.payloads``.

Files are byte-identical to upstream, renamed ``<event>.<action>.schema.json`` / ``common.<name>.schema.json``;
refs resolve through each file's ``$id``.
"""
