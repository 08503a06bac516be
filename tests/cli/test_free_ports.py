"""Ports for local members come from below the kernel's ephemeral range, so a restarted member finds its port."""

from __future__ import annotations

import socket
from pathlib import Path

from cli.cluster import HOST, PORT_FLOOR, free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if ephemeral_low - PORT_FLOOR >= 1000:
        assert all(PORT_FLOOR <= port < ephemeral_low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((HOST, port))
