"""The mutation harness as a test: every ownership guard is broken once, and a test must notice.

Why in the suite: a guard whose test was weakened, deleted or renamed, or whose code moved so
that its mutant's snippet no longer matches, would otherwise pass CI silently; and the kill
table in docs/ownership.md must name exactly the mutants the harness runs. The full run
(``python -m tests.safety.run_mutants``, 78 mutants: the store, the controller's pre-checks,
placement, sweep and fault classification, the agent's keeper and serve-until rule, the clock)
took 265 s on the 2-core machine at load average 6-9 (other work sharing it), two mutants at a
time; a mutant takes 3-6 s alone on a quiet machine. The table checks are instant.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.embedded import EmbeddedRedis
from tests.safety import run_mutants
from tests.safety.mutants import MUTANTS, Mutant, MutantRot, by_name, check_table

REPO = run_mutants.REPO
REQUIRED = {
    "redis.acquire.live_lease",
    "memory.acquire.live_lease",
    "redis.acquire.broker_alive",
    "redis.renew.token",
    "redis.renew.expiry",
    "redis.sweep.expiry",
    "redis.transfer.fence",
    "redis.transfer.source_live",
    "redis.transfer.dest_alive",
    "redis.release.owner",
    "redis.release.token",
    "redis.reshape.version_cas",
    "redis.reshape.end_leases",
    "redis.fence.acquire_get",
    "redis.acquire.canonical_key",
    "recovery.fence_floor",
    "apply.transfer.owner",
    "apply.transfer.dest_alive",
    "apply.unload.owner",
    "apply.bundle_gone",
    "apply.split.version",
    "placement.live_brokers",
    "sweep.expired.announced_first",
    "sweep.unplaced.kept",
    "faults.readonly.transient",
    "faults.busy.transient",
    "loop.record_fault.held",
    "loop.sweep_fault.skipped",
    "serving.handover_wait",
    "agent.keeper.own_only",
    "agent.renew_failure.survives",
    "agent.serving.t0.reply",
    "agent.serving.refused_stops",
    "serving.t0.reply",
    "serving.drift_factor",
    "serving.stop_margin",
    "serving.deadline",
    "clock.lua.truncate_ms",
    "clock.lua.seconds",
    "clock.acquire.ttl_off_by_one",
}
DOC = REPO / "docs" / "ownership.md"
DOC_SECTION = "## Mutation kill table"


def test_the_mutant_table_matches_the_code_and_covers_every_guard() -> None:
    check_table(REPO)
    assert set(by_name()) >= REQUIRED, REQUIRED - set(by_name())
    for m in MUTANTS:
        assert m.run_ids(), f"{m.name} names no test that kills it"
        assert all("::" in t and (REPO / t.split("::")[0]).is_file() for t in m.run_ids()), m.name


def documented_mutants(text: str) -> list[str]:
    """The first column of the table under ``DOC_SECTION`` (up to the next section)."""
    assert DOC_SECTION in text, f"docs/ownership.md has no {DOC_SECTION!r} section"
    section = text.split(DOC_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
    return [ln.split("|")[1].strip().strip("`") for ln in rows[1:]]


def test_the_documented_kill_table_lists_exactly_the_harness_mutants() -> None:
    """The kill table in docs/ownership.md names every mutant once, in the harness's order, and
    nothing else: a mutant added, renamed or dropped without its row fails here."""
    documented = documented_mutants(DOC.read_text(encoding="utf-8"))
    assert documented == [m.name for m in MUTANTS], (
        f"missing {sorted(set(by_name()) - set(documented))}, "
        f"unknown {sorted(set(documented) - set(by_name()))}; keep the harness's order"
    )


def test_a_missing_or_repeated_snippet_fails_naming_the_mutant(tmp_path: Path) -> None:
    m = by_name()["redis.release.owner"]
    target = tmp_path / m.file
    target.parent.mkdir(parents=True)
    target.write_text("nothing to see here\n", encoding="utf-8")
    with pytest.raises(MutantRot, match=r"'redis\.release\.owner'.*does not occur"):
        m.apply(tmp_path)
    target.write_text(m.old + "\n" + m.old + "\n", encoding="utf-8")
    with pytest.raises(MutantRot, match=r"'redis\.release\.owner'.*occurs 2 times"):
        m.apply(tmp_path)
    assert target.read_text(encoding="utf-8") == m.old + "\n" + m.old + "\n", "left untouched"


@pytest.mark.integration
def test_the_harness_reports_a_mutant_that_no_test_kills(tmp_path: Path) -> None:
    """A harness that cannot see a survivor proves nothing: a change no test can notice (a
    comment in this package) run against an unrelated test must come back ``survived``."""
    harmless = Mutant(
        "harmless",
        "no guard: a comment",
        "tests/safety/mutants.py",
        'REDIS = "metadata_store/ownership_redis.py"\n',
        'REDIS = "metadata_store/ownership_redis.py"  # a comment no test reads\n',
        ("tests/unit/test_events.py::test_trusted_floor_ignores_a_token_far_above_the_others"
         "_and_keeps_dense_ones",),
        (),
    )  # fmt: skip
    files = run_mutants.repo_files(REPO)
    before = (REPO / harmless.file).read_bytes()
    with EmbeddedRedis(tmp_path / "logs") as lua_redis:
        result = run_mutants.run_mutant(harmless, files, tmp_path, lua_redis.url, False)
    assert result.status == "survived", result
    assert result.where.startswith(str(tmp_path / "harmless")), "the copy's store was imported"
    assert (REPO / harmless.file).read_bytes() == before, "the work tree is never written"
    assert not (tmp_path / "harmless").exists(), "the mutated copy is removed"


@pytest.mark.integration
def test_every_mutant_is_killed(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("git") is None:
        pytest.fail("the harness copies the repository with git ls-files; git is missing")
    rc = run_mutants.main(["--json"])
    out, err = capsys.readouterr()
    assert out, f"exit {rc} before any mutant ran: {err}"
    doc = json.loads(out)
    survivors = [(m["mutant"], m["status"], m["detail"]) for m in doc["mutants"]
                 if m["status"] != "killed"]  # fmt: skip
    assert rc == 0 and doc["ok"] and not survivors, survivors
    assert doc["baseline"]["where"].endswith("unmutated/metadata_store/ownership_redis.py")
    assert len(doc["mutants"]) == len(MUTANTS)
