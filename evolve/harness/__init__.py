"""Harness context (docs/DESIGN.md §7).

``autocompact``: the ``.claude/settings.json`` writer and the detector of the harness's own
autocompact threshold. ``hooks``: the SessionStart hook (nudge and post-compaction re-injection)
as pure functions. ``handoff``: operator hand-offs (continue and fork), their artifacts, redaction
and retention, and what they do to the next cycle. evolve never compacts anything itself.
"""
