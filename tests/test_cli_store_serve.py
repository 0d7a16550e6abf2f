"""``lightrail store serve`` (lightrail/cli/store_serve.py): the store server with the dashboard under ``/ui``, one
command, one port, one set of tokens. The real command in its own process on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys

import httpx

LIGHTRAIL = [sys.executable, "-m", "lightrail"]


def test_the_store_serves_the_dashboard_with_its_own_tokens(tmp_path):
    proc = subprocess.Popen(
        [*LIGHTRAIL, "store", "serve", "--db", "store.db", "--token", "s3cret", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
        assert proc.stdout.readline().strip() == f"dashboard: {url}/ui/ (same tokens)"
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/v1/counts").status_code == 401  # the API: a bearer token or nothing
            page = http.get("/ui/", headers={"authorization": "Bearer s3cret"})
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert "default-src 'self'" in page.headers["content-security-policy"]
            to_sign_in = http.get("/ui/failures")  # a page without a token: the sign-in form, not a 401
            assert to_sign_in.status_code == 303 and to_sign_in.headers["location"].startswith("/ui/login")
            signed_in = http.post("/ui/login", data={"token": "s3cret", "next": "/ui/failures"})
            assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui/failures"
            assert "Secure" not in signed_in.headers["set-cookie"]  # plain HTTP (tests/test_tls.py: HTTPS)
            assert http.get("/ui/failures").status_code == 200  # the cookie now
            refused = http.post("/ui/login", data={"token": "nope", "next": "/ui/"})
            assert refused.status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
