"""Mutation harness for the ownership guards: every named mutant must be killed by a test.

Usage::

    python -m tests.safety.run_mutants [--only NAME ...] [--json] [--markdown] [--jobs 1|2]
                                       [--guard-tests] [--head]

For each mutant of ``tests.safety.mutants.MUTANTS`` (the store, the controller, the agent, the
serving rule and the clock): copy the repository's files (``git ls-files``, tracked plus
untracked-but-not-ignored, as they are in the work tree; with ``--head``, the committed tree
from ``git archive HEAD``, so other people's uncommitted edits never enter a run) to a
temporary folder, apply the mutant there, and run that mutant's tests with
``python -m pytest -x -q`` whose working directory is the copy, so the copy's packages are
imported, not the editable install of the work tree (``tests.safety.pin_copy`` checks every
loaded project module and stops the run otherwise). Nothing is ever written to the work tree:
an interrupted or failed run leaves nothing to restore, and its temporary folder is removed.
Before the mutants, the unmutated copy runs every selected test once and must pass, or the
table would mean nothing.

A mutant of ``metadata_store`` is first imported in a short preflight that prints where
``metadata_store.ownership_redis`` came from and loads (``SCRIPT LOAD``, compile only) every
``_LUA_*`` script into a Redis started for the harness, so a mutant that breaks the Lua syntax is
reported as an error instead of counting as killed (a Python syntax error stops pytest's
collection, an error too). A run whose pytest exits 1 with a failed or errored test kills the
mutant; exit 0 means it survived; anything else (collection error, import outside the copy,
timeout) is an error. The harness prints the kill table and exits 1 if any mutant survived or
errored, 2 if the table or the unmutated run is broken.

Only in-process tests belong in a mutant's list: tests that spawn ``lbctl`` subprocesses
import the installed package, not the copy. ``--guard-tests`` runs each mutant against its own
test in ``tests/safety/`` alone, to show that test kills it without help.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.safety.mutants import MUTANTS, Mutant, MutantRot, by_name, check_table
from tests.safety.pin_copy import WHERE_TAG

REPO = Path(__file__).resolve().parents[2]
MAX_JOBS = 2  # the machine has two cores shared with other work
RUN_TIMEOUT_S = 300.0
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-p", "tests.safety.pin_copy")
_FAILED_RE = re.compile(r"^(FAILED|ERROR) ([^\s\[]+(?:\[[^\]]*\])?)", re.MULTILINE)

# Runs in the copy: imports the mutated module from there (a Python syntax error is an error,
# not a kill), says where the store came from, and compiles every Lua script of the (possibly
# mutated) redis store without running it.
_PREFLIGHT = """
import importlib, sys
from pathlib import Path
import redis
import metadata_store.ownership_redis as m
for name in sys.argv[2:]:
    mod = importlib.import_module(name)
    if not Path(mod.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        sys.exit(f"{name} imported from {mod.__file__}, outside the copy")
where = Path(m.__file__).resolve()
print(where)
if not where.is_relative_to(Path.cwd().resolve()):
    sys.exit(f"metadata_store.ownership_redis imported from {where}, outside the copy")
client = redis.Redis.from_url(sys.argv[1])
for name, text in sorted(vars(m).items()):
    if name.startswith("_LUA_") and isinstance(text, str):
        try:
            client.script_load(text)
        except redis.ResponseError as e:
            sys.exit(f"{name} does not compile: {e}")
"""


@dataclass
class Result:
    """How one run ended: ``killed``, ``survived`` or ``error`` (``baseline`` must pass)."""

    mutant: str
    guard: str
    status: str
    killed_by: str
    seconds: float
    where: str = ""
    detail: str = ""


def repo_files(root: Path) -> list[str]:
    """The files a fresh clone would have, plus new files not yet committed (not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (root / f).is_file()})


def head_tree(root: Path, dest: Path) -> Path:
    """The committed tree (``git archive HEAD``) extracted in ``dest``: what ``--head`` mutates,
    so other people's uncommitted edits in the work tree never enter a run."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=root, check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def tree_files(root: Path) -> list[str]:
    """Every file under ``root`` (a ``head_tree``), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def copy_repo(root: Path, files: Sequence[str], dest: Path) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)


def _env(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["SAFETY_COPY_ROOT"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


def _child(
    args: Sequence[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` whose process ``_stop_children`` can kill from the main thread."""
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # a timeout, Ctrl-C or SIGTERM: the child must not outlive us
            proc.kill()
            proc.communicate()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _stop_children() -> None:
    """Kill every preflight and pytest still running (Ctrl-C, SIGTERM), so the temporary
    copies can be removed at once."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc.kill()


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_copy(
    copy: Path,
    tests: Sequence[str],
    lua_redis_url: str,
    name: str,
    guard: str,
    modules: Sequence[str] = (),
    preflight: bool = True,
) -> Result:
    """Preflight (importing ``modules``; skipped without ``preflight``: a Python syntax error
    then stops pytest's collection, an error too) and pytest in ``copy``; the result as the
    kill table reports it."""
    start = time.monotonic()
    env = _env(copy)
    if not preflight:
        return _pytest(copy, tests, env, name, guard, start, "")
    pre = _child([sys.executable, "-c", _PREFLIGHT, lua_redis_url, *modules], copy, env, 120)
    where = pre.stdout.strip().splitlines()[-1] if pre.stdout.strip() else ""
    if pre.returncode != 0:
        return Result(name, guard, "error", "", time.monotonic() - start, where,
                      "preflight: " + _tail(pre.stderr or pre.stdout, 5))  # fmt: skip
    return _pytest(copy, tests, env, name, guard, start, where)


def _pytest(
    copy: Path,
    tests: Sequence[str],
    env: dict[str, str],
    name: str,
    guard: str,
    start: float,
    where: str,
) -> Result:
    """Run ``tests`` in ``copy``: killed (a test failed), survived (all passed) or error."""
    try:
        run = _child([sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests], copy, env,
                     RUN_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Result(name, guard, "error", "", time.monotonic() - start, where,
                      f"timed out after {RUN_TIMEOUT_S:.0f} s")  # fmt: skip
    seconds = time.monotonic() - start
    out = run.stdout + run.stderr
    pinned = [ln for ln in out.splitlines() if ln.startswith(WHERE_TAG)]
    if pinned:
        where = pinned[0].split("=", 1)[1]
    if run.returncode == 0:
        return Result(name, guard, "survived", "", seconds, where)
    failed = _FAILED_RE.search(out)
    if run.returncode == 1 and failed:
        return Result(name, guard, "killed", failed.group(2), seconds, where)
    return Result(name, guard, "error", "", seconds, where,
                  f"pytest exit {run.returncode}: {_tail(out)}")  # fmt: skip


def run_mutant(
    m: Mutant,
    files: Sequence[str],
    tmp: Path,
    lua_redis_url: str,
    guard_tests: bool,
    src: Path = REPO,
) -> Result:
    """Copy ``files`` of ``src`` to ``tmp/<name>``, apply ``m`` there, run its tests; the copy
    is removed whatever happens (``src`` is never written)."""
    copy = tmp / m.name
    copy_repo(src, files, copy)
    try:
        m.apply(copy)
        return run_copy(copy, m.run_ids(guard_tests), lua_redis_url,
                        m.name, m.guard, (m.module,), m.has_lua)  # fmt: skip
    except MutantRot as e:
        return Result(m.name, m.guard, "error", "", 0.0, detail=str(e))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _short(test_id: str) -> str:
    """``tests/integration/test_x.py::test_y[redis]`` -> ``test_x.py::test_y[redis]``."""
    file, _, test = test_id.partition("::")
    return f"{file.rsplit('/', 1)[-1]}::{test}"


def format_table(results: Sequence[Result]) -> str:
    rows = [("mutant", "guard", "result", "killed by", "s")]
    for r in results:
        detail = r.detail.splitlines()[0] if r.detail else ""
        killer = _short(r.killed_by) if r.killed_by else detail
        status = r.status if r.status == "killed" else r.status.upper()
        rows.append((r.mutant, r.guard, status, killer, f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join([*(row[i].ljust(widths[i]) for i in range(4)), row[4].rjust(5)]) for row in rows
    )


def markdown_table(results: Sequence[Result]) -> str:
    """The kill table as docs/ownership.md shows it (``--markdown``): one row per mutant, in
    the harness's order, with the guard it breaks and the test that killed it."""
    rows = ["| mutant | guard broken | killed by |", "|---|---|---|"]
    for r in results:
        test, bracket, param = r.killed_by.partition("[")
        if len(param) > 24:  # a reply text as the parameter: its first word says which
            param = param.split()[0] + " ...]"
        killer = f"`{test}{bracket}{param}`" if r.status == "killed" else r.status.upper()
        rows.append(f"| `{r.mutant}` | {r.guard} | {killer} |")
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.safety.run_mutants", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this mutant (repeatable; comma-separated names work)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--markdown", action="store_true", help="also print the kill table for docs/ownership.md"
    )
    parser.add_argument("--jobs", type=int, default=MAX_JOBS, choices=range(1, MAX_JOBS + 1))
    parser.add_argument(
        "--guard-tests",
        action="store_true",
        help="run each mutant against its own test in tests/safety/ only",
    )
    parser.add_argument(
        "--head",
        action="store_true",
        help="mutate the committed tree (git archive HEAD), not the work tree",
    )
    return parser


def _select(args: argparse.Namespace, src: Path) -> list[Mutant] | str:
    """The mutants to run, or why the request is broken (the table checked against ``src``)."""
    try:
        check_table(src)
    except MutantRot as e:
        return f"broken mutant table: {e}"
    names = by_name()
    wanted = [n for opt in args.only for n in opt.split(",") if n]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        return f"unknown mutant(s) {unknown}; known: {', '.join(names)}"
    selected = [names[n] for n in wanted] if wanted else list(MUTANTS)
    return selected


def _run(
    selected: Sequence[Mutant],
    args: argparse.Namespace,
    src: Path,
    tmp: Path,
    say: Callable[[str], None],
) -> tuple[Result, list[Result]]:
    """The unmutated run of ``src``, then (if it passed) every selected mutant, ``args.jobs``
    at a time."""
    from infra.embedded import EmbeddedRedis

    files = tree_files(src) if args.head else repo_files(REPO)
    with EmbeddedRedis(tmp / "logs") as lua_redis:
        every_test = list(dict.fromkeys(
            t for m in selected for t in m.run_ids(args.guard_tests)
        ))  # fmt: skip
        modules = sorted({m.module for m in selected})
        base_copy = tmp / "unmutated"
        copy_repo(src, files, base_copy)
        baseline = run_copy(base_copy, every_test, lua_redis.url, "(unmutated)",
                            f"all {len(every_test)} selected tests must pass",
                            modules)  # fmt: skip
        shutil.rmtree(base_copy, ignore_errors=True)
        passed = "passed" if baseline.status == "survived" else "FAILED"
        say(f"unmutated copy: {passed} in {baseline.seconds:.1f} s, "
            f"metadata_store.ownership_redis from {baseline.where}")  # fmt: skip
        if baseline.status != "survived":
            return baseline, []
        baseline.status = "passed"
        results: list[Result] = []
        pool = ThreadPoolExecutor(max_workers=args.jobs)
        try:
            futures = [
                pool.submit(run_mutant, m, files, tmp, lua_redis.url, args.guard_tests, src)
                for m in selected
            ]
            for i, fut in enumerate(futures):
                r = fut.result()
                results.append(r)
                if i == 0:
                    say(f"first mutant's copy: metadata_store.ownership_redis from {r.where}")
                say(f"{r.mutant}: {r.status} {r.killed_by} ({r.seconds:.1f} s)")
        except BaseException:  # Ctrl-C or SIGTERM: stop the children, then clean up
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_children()
            raise
        pool.shutdown()
    return baseline, results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness; SIGTERM cleans up as Ctrl-C does (children killed, copies removed)."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if on_main else None
    try:
        return _main(_parser().parse_args(argv))
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:

    def say(text: str) -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lb-mutants-") as tmp_name:
        tmp = Path(tmp_name)
        src = head_tree(REPO, tmp / "head") if args.head else REPO
        selected = _select(args, src)
        if isinstance(selected, str):
            say(selected)
            return 2
        baseline, results = _run(selected, args, src, tmp, say)
    if baseline.status != "passed":
        say(f"the unmutated copy must pass: {baseline.killed_by} {baseline.detail}")
        return 2
    wall = time.monotonic() - started
    bad = [r for r in results if r.status != "killed"]
    if args.json:
        doc = {"wall_seconds": round(wall, 1), "baseline": asdict(baseline),
               "mutants": [asdict(r) for r in results], "ok": not bad}  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        print()
        print(format_table(results))
        print()
        if args.markdown:
            print(markdown_table(results))
            print()
        killed = len(results) - len(bad)
        print(f"{killed}/{len(results)} mutants killed in {wall:.1f} s wall "
              f"({args.jobs} at a time; unmutated run {baseline.seconds:.1f} s)")  # fmt: skip
        for r in bad:
            print(f"{r.status.upper()}: {r.mutant} ({r.guard}) {r.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
