"""Loopback ports for the embedded services: several asked for at once are distinct."""

from __future__ import annotations

import socket

from infra.process import free_ports


def test_ports_asked_for_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(ports) == 64 and len(set(ports)) == 64
    for port in ports[:8]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free again once the helper returned
