"""The ports a local Ray head is given: distinct, free, one per flag `ray start --head` opens."""

from __future__ import annotations

import socket

from infra.local_cluster import HEAD_PORT_FLAGS, free_ports, head_ports


def test_free_ports_are_distinct_and_bindable():
    # Drawn one at a time (bind port 0, close, repeat), a port repeated within these 20 rounds in 47
    # of 50 trials on this machine; CI once gave two Ray components one port that way.
    for _ in range(20):
        ports = free_ports(64)
        assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out (nothing else on this machine took it since)


def test_head_ports_give_every_flag_its_own_port():
    ports = head_ports()
    assert tuple(ports) == HEAD_PORT_FLAGS and len(set(ports.values())) == len(HEAD_PORT_FLAGS)
    assert all(1024 < p < 65536 and not 10002 <= p <= 19999 for p in ports.values())  # not Ray's worker ports
