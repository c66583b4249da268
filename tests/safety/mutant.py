"""One named mutant: an exact-text replacement that breaks one guard in a copy of the repository.

Why a module of its own: the mutant tables (``tests.safety.mutants`` for the store and recovery,
``tests.safety.mutants_controller`` for the controller, ``tests.safety.mutants_agent`` for the
agent and the clock) all build ``Mutant`` values, and the harness reads them through one list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class MutantRot(AssertionError):
    """A mutant's snippet is missing or not unique: the table no longer matches the code."""


@dataclass(frozen=True, slots=True)
class Mutant:
    """One broken guard: replace ``old`` (exactly one occurrence in ``file``) with ``new``.

    ``tests``: existing tests expected to kill it; ``guard_tests``: a test written for this
    guard (in ``tests/safety/``), run after them.
    """

    name: str
    guard: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    guard_tests: tuple[str, ...]

    def count_in(self, root: Path) -> int:
        """How often ``old`` occurs in ``root/file`` (0 when the file is gone)."""
        path = root / self.file
        return path.read_text(encoding="utf-8").count(self.old) if path.is_file() else 0

    def rot(self, count: int) -> MutantRot:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        return MutantRot(
            f"mutant {self.name!r} ({self.guard}): its snippet {where} in {self.file}; "
            "the guard moved or changed, update the mutant in tests/safety/"
        )

    def apply(self, root: Path) -> None:
        """Rewrite ``root/file`` with this mutant; ``MutantRot`` unless ``old`` occurs once.

        ``root`` is always a copy of the repository (``run_mutants.copy_repo``), never the
        work tree, so an interrupted run leaves nothing to restore."""
        count = self.count_in(root)
        if count != 1:
            raise self.rot(count)
        path = root / self.file
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace(self.old, self.new), encoding="utf-8")

    def run_ids(self, guard_tests_only: bool = False) -> tuple[str, ...]:
        """The test ids a run of this mutant executes, in order, without repeats; with
        ``guard_tests_only``, the guard's own tests (its ``tests`` when it has none)."""
        if guard_tests_only:
            return tuple(dict.fromkeys(self.guard_tests or self.tests))
        return tuple(dict.fromkeys((*self.tests, *self.guard_tests)))

    @property
    def has_lua(self) -> bool:
        """Whether the mutated file holds Lua scripts the preflight must compile."""
        return self.file.startswith("metadata_store/")

    @property
    def module(self) -> str:
        """The dotted module the mutant rewrites (``controller.apply`` for its file)."""
        return self.file.removesuffix(".py").replace("/", ".")
