"""Java jars the product needs from Maven Central, fetched once into a cache with pinned checksums.

Two sets:

* ``kafka``: Apache Kafka's broker (``org.apache.kafka:kafka_2.13``, KRaft mode) with the
  modules it runs on, Kafka's command-line tools (``kafka-tools``: the consumer performance
  test the benchmarks use as a ceiling) and a log4j binding. ``infra.kafka_server`` runs it.
* ``spark-kafka``: Spark's own Kafka connector (``spark-sql-kafka-0-10_2.13``) of exactly the
  installed PySpark's version, with ``kafka-clients``, ``commons-pool2`` and the token
  provider. Spark's own jars (and Hadoop's client, which PySpark ships) are left out: the
  connector runs on the Spark it was built for. ``streaming.job`` puts these on ``spark.jars``.

Why Maven and a lock file: Maven resolves the transitive set the way every Java build does
(``dependency:copy-dependencies`` over a small generated pom), and ``infra/jars.lock`` pins the
file name and SHA-256 of every jar, so a fetch that brings anything else fails loudly instead
of running unknown code. Once a set is complete in the cache, nothing is fetched again: the
cache folder holds a stamp listing the verified files. The cache is
``$LBCTL_JAR_CACHE``, else ``$XDG_CACHE_HOME/lbctl/jars``, else ``~/.cache/lbctl/jars``;
Maven's own repository (``~/.m2``) is used as Maven uses it.

``python -m infra.jars fetch`` fetches both sets (the README's commands run it);
``python -m infra.jars lock`` rewrites the lock file after a version change.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "JAR_SETS",
    "KAFKA_VERSION",
    "SPARK_VERSION",
    "JarError",
    "cache_root",
    "classpath",
    "ensure_jars",
    "spark_kafka_jars",
]

KAFKA_VERSION = "4.1.1"
"""Apache Kafka's broker, run in KRaft mode; the compose stack uses the same version."""
SPARK_VERSION = "4.2.0"
"""Must equal the pinned ``pyspark`` version (checked by ``ensure_jars``)."""
LOG4J_VERSION = "2.24.3"
LOCK_FILE = Path(__file__).with_name("jars.lock")


class JarError(RuntimeError):
    """The jars could not be fetched or do not match the lock file."""


@dataclass(frozen=True)
class JarSet:
    name: str
    version: str
    dependencies: tuple[str, ...]
    """``group:artifact:version`` coordinates, resolved with their runtime dependencies."""
    exclusions: tuple[str, ...] = ()
    """``group:artifact`` left out of the resolution (provided by the runtime)."""

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.version}"


JAR_SETS: dict[str, JarSet] = {
    "kafka": JarSet(
        "kafka",
        KAFKA_VERSION,
        (
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
            f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ),
    ),
    "spark-kafka": JarSet(
        "spark-kafka",
        SPARK_VERSION,
        (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",),
        exclusions=(
            "org.apache.hadoop:hadoop-client-runtime",
            "org.apache.hadoop:hadoop-client-api",
            "org.apache.spark:spark-tags_2.13",
            "org.scala-lang:scala-library",
            "org.scala-lang.modules:scala-parallel-collections_2.13",
            "org.slf4j:slf4j-api",
            "com.google.code.findbugs:jsr305",
            "org.xerial.snappy:snappy-java",
            "at.yawk.lz4:lz4-java",
            "com.github.luben:zstd-jni",
        ),
    ),
}

_STAMP = ".complete"


def cache_root() -> Path:
    override = os.environ.get("LBCTL_JAR_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lbctl" / "jars"


def read_lock(path: Path = LOCK_FILE) -> dict[str, dict[str, str]]:
    """set name -> jar file name -> SHA-256, from the lock file."""
    out: dict[str, dict[str, str]] = {}
    if not path.exists():
        return out
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3:
            raise JarError(f"{path}:{number}: expected 'SET FILE SHA256', got {line!r}")
        out.setdefault(parts[0], {})[parts[1]] = parts[2]
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pom(jar_set: JarSet) -> str:
    deps = []
    excl = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
        for g, a in (e.split(":") for e in jar_set.exclusions)
    )
    for coord in jar_set.dependencies:
        g, a, v = coord.split(":")
        deps.append(
            f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
            f"<version>{v}</version><exclusions>{excl}</exclusions></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>lbctl.jars</groupId><artifactId>{jar_set.name}</artifactId>"
        f"<version>{jar_set.version}</version><packaging>pom</packaging>"
        f"<dependencies>{''.join(deps)}</dependencies></project>"
    )


def _mvn() -> str:
    found = shutil.which("mvn")
    if not found:
        raise JarError(
            "Maven ('mvn') is not on PATH; it fetches Apache Kafka and Spark's Kafka connector "
            "from Maven Central once (apt-get install maven)"
        )
    return found


def _resolve(jar_set: JarSet, out_dir: Path) -> None:
    """Run Maven to copy the set's runtime jars into ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="lbctl-jars-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_pom(jar_set), encoding="utf-8")
        argv = [
            _mvn(),
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out_dir}",
            "-DincludeScope=runtime",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise JarError(f"Maven could not fetch the {jar_set.name} jars:\n{tail}")


def _complete(folder: Path, expected: dict[str, str]) -> bool:
    stamp = folder / _STAMP
    if not stamp.exists():
        return False
    listed = set(stamp.read_text(encoding="utf-8").split())
    return listed == set(expected) and all((folder / name).exists() for name in expected)


def ensure_jars(name: str, *, progress: bool = False) -> list[Path]:
    """The jars of set ``name``, fetched and verified on first use; fetches nothing afterwards."""
    jar_set = JAR_SETS[name]
    if name == "spark-kafka":
        _check_pyspark_version(jar_set.version)
    expected = read_lock().get(name, {})
    if not expected:
        raise JarError(f"{LOCK_FILE} has no entries for {name}; run python -m infra.jars lock")
    folder = cache_root() / jar_set.folder_name
    if not _complete(folder, expected):
        started = time.monotonic()
        if progress:
            print(f"jars: fetching {name} {jar_set.version} from Maven Central", file=sys.stderr)
        staging = Path(tempfile.mkdtemp(prefix=f".{jar_set.folder_name}-", dir=_parent(folder)))
        try:
            _resolve(jar_set, staging)
            _verify(staging, expected, name)
            (staging / _STAMP).write_text("\n".join(sorted(expected)) + "\n", encoding="utf-8")
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if progress:
            size = sum((folder / n).stat().st_size for n in expected) / 1e6
            took = time.monotonic() - started
            print(
                f"jars: {name}: {len(expected)} jars, {size:.1f} MB in {took:.1f} s",
                file=sys.stderr,
            )
    return [folder / n for n in sorted(expected)]


def _parent(folder: Path) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder.parent


def _verify(folder: Path, expected: dict[str, str], name: str) -> None:
    got = {p.name for p in folder.glob("*.jar")}
    missing = sorted(set(expected) - got)
    extra = sorted(got - set(expected))
    if missing or extra:
        raise JarError(
            f"the {name} jars Maven resolved differ from {LOCK_FILE.name}: "
            f"missing {missing}, unexpected {extra}"
        )
    for jar, want in expected.items():
        have = _sha256(folder / jar)
        if have != want:
            raise JarError(f"{jar}: SHA-256 {have} does not match the pinned {want}")


def _check_pyspark_version(version: str) -> None:
    try:
        import pyspark
    except ImportError:  # the Kafka broker alone needs no PySpark
        return
    if pyspark.__version__ != version:
        raise JarError(
            f"PySpark is {pyspark.__version__} but Spark's Kafka connector is pinned to "
            f"{version} (infra/jars.py); install pyspark=={version}"
        )


def classpath(name: str) -> str:
    """The set's jars joined for ``-cp`` or ``spark.jars`` (``os.pathsep`` / comma is the
    caller's choice: this joins with ``os.pathsep``)."""
    return os.pathsep.join(str(p) for p in ensure_jars(name))


def spark_kafka_jars() -> str:
    """Spark's Kafka connector and its dependencies as ``spark.jars`` / ``--jars`` want them
    (comma-separated paths)."""
    return ",".join(str(p) for p in ensure_jars("spark-kafka"))


def write_lock() -> None:
    """Resolve every set afresh and write their file names and checksums to the lock file."""
    lines = [
        "# Jars fetched from Maven Central by infra/jars.py: SET FILE SHA256.",
        "# Rewrite with: python -m infra.jars lock (after changing a version there).",
    ]
    for name, jar_set in JAR_SETS.items():
        with tempfile.TemporaryDirectory(prefix="lbctl-lock-") as tmp:
            _resolve(jar_set, Path(tmp))
            for jar in sorted(Path(tmp).glob("*.jar")):
                lines.append(f"{name} {jar.name} {_sha256(jar)}")
    LOCK_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.jars",
        description="Fetch (once) the Apache Kafka and Spark Kafka connector jars into the cache.",
    )
    parser.add_argument(
        "verb",
        choices=("fetch", "lock", "path", "spark-jars"),
        help="fetch: both sets into the cache; lock: rewrite jars.lock; path: the cache folder; "
        "spark-jars: the connector's jars for spark-submit --jars",
    )
    args = parser.parse_args(argv)
    try:
        if args.verb == "lock":
            write_lock()
            print(f"wrote {LOCK_FILE}")
        elif args.verb == "path":
            print(cache_root())
        elif args.verb == "spark-jars":
            print(spark_kafka_jars())
        else:
            for name in JAR_SETS:
                ensure_jars(name, progress=True)
    except JarError as exc:
        print(f"jars: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
