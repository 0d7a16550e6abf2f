"""TLS on the servers users start by hand: ``lightrail store serve`` and ``lightrail gateway serve`` with
``--tls-cert/--tls-key``, reached by the real clients (the store client's lean transport, the gateway's own hop to
the store, the ``openai`` client) that trust a throwaway CA, and refused by clients that do not."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time

import httpx
import openai
import pytest
import trustme

from lightrail.store.client import SyncStoreClient
from tests._served import free_port, served

LIGHTRAIL = [sys.executable, "-m", "lightrail"]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A CA (``ca``) and a certificate it signed for 127.0.0.1 and localhost (``cert``, ``key``), as PEM files."""
    root = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": root / "ca.pem", "cert": root / "server.pem", "key": root / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    issued.private_key_pem.write_to_path(str(files["key"]))
    for i, pem in enumerate(issued.cert_chain_pems):
        pem.write_to_path(str(files["cert"]), append=i > 0)
    return {name: str(path) for name, path in files.items()}


def _tls_args(tls_files: dict[str, str]) -> list[str]:
    return ["--tls-cert", tls_files["cert"], "--tls-key", tls_files["key"]]


def test_store_and_gateway_serve_https_to_clients_that_trust_the_ca(tls_files, tmp_path, monkeypatch):
    """A chat call over HTTPS to the gateway, recorded by the gateway over HTTPS into the store, read back over
    HTTPS by the store client; clients without the CA are refused, and plain HTTP gets no answer."""
    store_port, gateway_port = free_port(), free_port()
    monkeypatch.setenv("SSL_CERT_FILE", tls_files["ca"])  # how the store client (and the gateway) trust a private CA
    store_cmd = [*LIGHTRAIL, "store", "serve", "--db", str(tmp_path / "store.db"), "--port", str(store_port)]
    with served([*store_cmd, "--token", "s3cret", *_tls_args(tls_files)], store_port, tmp_path / "store.log", 60,
                ca_file=tls_files["ca"]) as store_server:  # fmt: skip
        gateway_cmd = [*LIGHTRAIL, "gateway", "serve", "--fake", "--record", "--port", str(gateway_port)]
        gateway_cmd += ["--store", store_server.root, "--store-token", "s3cret", "--token", "gw", *_tls_args(tls_files)]
        with served(gateway_cmd, gateway_port, tmp_path / "gateway.log", 90, ca_file=tls_files["ca"]) as gateway:
            trusted = httpx.Client(verify=ssl.create_default_context(cafile=tls_files["ca"]))
            client = openai.OpenAI(base_url=gateway.url, api_key="gw", http_client=trusted, max_retries=0)
            reply = client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "echo over tls"}], user="tls-user"
            )
            assert "echo over tls" in reply.choices[0].message.content  # the fake backend echoes

            untrusting = openai.OpenAI(
                base_url=gateway.url, api_key="gw", http_client=httpx.Client(verify=True, trust_env=False),
                max_retries=0,
            )  # fmt: skip
            with pytest.raises(openai.APIConnectionError) as refused:
                untrusting.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
            assert isinstance(refused.value.__cause__, httpx.ConnectError)
            assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value.__cause__)
            with pytest.raises(httpx.HTTPError):  # plain HTTP to a TLS port: no HTTP answer comes back
                httpx.get(f"http://127.0.0.1:{gateway_port}/health", timeout=5)

            signed_in = trusted.post(f"{store_server.root}/ui/login", data={"token": "s3cret", "next": "/ui/"})
            assert signed_in.status_code == 303  # the dashboard's cookie travels over HTTPS only
            assert "Secure" in signed_in.headers["set-cookie"] and "HttpOnly" in signed_in.headers["set-cookie"]

            store = SyncStoreClient(store_server.root, token="s3cret")
            spans = []
            for _ in range(100):  # the gateway records in the background: poll, bounded
                served_rollouts = [r for r in store.query_rollouts() if r.mode == "served"]
                spans = [s for r in served_rollouts for s in store.query_spans(r.rollout_id)]
                if spans:
                    break
                time.sleep(0.1)
            assert any("echo over tls" in str(span.attributes) for span in spans), spans
            store.close()


@pytest.mark.parametrize("command", [["store", "serve", "--db", ":memory:"], ["gateway", "serve", "--fake"]])
def test_bad_tls_options_are_named_before_binding(command, tls_files, tmp_path):
    """A key without its certificate, a missing file, or a key that does not match: exit 2 with one line."""
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    cases = {
        "go together": ["--tls-key", tls_files["key"]],
        "no such file": ["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", tls_files["key"]],
        "cannot load certificate": ["--tls-cert", tls_files["cert"], "--tls-key", str(other_key)],
    }
    store_arg = ["--store", str(tmp_path / "s.db")] if command[0] == "gateway" else []
    for message, tls_args in cases.items():
        done = subprocess.run(
            [*LIGHTRAIL, *command, *store_arg, "--port", str(free_port()), *tls_args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and message in done.stderr, (message, done.stderr)
