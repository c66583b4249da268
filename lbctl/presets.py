"""Named configuration presets: ``conf/<name>.conf`` files in Pulsar's broker.conf format.

A preset is an ordinary broker.conf, so what ``lbctl run`` uses can be shown
(``lbctl config show --preset demo``) and used by hand (``--config conf/demo.conf``) with the
same result: one set of settings, with a name.
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
DEMO = "demo"


def available() -> list[str]:
    """Preset names: every ``conf/*.conf`` except the sample ``broker.conf``."""
    return sorted(p.stem for p in CONF_DIR.glob("*.conf") if p.stem != "broker")


def preset_path(name: str) -> Path:
    """The file of preset ``name``; ValueError naming the presets when there is none."""
    path = CONF_DIR / f"{name}.conf"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(available()) or 'none'}")
    return path
