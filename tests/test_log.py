"""Structured logs: stable JSON lines with bound ids, and secrets never written."""

from __future__ import annotations

from pathlib import Path

import orjson

from evolve import log


def test_json_lines_with_bound_context_and_redaction(tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    with open(out, "wb") as fh:
        log.configure(json=True, stream=fh)
        log.bind(fire_id="f1", cycle=3)
        try:
            log.get().info("cycle.start", api_key="sk-live-1234567890abcdef", note="token sk-abcdefghijklmnop here",
                           api_key_env="OPENAI_API_KEY")
        finally:
            log.unbind("fire_id", "cycle")
    rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["event"] == "cycle.start" and row["fire_id"] == "f1" and row["cycle"] == 3
    assert row["level"] == "info" and row["timestamp"].endswith("Z")
    text = out.read_text()
    assert "sk-live" not in text and "sk-abcdefghijklmnop" not in text
    assert row["api_key"] == "***" and row["api_key_env"] == "OPENAI_API_KEY"
