# One image for every long-running process of the product (lbctl stream, control, simulate,
# agent); Java is there for the Spark job.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY loadbalance ./loadbalance
COPY lbctl ./lbctl
COPY streaming ./streaming
COPY controller ./controller
COPY producers ./producers
COPY infra ./infra
RUN pip install --no-cache-dir .
ENTRYPOINT ["lbctl"]
