"""``lightrail gateway serve``: run the gateway in front of an OpenAI-compatible upstream (vLLM) or the embedded
engine, recording agents' calls into a store.

    lightrail gateway serve --store lightrail.db --upstream http://127.0.0.1:8000 --token "$TOKEN"
    lightrail gateway serve --store http://127.0.0.1:8800 --model tiny
    lightrail gateway serve --store prod.db --model runs/x/final --record --retention-days 30 --redact app:scrub
    lightrail gateway serve --store prod.db --policies policies/ --record   # serve what `lightrail learn` promotes
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from lightrail._net import add_tls_arguments, refuse_to_serve
from lightrail._serving import tls_options
from lightrail.store.options import TOKEN_ENV, add_store_arguments, given_store

__all__ = ["add_parser"]

_EXAMPLES = """examples:
  lightrail gateway serve --store http://127.0.0.1:4747 --store-token s3cret --upstream http://127.0.0.1:8000/v1
  lightrail gateway serve --store runs/store.db --model tiny
  lightrail gateway serve --store prod.db --model runs/x/final --record --retention-days 30"""

log = logging.getLogger("lightrail.gateway")


def add_parser(subparsers: Any) -> None:
    """Register ``gateway serve`` on the ``lightrail`` command's subparsers."""
    parser = subparsers.add_parser(
        "gateway",
        help="OpenAI-compatible endpoint that records agents' LLM calls",
        description="An OpenAI- and Anthropic-compatible endpoint in front of a model: each call an agent makes on "
        "a rollout's route is recorded as a span in the store, with token ids and logprobs.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="gateway_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: parser.print_help() or 2)

    serve = sub.add_parser(
        "serve",
        help="serve the gateway (one span per routed call into --store)",
        description="Serve the gateway in front of an OpenAI-compatible upstream (vLLM), the embedded engine or a "
        "scripted fake. Calls on /rollouts/{rid}/attempts/{aid}/v1/... are recorded as spans of that attempt in "
        "--store; a model name the gateway does not serve is answered by the model it serves (the one being "
        "trained), on purpose, and each span records both names. Binds 127.0.0.1 by default; binding any other "
        "address requires --token.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8900, help="port (default: 8900)")
    serve.add_argument(
        "--token",
        default=os.environ.get("LIGHTRAIL_GATEWAY_TOKEN"),
        help="require 'Authorization: Bearer TOKEN' (default: $LIGHTRAIL_GATEWAY_TOKEN; none if unset, which "
        "is refused for a --host other than this machine)",
    )
    add_store_arguments(
        serve,
        store_help="where the spans go: store server URL, SQLite file or postgresql:// URL",
        token_help="the store server's admin token ($LIGHTRAIL_STORE_TOKEN, the old name, still works)",
    )
    if serve.get_default("store_token") is None:
        serve.set_defaults(store_token=os.environ.get("LIGHTRAIL_STORE_TOKEN"))
    backend = serve.add_mutually_exclusive_group()
    backend.add_argument("--upstream", metavar="URL", help="OpenAI-compatible server to forward to (e.g. vLLM)")
    backend.add_argument("--model", metavar="NAME_OR_PATH", help="serve this model with the embedded engine")
    backend.add_argument("--fake", action="store_true", help="answer with the scripted fake backend (echo)")
    serve.add_argument(
        "--upstream-api-key",
        default=os.environ.get("LIGHTRAIL_UPSTREAM_API_KEY"),
        help="API key sent to --upstream (default: $LIGHTRAIL_UPSTREAM_API_KEY)",
    )
    serve.add_argument("--served-model", help="model name sent upstream whatever the agent asks for")
    serve.add_argument(
        "--no-upstream-token-ids",
        action="store_true",
        help="do not ask the upstream for token ids (servers that reject vLLM's return_token_ids)",
    )
    serve.add_argument(
        "--record",
        action="store_true",
        help="also record served calls (the /v1 routes, production traffic) into the store, grouped into sessions "
        "(x-lightrail-session header, else the request's user / metadata.session_id, else one per call) that "
        "feedback rewards later (POST /v1/feedback on the store, lightrail.feedback)",
    )
    serve.add_argument(
        "--redact",
        metavar="MODULE:FUNCTION",
        help="with --record: a function called with each served call's span before it is stored; it returns the "
        "span to store (edited as needed) or None to store nothing",
    )
    serve.add_argument(
        "--retention-days",
        type=float,
        metavar="DAYS",
        help="with --record: delete served sessions older than this (checked hourly; default: keep them)",
    )
    serve.add_argument(
        "--policies",
        metavar="DIR",
        help="serve the current policy of a policies folder (what `lightrail learn` promotes) with the embedded "
        "engine and swap each new promotion in without failing a request (in-flight calls finish on the old "
        "weights); a new folder starts from --model as version 0",
    )
    serve.add_argument(
        "--poll-s", type=float, default=5.0, help="with --policies: seconds between checks for a new policy"
    )
    serve.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body (default: 16)")
    serve.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="how much to log to stderr (default: warning)",
    )
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow binding a non-loopback address without a token (anyone who can reach it can use the model)",
    )
    add_tls_arguments(serve)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    if refuse_to_serve("lightrail gateway serve", args, "LIGHTRAIL_GATEWAY_TOKEN"):
        return 2
    from lightrail.store import store_kind

    if given_store("gateway serve", args) is None:
        return 2
    try:
        store_kind(args.store)  # before anything is made (a policies folder, a model)
    except ValueError as exc:
        print(f"lightrail gateway serve: --store: {exc}", file=sys.stderr)
        return 2
    if (args.redact or args.retention_days is not None) and not args.record:
        print("lightrail gateway serve: --redact and --retention-days apply to --record", file=sys.stderr)
        return 2
    if args.retention_days is not None and args.retention_days <= 0:
        print("lightrail gateway serve: --retention-days must be > 0", file=sys.stderr)
        return 2
    if args.policies:
        from lightrail.engine.promotions import PolicyRegistry

        registry = PolicyRegistry(args.policies)
        if args.upstream or args.fake:
            print("lightrail gateway serve: --policies serves with the embedded engine (not --upstream/--fake)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if registry.current() is None:
            if not args.model:
                print(
                    f"lightrail gateway serve: --policies {args.policies}: no current.json there; give --model "
                    "(the initial policy, version 0)",
                    file=sys.stderr,
                )
                return 2
            from lightrail.engine.models import prepare_model

            registry.init(prepare_model(args.model))
    elif not (args.upstream or args.model or args.fake):
        print("lightrail gateway serve: give one of --upstream, --model, --fake or --policies", file=sys.stderr)
        return 2
    redact = None
    if args.redact:
        from lightrail.gateway.recording import load_redactor

        try:
            redact = load_redactor(args.redact)
        except (ImportError, ValueError) as exc:
            print(f"lightrail gateway serve: --redact {args.redact}: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lightrail._errors import one_line
    from lightrail._serving import run
    from lightrail.store import StoreError

    try:
        run(_run(args, redact))
    except KeyboardInterrupt:
        pass
    except (OSError, StoreError) as exc:  # a busy port, a store that fails at startup
        print(f"lightrail gateway serve: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0


async def _run(args: argparse.Namespace, redact: Any = None) -> None:
    from lightrail._serving import bind, serve_app_async
    from lightrail.gateway.app import create_gateway_app
    from lightrail.gateway.backends import close_backend
    from lightrail.store import check_store, open_store

    sock = bind(args.host, args.port, listen=False)  # a busy port fails now, not after the model has loaded
    store = open_store(args.store, token=args.store_token)
    try:
        routes = ("query_attempts", "add_spans", *(("open_session", "delete_sessions") if args.record else ()))
        await check_store(store, routes, token_hint=f"the store's admin token with --store-token or ${TOKEN_ENV}")
        backend = await _open_backend(args)
    except BaseException:
        sock.close()
        await store.close()
        raise
    watcher = None
    if args.policies:
        from lightrail.engine.promotions import PolicyRegistry, PolicyWatcher

        watcher = PolicyWatcher(PolicyRegistry(args.policies), backend, poll_s=args.poll_s)
        watcher.start()
    sessions = None
    if args.record:
        from lightrail.gateway.recording import SessionRecorder

        retention_s = None if args.retention_days is None else args.retention_days * 86400.0
        sessions = SessionRecorder(store, redact=redact, retention_s=retention_s)
    try:
        app = create_gateway_app(
            backend,
            store,
            token=args.token,
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            sessions=sessions,
        )
        models = ", ".join(backend.model_names())
        recording = " recording served traffic" if args.record else ""
        await serve_app_async(
            app,
            "lightrail gateway",
            host=args.host,
            port=args.port,
            tls=tls_options(args.tls_cert, args.tls_key),
            detail=f" (models: {models}){recording}",
            log_level=args.log_level,
            sock=sock,
        )
    finally:
        sock.close()
        if watcher is not None:
            await watcher.close()
        await close_backend(backend)
        await store.close()


async def _open_backend(args: argparse.Namespace) -> Any:
    if args.upstream:
        from lightrail.gateway.backends import OpenAIUpstream

        upstream = OpenAIUpstream(
            args.upstream,
            api_key=args.upstream_api_key,
            model=args.served_model,
            request_token_ids=not args.no_upstream_token_ids,
        )
        try:
            await upstream.refresh_models()
        except Exception as exc:  # the upstream may start after us; /v1/models is then empty until it is up
            log.warning("could not list the upstream's models: %r", exc)
        return upstream
    if args.fake:
        from lightrail.gateway.fake import ScriptedBackend

        return ScriptedBackend(model=args.served_model or "scripted-fake")
    # The engine is imported only here: the gateway package never depends on it.
    from lightrail.engine import Engine
    from lightrail.engine.models import prepare_model

    if args.policies:
        from lightrail.engine.promotions import PolicyRegistry

        current = PolicyRegistry(args.policies).current()
        assert current is not None  # checked in _serve
        return Engine.from_pretrained(current.path, policy_version=current.version, name="policy")
    return Engine.from_pretrained(prepare_model(args.model))
