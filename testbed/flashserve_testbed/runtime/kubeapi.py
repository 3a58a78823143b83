"""A small asyncio Kubernetes client (aiohttp): list, watch, get and status patches, enough for the runtime.

Credentials come from a kubeconfig (or the in-cluster service account) through the `kubernetes` package's
loader, so every auth form it understands works; the requests themselves are async so one event loop can
watch pods, supervise engines and proxy traffic without threads.
"""

from __future__ import annotations

import json
import ssl
from typing import AsyncIterator
from urllib.parse import quote

import aiohttp


class ApiError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


class KubeAPI:
    def __init__(self, host: str, ssl_context: ssl.SSLContext | bool | None, headers: dict[str, str],
                 ca_file: str | None = None):
        self.host = host.rstrip("/")
        self.ssl = ssl_context
        self.headers = headers
        self.ca_file = ca_file  # the API server's CA, handed on to the pods' own kubeconfigs
        self._session: aiohttp.ClientSession | None = None

    def ca_pem(self) -> bytes | None:
        if not self.ca_file:
            return None
        with open(self.ca_file, "rb") as fh:
            return fh.read()

    @classmethod
    def from_kubeconfig(cls, path: str | None) -> "KubeAPI":
        from kubernetes import client, config

        cfg = client.Configuration()
        if path:
            config.load_kube_config(config_file=str(path), client_configuration=cfg, persist_config=False)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg, persist_config=False)
        ctx: ssl.SSLContext | bool | None = None
        if cfg.host.startswith("https"):
            if cfg.verify_ssl:
                ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            else:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        headers = {"Accept": "application/json"}
        token = cfg.get_api_key_with_prefix("authorization") if cfg.api_key else None
        if token:
            headers["Authorization"] = token
        return cls(cfg.host, ctx, headers, cfg.ssl_ca_cert or None)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # read_bufsize bounds one watch line (one object) at twice its size
            self._session = aiohttp.ClientSession(headers=self.headers, read_bufsize=2**20,
                                                  connector=aiohttp.TCPConnector(ssl=self.ssl, limit=16))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str, params: dict | None = None, timeout: float = 30) -> dict:
        async with self.session.get(self.host + path, params=params,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text)

    async def post(self, path: str, body: dict, timeout: float = 30) -> dict:
        async with self.session.post(self.host + path, data=json.dumps(body), timeout=aiohttp.ClientTimeout(total=timeout),
                                     headers={"Content-Type": "application/json"}) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text)

    async def watch(self, path: str, params: dict, timeout_seconds: int = 240) -> AsyncIterator[dict]:
        """Events of one watch request; ends when the server closes it (after `timeout_seconds`)."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + 30, sock_connect=10, sock_read=timeout_seconds + 30)
        async with self.session.get(self.host + path, params=query, timeout=timeout) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                line = line.strip()
                if line:
                    yield json.loads(line)

    async def patch_pod_status(self, namespace: str, name: str, body: dict) -> dict:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/status"
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        async with self.session.patch(self.host + path, data=json.dumps(body), headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=30)) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text)
