"""A reverse proxy in front of hypd that adds `Authorization: Bearer <token>` to every
request, for the official MCP conformance suite (test_conformance.py runs it).

Why it exists: hypd answers /mcp only to a caller with a token, and the suite's
`conformance server --url` sends none and has no option to. The proxy changes nothing
else: method, path, query, body and every other header go through as sent (Host and
Origin too: the suite's DNS-rebinding scenario sends `Host: evil.example.com` and must
meet hypd's own Host check, not the proxy's), and answers come back as hypd wrote them,
`text/event-stream` ones chunk by chunk as they arrive (GET notification streams, POST
answers that carry progress before their result). When the suite drops a stream, the
proxy drops hypd's: a session has one GET stream at a time, so a stream left open
upstream would refuse the suite's next one.

Test code only: hypd has no switch that serves /mcp without a token, and gets none.

Alone, against a running hypd (prints the URL it listens on, then serves until killed):
    HYPD_TOKEN=<token> python end2end/py/conformance.py http://127.0.0.1:3099
"""

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys

import httpx
import uvicorn

# Headers about one connection, not the request (RFC 9110 7.6.1); each hop sets its own.
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}


class TokenProxy:
    """An ASGI app forwarding every HTTP request to `upstream` (scheme://host:port)."""

    def __init__(self, upstream: str, token: str):
        # No read timeout: a GET stream is silent until hypd has something to say.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=None))
        self.upstream = upstream.rstrip("/")
        self.authorization = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        # httpx sends a Host header it is given instead of making one from the URL.
        headers = [
            (k, v)
            for k, v in scope["headers"]
            if k.lower() not in HOP_BY_HOP and k.lower() not in (b"authorization", b"content-length")
        ]
        headers.append((b"authorization", self.authorization))
        url = self.upstream + scope["raw_path"].decode()
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode()
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        response = await self.client.send(request, stream=True)
        try:

            async def relay():
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP],
                    }
                )
                # Raw bytes: as hypd encoded them, sent on as soon as they arrive.
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})

            async def disconnected():
                while (await receive())["type"] != "http.disconnect":
                    pass

            relaying = asyncio.ensure_future(relay())
            watching = asyncio.ensure_future(disconnected())
            await asyncio.wait({relaying, watching}, return_when=asyncio.FIRST_COMPLETED)
            watching.cancel()
            if not relaying.done():
                relaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relaying
        finally:
            await response.aclose()


def serve(upstream: str, token: str) -> None:
    """Serves on a free loopback port, bound (and printed) before serving: the port is
    held from the start, so no other process can take it in between."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"proxy listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        TokenProxy(upstream, token), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def proxy(upstream: str, token: str):
    """The proxy in its own process for the length of the block; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, upstream],
        env={**os.environ, "HYPD_TOKEN": token},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"proxy listening on (http://\S+)", line)
        assert m, f"the proxy did not start: {line!r}"
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.environ.get("HYPD_TOKEN"):
        sys.exit("usage: HYPD_TOKEN=<token> python conformance.py <hypd URL, e.g. http://127.0.0.1:3099>")
    serve(sys.argv[1], os.environ["HYPD_TOKEN"])
