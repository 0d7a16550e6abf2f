"""Where a server is reachable from: the one check every ``serve`` command makes before binding without a token."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, ``localhost``). A host name is treated as exposed:
    where it resolves is not known here."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
