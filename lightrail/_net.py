"""How a server is exposed: the checks every ``serve`` command makes before binding (loopback or a token; TLS files
that load; a token sent in clear text) and the TLS options they share."""

from __future__ import annotations

import argparse
import ipaddress
import sys

__all__ = ["add_tls_arguments", "clear_text_warning", "is_loopback_host", "refuse_to_serve", "tls_problem"]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, ``localhost``). A host name is treated as exposed:
    where it resolves is not known here."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tls-cert`` / ``--tls-key``, the same on every ``serve`` command."""
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain) file, with --tls-key; clients trust a private CA through "
        "SSL_CERT_FILE",
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")


def tls_problem(cert: str | None, key: str | None) -> str | None:
    """Why ``--tls-cert``/``--tls-key`` cannot serve (one line for the command to print), or None. The pair is loaded
    once here so that a wrong path, a key that does not match or an unreadable file is named before binding, not
    by a traceback from the server's startup."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        return "--tls-cert and --tls-key go together"
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        return f"TLS: no such file: {exc.filename}"
    except (ssl.SSLError, OSError) as exc:
        return f"TLS: cannot load certificate {cert!r} with key {key!r}: {exc}"
    return None


def clear_text_warning(host: str, token: str | None, tls: bool) -> str | None:
    """A warning for a token that would cross the network unencrypted (a non-loopback bind without TLS)."""
    if token and not tls and not is_loopback_host(host):
        return (
            f"serving {host} over plain HTTP: the bearer token crosses the network in clear text; "
            "pass --tls-cert/--tls-key or put a TLS proxy in front"
        )
    return None


def refuse_to_serve(command: str, args: argparse.Namespace, token_env: str) -> bool:
    """The checks of a ``serve`` command before it binds, with ``args.host``, ``token``, ``insecure_no_token``,
    ``tls_cert`` and ``tls_key``: print why it must not serve (and return True), or warn about a token that would
    travel in clear text and return False."""
    if not args.token and not is_loopback_host(args.host) and not args.insecure_no_token:
        print(
            f"{command}: refusing to bind {args.host} without a token; pass --token (or set {token_env}), "
            "or --insecure-no-token if the network is trusted.",
            file=sys.stderr,
        )
        return True
    problem = tls_problem(args.tls_cert, args.tls_key)
    if problem is not None:
        print(f"{command}: {problem}", file=sys.stderr)
        return True
    warning = clear_text_warning(args.host, args.token, bool(args.tls_cert))
    if warning is not None:
        print(f"{command}: warning: {warning}", file=sys.stderr)
    return False
