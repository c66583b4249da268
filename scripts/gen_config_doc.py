"""Regenerate docs/configuration.md from the settings object (tests check it is current)."""

from __future__ import annotations

from pathlib import Path

from loadbalance.config import config_markdown

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    out.write_text(config_markdown(), encoding="utf-8")
    print(f"wrote {out}")
