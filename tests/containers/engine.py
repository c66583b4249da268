"""Is a Docker engine reachable? One answer per session, one reason when there is none."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

DEFAULT_SOCKET = Path("/var/run/docker.sock")


@functools.cache
def docker_engine_problem() -> str | None:
    """Why no Docker engine can be used here, or None if one answers a ping."""
    host = os.environ.get("DOCKER_HOST")
    if not host and not DEFAULT_SOCKET.exists():
        return f"no Docker engine: DOCKER_HOST is unset and {DEFAULT_SOCKET} does not exist"
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as e:  # permission denied, engine down, bad DOCKER_HOST: no engine
        return f"no Docker engine answered at {host or DEFAULT_SOCKET} ({type(e).__name__})"
    return None


def require_docker() -> None:
    """Skip the calling test module, with the one reason, when no engine is reachable."""
    problem = docker_engine_problem()
    if problem is not None:
        pytest.skip(f"container tier needs Docker: {problem}", allow_module_level=True)
