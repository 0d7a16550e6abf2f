"""The embedded engine: serves a transformers causal LM to many concurrent callers with continuous batching.

Concurrency model
-----------------
* One asyncio event loop owns every piece of engine state (the request queue, the running batch, stats, the
  admission gate). No locks are needed for it: only coroutines on that loop touch it. The engine binds to the
  loop of its first call; calls made from any other loop (another thread, e.g. a trainer pushing weights while
  a server thread serves requests) are forwarded to it with ``run_coroutine_threadsafe``. If the bound loop
  has stopped (an earlier ``asyncio.run`` ended), the next call rebinds the engine to the caller's loop.
* All torch work (prefill, decode steps, weight loads) runs in ONE dedicated worker thread, one call at a time,
  so the event loop stays responsive and the model is never used by two threads at once. The tokenizer is used
  only on the loop (chat templates, stop strings, decoding results): HF fast tokenizers are not safe to share
  between threads.
* A single batcher task drives generation. When idle it waits for a request, then waits ``gather_window_s`` more
  so requests that arrive together are prefilled together. While decoding it admits queued requests at every
  step boundary (their prompts are prefilled as a group and their KV cache is merged into the running batch),
  drops finished rows, and resolves each request as soon as all of its rows are done.
* `Engine.update_weights` closes admission, waits until the running batch has drained (in-flight generations
  finish with the weights they started with), loads the new weights in place in the worker thread, bumps
  `policy_version` and reopens admission. Requests that arrive meanwhile wait in the queue and run on the new
  weights; each `Generation` reports the version that produced every one of its tokens.

Decoding
--------
Each prefill group is a left-padded batch with a per-row attention mask and explicit position ids over a
`DynamicCache`, computing the last position's logits only; its keys and values then go to the next free rows of the
running batch's cache, and each decode step feeds one token per row. ``kv_cache="concat"`` (the default) keeps
transformers' `DynamicCache`, concatenated every step and merged when rows join. Opt-in, measured in
``bench/engine.py`` against it but not yet on a quiet machine (bench/RESULTS.md), so not the default:
``kv_cache="slots"`` (`kv.SlotCache`: preallocated per row, each step's keys and values written in place, finished
rows' slots reused), ``fused_decode`` (with slots, Llama-family models decode through `decode.FusedDecode`: the same
arithmetic in fewer calls) and ``packed_weights`` (on a CPU every weight matrix packed for oneDNN, `kernels`; it
makes each weight update re-pack them). Models whose cache is not plain full attention always use ``concat``. The precision it samples in is the model's dtype
(`CPU_DTYPE` by default on a CPU). Per-row sampling parameters: temperature, top_p, seed (a private ``torch.Generator`` per row,
so a seeded request draws the same tokens whatever else shares the batch), stop strings, max_tokens, ``n`` (a
request with ``n > 1`` becomes ``n`` rows, each its own choice), presence/frequency penalties and logit_bias
(`sampling.LogitProcessors`: kept per batch only while some row uses them), structured-output masks, and
top_logprobs.

Prompt prefixes that recent prompts shared (an agent's system prompt, worked examples, tools) are prefilled once and
their keys and values reused (`prefix_cache.PrefixCache`; ``prefix_cache=False`` turns it off; cleared on every
weight update): a request's prompt is then prefilled from where its cached prefix ends. ``stats`` counts the
tokens prefilled (``prompt_tokens``) and those taken from the cache (``cached_prompt_tokens``).

Logprobs: the value reported for a sampled token is ``log_softmax(logits / temperature)[token]`` -- the
temperature-scaled distribution *before* top-p truncation (what PPO-style ratios against a trainer that applies
the same temperature expect). For greedy rows (temperature 0) it is ``log_softmax(logits)[token]``, the
untempered model distribution. ``logits`` are the ones actually sampled from: after the presence/frequency
penalties (counted over the row's own generated tokens), the logit bias and the grammar mask. When any of those
applies, `Generation.logprobs_processed` names it (``"presence_penalty"``, ``"frequency_penalty"``,
``"logit_bias"``, the constraint kind) so a trainer knows the logprobs are not the model's raw distribution.
``top_logprobs`` are the most likely entries of that same distribution, so the sampled token's logprob equals
its entry when it is among them.

Token ids and text (the rule that makes ``Choice.token_ids`` decode to exactly the generated text):

* the raw text is always ``decode(token_ids)`` with ``skip_special_tokens=True`` (see `Engine.decode`); it is
  ``Choice.text`` unless tool calls were parsed out of it, in which case ``text`` is the content around them;
* a row that stops on an end-of-sequence token keeps that token as its last id (the model sampled it; training
  needs its logprob); it decodes to nothing;
* a row that stops on a stop string is cut to the longest prefix of its tokens whose decoding is a prefix of the
  text before the stop string. The stop string is excluded from text and ids, as in OpenAI. When the stop
  string starts at a token boundary (the usual case) the text equals OpenAI's; when a token straddles the start
  of the stop string, that token is dropped too, so the text can be a few characters shorter than OpenAI's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from lightrail.engine import kernels
from lightrail.engine.chat import ChatFormat
from lightrail.engine.constraints import Constraint, apply_bitmask, build_grammar, grammars_for
from lightrail.engine.decode import FusedDecode
from lightrail.engine.kv import SlotCache
from lightrail.engine.prefix_cache import PrefixCache, PrefixEntry, supported
from lightrail.engine.sampling import LogitProcessors, draw, tempered_logprobs, top_logprobs
from lightrail.types import (
    BackendError,
    ChatRequest,
    Choice,
    CompletionRequest,
    FinishReason,
    Generation,
    SamplingParams,
)

__all__ = ["CPU_DTYPE", "KV_CACHES", "Engine", "configure_threads"]

THREADS_ENV = "LIGHTRAIL_TORCH_THREADS"

CPU_DTYPE = "float32"
"""The weights' dtype `Engine.from_pretrained` samples in on a CPU when none is given (the setting ``dtype``).
Its tokens and logprobs are the transformers float32 forward's (greedy equal, logprobs within 1e-4): what GRPO's
ratios assume. ``bfloat16`` (on CPUs
with bfloat16 matrix units, AMX / avx512_bf16) decodes faster still but its logprobs differ from the trainer's float32
ones; GRPO then corrects each token by truncated importance sampling (``config.is_cap``)."""

KV_CACHES = ("slots", "concat")
"""``kv_cache`` settings: ``slots`` (`lightrail.engine.kv.SlotCache`: preallocated per row, written in place) or
``concat`` (transformers' `DynamicCache`, concatenated every step and merged when rows join: the engine before
slots; kept for models whose cache is not plain full attention, and as the measured baseline)."""


def configure_threads() -> int:
    """Apply ``$LIGHTRAIL_TORCH_THREADS`` (if set) to torch's intra-op pool; returns the thread count in use.

    The one place lightrail decides torch threads. Called by the engine at construction and again inside its
    worker thread (OpenMP settings can be per thread).
    """
    value = os.environ.get(THREADS_ENV)
    if value:
        n = int(value) if value.strip().isdigit() else 0
        if n < 1:
            raise ValueError(f"{THREADS_ENV} must be a positive integer, got {value!r}")
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass(frozen=True)
class _ChatReading:
    """How a chat request's generated text is read back: the model's `ChatFormat`, whether tools were offered
    (and may be called), and whether at most one call is kept (``parallel_tool_calls: false``)."""

    format: ChatFormat
    tools: bool
    single_call: bool


@dataclass
class _Request:
    """A request waiting for, or being served by, the batcher."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    chat: _ChatReading | None
    """How to read a chat answer (reasoning, tool calls); None for text completions."""
    future: asyncio.Future
    rows: list[_Row] = field(default_factory=list)
    policy_version: int = 0
    constraint: Constraint | None = None
    """Structured output / forced tool calls: the grammar every row of this request follows."""


@dataclass
class _Row:
    """One sampled continuation (one choice) inside the running batch."""

    request: _Request
    index: int
    generator: torch.Generator
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_top: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per generated token, its ``params.top_logprobs`` most likely (id, logprob) pairs (when asked for)."""
    finish: str | None = None
    stop_cut: int | None = None
    """Number of ids kept when a stop string ended the row."""
    stop_string: str | None = None
    """The stop string that ended the row (the earliest in the text)."""
    stop_checked: int = 0
    """How many ids the stop-string check has seen."""
    matcher: Any = None
    """`constraints.RowMatcher` of a constrained request's row (created when the row is first sampled)."""


@dataclass
class _Batch:
    """The running batch: KV cache, attention mask over cache columns, next position and next input per row."""

    rows: list[_Row]
    cache: DynamicCache | SlotCache
    mask: torch.Tensor | None  # [B, T] long, 1 = real token column (`DynamicCache`; a `SlotCache` keeps its own)
    next_pos: torch.Tensor  # [B] long, position id of the token fed at the next step
    next_input: torch.Tensor  # [B] long, last sampled token
    temps: torch.Tensor  # [B] float
    top_ps: torch.Tensor  # [B] float
    processors: LogitProcessors | None = None
    """Penalties, logit biases and token counts; None while no row has a penalty or a bias (no cost)."""
    top_k: list[int] | None = None
    """``top_logprobs`` per row; None while no row asks for them (no cost)."""


class Engine:
    """An asyncio model server for one causal LM: chat and text completions with token ids and logprobs.

    >>> from lightrail.engine.models import prepare_model
    >>> engine = Engine.from_pretrained(prepare_model("tiny"))
    >>> hi = [{"role": "user", "content": "hi"}]
    >>> gen = await engine.chat(ChatRequest(model="tiny", messages=hi, sampling=SamplingParams(max_tokens=4)))
    >>> len(gen.prompt_ids) > 0, len(gen.choices[0].token_ids) == len(gen.choices[0].logprobs), gen.policy_version
    (True, True, 0)
    >>> await engine.close()

    Safe to call from any event loop or thread (see the module docstring). ``stats`` counts requests, batches (prefill groups),
    forward passes, tokens, weight updates, malformed tool calls, decode steps and the microseconds they took.

    Decoding settings (module docstring, "Decoding"): ``kv_cache`` (`KV_CACHES`), ``packed_weights`` (CPU: weight
    matrices packed for oneDNN; one packed copy of each beside the parameters) and ``fused_decode`` (the lean
    Llama-family step) change speed, not results: tokens and logprobs equal the transformers forward's to float32
    rounding (tests/engine/test_decode.py).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        gather_window_s: float = 0.005,
        max_batch_rows: int = 64,
        default_max_tokens: int | None = None,
        policy_version: int = 0,
        tool_format: str | None = None,
        reasoning: str | None = None,
        prefix_cache: bool = True,
        kv_cache: str = "concat",
        packed_weights: bool = False,
        fused_decode: bool = False,
    ):
        configure_threads()
        if gather_window_s < 0 or max_batch_rows < 1:
            raise ValueError("gather_window_s must be >= 0 and max_batch_rows >= 1")
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, not {kv_cache!r}")
        self.model = model.eval()
        self._tokenizer = tokenizer
        self.name = name or Path(str(getattr(model.config, "_name_or_path", "") or "model")).name or "model"
        self.gather_window_s = gather_window_s
        self.max_batch_rows = max_batch_rows
        self.default_max_tokens = default_max_tokens
        self.device = next(model.parameters()).device
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 2**31)
        self._policy_version = policy_version
        self._chat_format: ChatFormat | None = None
        self._format_names = (tool_format, reasoning)
        if getattr(tokenizer, "chat_template", None):
            self.chat_format  # noqa: B018 - an unknown tool format is a start-up error, not a failure per request
        self._eos_ids = self._find_eos_ids()
        plain = supported(self.model)
        self._prefixes = PrefixCache() if prefix_cache and plain else None
        self.kv_cache = kv_cache if plain else "concat"
        """The KV cache in use (`KV_CACHES`): ``concat`` unless ``slots`` was asked for and the model's cache is plain
        full attention on every layer."""
        self._slots: SlotCache | None = None
        self._fused = (
            FusedDecode(self.model, packed=packed_weights)
            if self.kv_cache == "slots" and fused_decode and FusedDecode.supports(self.model)
            else None
        )
        """The lean decode step of Llama-family models (`lightrail.engine.decode`); None: the model's forward."""
        self._packed = (
            kernels.PackedLinears(self.model, skip=self._fused.covered() if self._fused is not None else None)
            if packed_weights and self.device.type == "cpu" and kernels.available()
            else None
        )
        """The weight matrices packed for oneDNN (`lightrail.engine.kernels`); None off the CPU or when turned off."""
        # Only the last position's logits are sampled from: a prefill need not compute the LM head for every token.
        self._last_logits = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        )
        pad = tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else min(self._eos_ids, default=0)
        # forward_passes, batches, prompt/generated_tokens and max_rows_in_batch are written only by the worker
        # thread, the other counters only on the loop: no key has two writers.
        self.stats: dict[str, int] = {
            "requests": 0,
            "batches": 0,
            "forward_passes": 0,
            "prompt_tokens": 0,  # prefilled; the cached prefixes' tokens are counted apart:
            "cached_prompt_tokens": 0,
            "generated_tokens": 0,
            "max_rows_in_batch": 0,
            "weight_updates": 0,
            "malformed_tool_calls": 0,
            "decode_steps": 0,
            "decode_us": 0,  # time spent in decode steps (forward and sampling), microseconds
        }
        self.last_weight_update: dict[str, float] = {}
        """Seconds the last `update_weights` spent draining in-flight requests and loading weights."""
        self._worker = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="lightrail-engine", initializer=_init_worker
        )
        self._queue: list[_Request] = []
        self._batch: _Batch | None = None
        self._admitted: list[_Request] = []  # taken from the queue for the step now running, not yet in the batch
        self._admitting = True
        self._wakeup: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._update_lock: asyncio.Lock | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str | torch.device | None = None, dtype: Any = None, **kwargs: Any
    ) -> Engine:
        """Load a model directory (see `lightrail.engine.models.prepare_model`) onto ``device``.

        A peft LoRA adapter folder (``adapter_config.json``, e.g. from ``lightrail export`` without ``--merge``) is
        served as its base model (``base_model_name_or_path``) with the adapter merged in.

        ``device`` defaults to the first CUDA GPU when there is one, else the CPU; ``dtype`` defaults to `CPU_DTYPE`
        (float32) on CPU and bfloat16 on a GPU that supports it. Other keyword arguments go to `Engine`.
        """
        configure_threads()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if dtype is None:
            cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
            dtype = (
                torch.bfloat16 if cuda_bf16 else torch.float32 if device.type == "cuda" else getattr(torch, CPU_DTYPE)
            )
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = _load_causal_lm(Path(path), dtype).to(device)
        kwargs.setdefault("name", Path(path).name)
        return cls(model, tokenizer, **kwargs)

    def _find_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self._tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(v for v in value if isinstance(v, int))
        return ids

    # -- public surface -------------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Version of the weights new requests will be served with (bumped by `update_weights`)."""
        return self._policy_version

    @property
    def tokenizer(self) -> Any:
        """The tokenizer whose ids appear in every `Generation`."""
        return self._tokenizer

    def model_names(self) -> list[str]:
        """Names this engine answers to. Requests may name any model; they are all served by this one."""
        return [self.name]

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` by the engine's rule (special tokens such as EOS dropped, no space clean-up)."""
        return self._tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    async def chat(self, request: ChatRequest) -> Generation:
        """Answer an OpenAI-style chat request: the prompt rendered with the model's chat template, the answer read
        in its family's formats (`ChatFormat.parse`: ``reasoning``, content, ``tool_calls``)."""
        if (home := self._home_loop()) is not None:
            return await _run_on(home, self.chat(request))
        ids = self._prompt_ids(request)
        reading = _ChatReading(
            self.chat_format,
            bool(request.tools) and request.tool_choice != "none",
            request.parallel_tool_calls is False,
        )
        constraint = await self._constraint(request)
        return await self._generate(ids, request.sampling, reading, constraint)

    async def count_tokens(self, request: ChatRequest) -> int:
        """Tokens of the prompt `chat` would generate from: the chat template applied to the messages and tools."""
        if (home := self._home_loop()) is not None:
            return await _run_on(home, self.count_tokens(request))
        return len(self._prompt_ids(request))

    @property
    def chat_format(self) -> ChatFormat:
        """The model's chat template and formats (tool calls, reasoning), built on first use. Raises
        `lightrail.engine.formats.UnknownFormatError` for a template whose tool markup is unknown and no
        ``tool_format`` was given."""
        if self._chat_format is None:
            tool_format, reasoning = self._format_names
            self._chat_format = ChatFormat(self._tokenizer, tool_format=tool_format, reasoning=reasoning)
        return self._chat_format

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        """The token ids of a chat request's prompt, its tools offered and the assistant turn opened."""
        if not isinstance(request.messages, list) or not request.messages:
            raise BackendError("messages must be a non-empty list", param="messages")
        try:
            text = self.chat_format.render(request.messages, request.tools or None)
        except BackendError:
            raise
        except Exception as exc:  # template errors are the caller's message shapes, not engine crashes
            raise BackendError(f"could not render the chat template: {exc}", param="messages") from exc
        dropped = self.chat_format.dropped(request.messages, text)
        if dropped is not None:  # trained on, the call would teach an answer to a prompt the agent did not send
            role = request.messages[dropped].get("role")
            raise BackendError(
                f"messages[{dropped}]: the model's chat template drops this {role!r} message (its text is not in the "
                "rendered prompt); send it in a role the template renders",
                param=f"messages[{dropped}].role",
                code="message_dropped_by_template",
            )
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    async def _constraint(self, request: ChatRequest) -> Constraint | None:
        """The compiled grammar of a request with ``response_format`` or a forced ``tool_choice``, else None.

        The grammar library is imported, and the tokenizer wrapped for it, on the first such request. Compiling
        (on a cache miss) runs off the loop; a schema that does not compile is a `BackendError` naming its field."""
        if request.response_format is None and request.tool_choice in (None, "auto", "none"):
            return None
        vocab = int(getattr(self.model.config, "vocab_size", 0) or len(self._tokenizer))
        grammars = grammars_for(self._tokenizer, vocab, self._eos_ids)
        grammar = build_grammar(request, self.chat_format.format.tool, grammars.tags)
        if grammar is None:
            return None
        compiled = grammars.cached(grammar)
        if compiled is None:
            compiled = await asyncio.to_thread(grammars.compile, grammar)
        return Constraint(grammar.kind, grammars, compiled)

    async def complete(self, request: CompletionRequest) -> Generation:
        """Continue a text prompt (tokenized with the tokenizer's default special tokens, e.g. a BOS)."""
        if (home := self._home_loop()) is not None:
            return await _run_on(home, self.complete(request))
        if not isinstance(request.prompt, str):
            raise BackendError("prompt must be a string", param="prompt")
        ids = self._tokenizer(request.prompt)["input_ids"]
        return await self._generate(ids, request.sampling, None)

    async def update_weights(self, state_dict_or_model: Any, *, version: int | None = None) -> int:
        """Serve new weights: drain in-flight generations, copy the weights in place, bump `policy_version`.

        Accepts a state dict or a module with ``state_dict()`` whose keys and shapes match the served model (tied
        weights may be omitted). Tensors may live on any device or dtype; they are copied into the existing
        parameters (no reallocation). ``version`` sets the new version (it must be greater than the current);
        by default it is the current version + 1. Returns the new version.
        """
        if self._closed:
            raise BackendError("the engine is closed", status=503, code="engine_closed")
        if (home := self._home_loop()) is not None:
            return await _run_on(home, self.update_weights(state_dict_or_model, version=version))
        assert self._update_lock is not None and self._idle is not None
        state = state_dict_or_model.state_dict() if hasattr(state_dict_or_model, "state_dict") else state_dict_or_model
        new_version = self._policy_version + 1 if version is None else int(version)
        if new_version <= self._policy_version:
            raise ValueError(f"version must increase: {new_version} <= current {self._policy_version}")
        async with self._update_lock:
            self._admitting = False
            try:
                start = time.perf_counter()
                await self._idle.wait()
                if self._closed:  # closed while draining: `close` set `_idle` to release this wait
                    raise BackendError("the engine was closed", status=503, code="engine_closed")
                drained = time.perf_counter()
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._worker, self._load_state, state)
                self._policy_version = new_version
                self.stats["weight_updates"] += 1
                self.last_weight_update = {"drain_s": drained - start, "load_s": time.perf_counter() - drained}
            finally:
                self._admitting = True
                self._wake()
        return new_version

    async def close(self) -> None:
        """Stop the batcher, fail queued and running requests with a 503 `BackendError`, release the worker."""
        if self._closed:
            return
        if self._loop is not None and self._loop is not asyncio.get_running_loop() and self._loop.is_running():
            return await _run_on(self._loop, self.close())
        self._closed = True
        task = self._task
        if task is not None and not task.done() and self._loop is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        error = BackendError("the engine was closed", status=503, code="engine_closed")
        running = [r.request for r in self._batch.rows] if self._batch else []
        for req in self._queue + self._admitted + running:
            if not req.future.done():
                with contextlib.suppress(RuntimeError):  # a future of a loop that is already closed
                    req.future.set_exception(error)
        self._queue.clear()
        self._admitted = []
        self._batch = None
        if self._idle is not None:
            self._idle.set()  # a weight update waiting for the batch to drain would otherwise wait forever
        # A step may still be running in the worker: wait for it off the loop, so closing never blocks the loop.
        await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)

    # -- admission ------------------------------------------------------------------------------------------------

    def _validate(self, prompt_ids: list[int], p: SamplingParams) -> int:
        """Check a request against the model; returns the number of new tokens to allow per row."""
        if not prompt_ids:
            raise BackendError("the prompt is empty", param="prompt")
        if not isinstance(p.n, int) or not 1 <= p.n <= self.max_batch_rows:
            raise BackendError(f"n must be an integer in [1, {self.max_batch_rows}], got {p.n!r}", param="n")
        if not (isinstance(p.temperature, int | float) and math.isfinite(p.temperature) and p.temperature >= 0):
            raise BackendError(f"temperature must be a finite number >= 0, got {p.temperature!r}", param="temperature")
        if not (isinstance(p.top_p, int | float) and 0 < p.top_p <= 1):
            raise BackendError(f"top_p must be in (0, 1], got {p.top_p!r}", param="top_p")
        if not isinstance(p.stop, list) or not all(isinstance(s, str) and s for s in p.stop):
            raise BackendError("stop must be a list of non-empty strings", param="stop")
        if p.seed is not None and not isinstance(p.seed, int):
            raise BackendError(f"seed must be an integer, got {p.seed!r}", param="seed")
        self._validate_options(p)
        room = self.max_positions - len(prompt_ids)
        if room < 1:
            raise BackendError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {self.max_positions} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if p.max_tokens is None:
            return room if self.default_max_tokens is None else min(room, self.default_max_tokens)
        if not isinstance(p.max_tokens, int) or p.max_tokens < 1:
            raise BackendError(f"max_tokens must be a positive integer, got {p.max_tokens!r}", param="max_tokens")
        if p.max_tokens > room:
            raise BackendError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({p.max_tokens}) exceeds the model's context of "
                f"{self.max_positions} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return p.max_tokens

    def _validate_options(self, p: SamplingParams) -> None:
        """Check top_logprobs, the penalties and logit_bias (OpenAI's ranges; bias ids inside the vocabulary)."""
        if not (isinstance(p.top_logprobs, int) and 0 <= p.top_logprobs <= 20):
            raise BackendError(
                f"top_logprobs must be an integer in [0, 20], got {p.top_logprobs!r}", param="top_logprobs"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(p, name)
            if not (isinstance(value, int | float) and -2.0 <= value <= 2.0):
                raise BackendError(f"{name} must be a number in [-2, 2], got {value!r}", param=name)
        if not isinstance(p.logit_bias, dict):
            raise BackendError("logit_bias must map token ids to numbers", param="logit_bias")
        vocab = self._vocab_size()
        for key, value in p.logit_bias.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if not 0 <= token < vocab or isinstance(key, bool):
                raise BackendError(
                    f"logit_bias key {key!r} is not a token id of this model (0..{vocab - 1})", param="logit_bias"
                )
            if not (isinstance(value, int | float) and -100.0 <= value <= 100.0):
                raise BackendError(f"logit_bias values must be in [-100, 100], got {value!r}", param="logit_bias")

    def _vocab_size(self) -> int:
        """Width of the model's logits (may exceed the tokenizer's vocabulary: padded embedding matrices)."""
        head = self.model.get_output_embeddings()
        if head is not None and getattr(head, "weight", None) is not None:
            return int(head.weight.shape[0])
        return int(self.model.config.vocab_size)

    async def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        chat: _ChatReading | None,
        constraint: Constraint | None = None,
    ) -> Generation:
        if self._closed:
            raise BackendError("the engine is closed", status=503, code="engine_closed")
        max_new = self._validate(prompt_ids, params)
        req = _Request(list(prompt_ids), params, max_new, chat, asyncio.get_running_loop().create_future())
        req.constraint = constraint
        self.stats["requests"] += 1
        self._queue.append(req)
        self._wake()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.future.cancel()  # the batcher drops the rows of a cancelled request at the next step
            raise

    def _home_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop if the caller runs on another one, else None (binding the engine to the caller's
        loop on first use, or when the loop it was bound to has stopped, e.g. after an ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return None
        if self._loop is not None and self._loop.is_running() and not self._loop.is_closed():
            return self._loop
        # Requests of a dead loop can never be answered; start afresh on this one.
        self._queue.clear()
        self._admitted = []
        self._batch = None
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._update_lock = asyncio.Lock()
        self._task = loop.create_task(self._run(), name="lightrail-engine-batcher")
        return None

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _take_admissible(self) -> list[_Request]:
        """Queued requests (FIFO) that fit next to the running batch; none while a weight update is pending."""
        if not self._admitting:
            return []
        taken: list[_Request] = []
        free = self.max_batch_rows - (len(self._batch.rows) if self._batch else 0)
        while self._queue:
            req = self._queue[0]
            if req.future.done():  # cancelled while queued
                self._queue.pop(0)
                continue
            if req.params.n > free:
                break
            taken.append(self._queue.pop(0))
            free -= req.params.n
        return taken

    # -- the batcher ----------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wakeup is not None and self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = self._batch
            if batch is not None:
                for row in batch.rows:
                    if row.finish is None and row.request.future.done():
                        row.finish = "cancelled"  # the caller went away: stop spending compute on it
                if all(row.finish is not None for row in batch.rows):
                    self._batch = batch = None
            if batch is None:
                self._idle.set()
                if not (self._queue and self._admitting):
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if self.gather_window_s > 0:
                    await asyncio.sleep(self.gather_window_s)
            new = self._take_admissible()
            if not new and batch is None:
                continue
            self._idle.clear()
            for req in new:
                req.policy_version = self._policy_version
                req.rows = [_Row(req, i, self._row_generator(req.params.seed, i)) for i in range(req.params.n)]
            self._admitted = new  # `close` fails these too if it cancels this step (then they are in no batch)
            try:
                self._batch = await loop.run_in_executor(self._worker, self._step, batch, new)
            except Exception as exc:  # a failed forward fails the requests in it, never the batcher
                reqs = [r.request for r in batch.rows] if batch else []
                for req in reqs + new:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._admitted, self._batch = [], None
                continue
            self._admitted = []
            self._after_step()

    def _row_generator(self, seed: int | None, index: int) -> torch.Generator:
        gen = torch.Generator(device="cpu")
        # n rows of one seeded request get distinct but reproducible streams.
        gen.manual_seed((seed * 1_000_003 + index) % 2**63 if seed is not None else secrets.randbits(63))
        return gen

    def _after_step(self) -> None:
        """Check stop strings of the rows that just got a token and resolve requests whose rows are all done.

        Runs on the event loop: the tokenizer is only ever used from the loop thread."""
        batch = self._batch
        if batch is None:
            return
        finished: dict[int, _Request] = {}
        for row in batch.rows:
            # A row cut by max_tokens may still have completed a stop string with its last token: check it too.
            if row.request.params.stop and row.finish in (None, "length") and row.stop_checked < len(row.out_ids):
                row.stop_checked = len(row.out_ids)
                self._check_stop(row)
            if row.finish is not None:
                finished[id(row.request)] = row.request
        for req in finished.values():
            if not req.future.done() and all(r.finish is not None for r in req.rows):
                req.future.set_result(self._build_generation(req))

    def _check_stop(self, row: _Row) -> None:
        text = self.decode(row.out_ids)
        hits = [(text.find(s), s) for s in row.request.params.stop if s in text]
        if hits:
            at, row.stop_string = min(hits, key=lambda hit: hit[0])
            row.finish = "stop"
            row.stop_cut = self._stop_cut(row.out_ids, text[:at])

    def _stop_cut(self, ids: list[int], before_stop: str) -> int:
        """Longest prefix of ``ids`` whose decoding is a prefix of ``before_stop`` (see the module docstring)."""
        for j in range(len(ids), -1, -1):
            if before_stop.startswith(self.decode(ids[:j])):
                return j
        return 0

    # -- worker-thread functions (torch) --------------------------------------------------------------------------

    def _step(self, batch: _Batch | None, new: list[_Request]) -> _Batch | None:
        """One unit of work on the batch: drop finished rows, then prefill the new requests (merging them in) or,
        if there are none, decode one token for every row."""
        with torch.inference_mode():
            if batch is not None:
                keep = [i for i, row in enumerate(batch.rows) if row.finish is None]
                if not keep:
                    batch = None
                elif len(keep) < len(batch.rows):
                    self._select_rows(batch, keep)
            if new:
                return self._prefill_and_merge(new, batch)
            if batch is not None:
                self._decode_step(batch)
            return batch

    def _prefill_and_merge(self, requests: list[_Request], batch: _Batch | None) -> _Batch:
        """Prefill the new requests' prompts and merge them into the running batch: rows whose prompt starts with a
        cached prefix (`PrefixCache`) as one group per prefix over their remainder, the others as one group."""
        groups: dict[tuple[int, ...] | None, tuple[PrefixEntry | None, list[_Row]]] = {}
        for req in requests:  # a request's rows (n > 1) share its prompt: one lookup for all of them
            entry = self._cached_prefix(req.prompt_ids)
            groups.setdefault(entry.ids if entry else None, (entry, []))[1].extend(req.rows)
        merged = batch
        for entry, rows in groups.values():
            new = self._prefill(rows, entry)
            if self.kv_cache == "slots":  # the group's keys and values go to the next free slots; nothing else moves
                if self._slots is None:
                    self._slots = SlotCache(len(new.cache.layers), max_slots=self.max_batch_rows)
                if merged is None:
                    self._slots.clear()
                assert new.mask is not None
                self._slots.add([(layer.keys, layer.values) for layer in new.cache.layers], new.mask)
                new.cache, new.mask = self._slots, None
            merged = new if merged is None else _merge(merged, new)
        assert merged is not None
        self.stats["max_rows_in_batch"] = max(self.stats["max_rows_in_batch"], len(merged.rows))
        return merged

    def _cached_prefix(self, prompt: list[int]) -> PrefixEntry | None:
        """The cached prefix ``prompt`` starts with, making one first when it shares enough with a recent prompt."""
        if self._prefixes is None:
            return None
        if (entry := self._prefixes.lookup(prompt)) is not None:
            return entry
        if (ids := self._prefixes.to_make(prompt)) is None:
            return None
        with torch.inference_mode():
            out = self._forward(input_ids=torch.tensor([ids], device=self.device), use_cache=True)
        self.stats["forward_passes"] += 1
        entry = PrefixEntry(ids, [(layer.keys, layer.values) for layer in out.past_key_values.layers])
        self._prefixes.add(entry)
        return entry

    def _prefill(self, rows: list[_Row], prefix: PrefixEntry | None) -> _Batch:
        """One left-padded prefill of ``rows``; with a ``prefix``, of each prompt's remainder after it, on top of the
        prefix's keys and values (row layout: prefix, padding, remainder; the mask hides the padding)."""
        with torch.inference_mode():
            skip = len(prefix.ids) if prefix is not None else 0
            prompts = [row.request.prompt_ids[skip:] for row in rows]
            width = max(len(p) for p in prompts)
            ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), skip + width), dtype=torch.long)
            mask[:, :skip] = 1
            for i, p in enumerate(prompts):
                ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, skip + width - len(p) :] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, skip:]
            cache = DynamicCache(config=self.model.config)
            if prefix is not None:
                n = len(rows)
                for index, (keys, values) in enumerate(prefix.layers):
                    cache.update(keys.expand(n, -1, -1, -1).clone(), values.expand(n, -1, -1, -1).clone(), index)
                self.stats["cached_prompt_tokens"] += skip * len(rows)
            out = self._forward(
                input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
            )
            self.stats["forward_passes"] += 1
            self.stats["batches"] += 1
            self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
            params = [row.request.params for row in rows]
            new = _Batch(
                rows=rows,
                cache=out.past_key_values,
                mask=mask,
                next_pos=positions[:, -1] + 1,
                next_input=torch.zeros(len(rows), dtype=torch.long, device=self.device),
                temps=torch.tensor([float(p.temperature) for p in params], device=self.device),
                top_ps=torch.tensor([float(p.top_p) for p in params], device=self.device),
                processors=LogitProcessors.build(
                    [(p.presence_penalty, p.frequency_penalty, p.logit_bias) for p in params],
                    out.logits.shape[-1],
                    self.device,
                ),
                top_k=[p.top_logprobs for p in params] if any(p.top_logprobs for p in params) else None,
            )
            self._sample_into(new, out.logits[:, -1, :])
            return new

    def _forward(self, **inputs: Any) -> Any:
        """The model's forward pass (packed weights on the CPU; only the last position's logits)."""
        with self._packed.active() if self._packed is not None else contextlib.nullcontext():
            return self.model(**inputs, **self._last_logits)

    def _decode_step(self, batch: _Batch) -> None:
        """Feed each row its last sampled token and sample the next one."""
        start = time.perf_counter()
        with torch.inference_mode():
            if isinstance(batch.cache, SlotCache):
                mask = batch.cache.begin_decode(self.model.dtype)
            else:
                assert batch.mask is not None
                ones = torch.ones((batch.mask.shape[0], 1), dtype=batch.mask.dtype, device=batch.mask.device)
                batch.mask = mask = torch.cat([batch.mask, ones], dim=1)
            if self._fused is not None and isinstance(batch.cache, SlotCache):
                with self._packed.active() if self._packed is not None else contextlib.nullcontext():
                    logits = self._fused.step(batch.next_input, batch.next_pos, batch.cache, mask)
            else:
                out = self._forward(
                    input_ids=batch.next_input[:, None],
                    attention_mask=mask,
                    position_ids=batch.next_pos[:, None],
                    past_key_values=batch.cache,
                    use_cache=True,
                )
                logits = out.logits[:, -1, :]
                if not isinstance(batch.cache, SlotCache):
                    batch.cache = out.past_key_values
            self.stats["forward_passes"] += 1
            if isinstance(batch.cache, SlotCache):
                batch.cache.end_decode()
            batch.next_pos = batch.next_pos + 1
            self._sample_into(batch, logits)
        self.stats["decode_steps"] += 1
        self.stats["decode_us"] += int((time.perf_counter() - start) * 1e6)

    def _sample_into(self, batch: _Batch, logits: torch.Tensor) -> None:
        logits = logits.float()
        self._apply_penalties(batch, logits)  # presence/frequency penalties, logit_bias (in place)
        self._apply_constraints(batch, logits)  # grammar masks of constrained rows (in place)
        # The reported logprobs (and top logprobs) are of the distribution sampled from: after all of the above.
        logp = tempered_logprobs(logits, batch.temps)
        tokens = draw(logits, logp, batch.temps, batch.top_ps, [r.generator for r in batch.rows])
        logprobs = logp.gather(1, tokens[:, None]).flatten()
        self._advance_constraints(batch, tokens)
        if batch.processors is not None:
            batch.processors.observe(tokens)
        if batch.top_k is not None:
            for row, top in zip(batch.rows, top_logprobs(logp, batch.top_k), strict=True):
                row.out_top.append(top)
        batch.next_input = tokens
        for row, token, logprob in zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row.out_ids.append(token)
            row.out_logprobs.append(logprob)
            self.stats["generated_tokens"] += 1
            self._check_finished(row, token)

    def _apply_penalties(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Presence/frequency penalties and logit_bias of each row, applied to ``logits`` in place (see
        `sampling.LogitProcessors`; a batch without such options has none and pays nothing)."""
        if batch.processors is not None:
            batch.processors.apply(logits)

    # Which rows of the batch are constrained, keyed by the identity of ``batch.rows``: every change of the batch's
    # rows (prefill, merge, row selection) makes a new list, so between changes the unconstrained path costs one
    # identity check per step.
    _constrained_of: list[_Row] | None = None
    _constrained: list[int] = []  # noqa: RUF012 (replaced, never mutated)

    def _constrained_rows(self, batch: _Batch) -> list[int]:
        if batch.rows is not self._constrained_of:
            index = [i for i, row in enumerate(batch.rows) if row.request.constraint is not None]
            for i in index:
                row, constraint = batch.rows[i], batch.rows[i].request.constraint
                if row.matcher is None and constraint is not None:
                    row.matcher = constraint.new_row()
            self._constrained_of, self._constrained = batch.rows, index
        return self._constrained

    def _apply_constraints(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Mask the logits of constrained rows (structured outputs, forced tool calls) in place.

        The bitmasks of all constrained rows are computed in one parallel call and applied with one tensor op."""
        index = self._constrained_rows(batch)
        if not index:
            return
        constraint = batch.rows[index[0]].request.constraint
        assert constraint is not None  # index holds constrained rows only
        grammars = constraint.grammars
        bitmask = torch.zeros((len(index), (grammars.vocab_size + 31) // 32), dtype=torch.int32)
        grammars.fill([(k, batch.rows[i].matcher) for k, i in enumerate(index)], bitmask)
        bitmask = bitmask.to(logits.device)
        if len(index) == len(batch.rows):
            apply_bitmask(logits, bitmask)
            return
        rows = torch.tensor(index, dtype=torch.long, device=logits.device)
        sub = logits.index_select(0, rows)
        apply_bitmask(sub, bitmask)
        logits.index_copy_(0, rows, sub)

    def _advance_constraints(self, batch: _Batch, tokens: torch.Tensor) -> None:
        """Feed each constrained row's sampled token to its grammar matcher."""
        index = self._constrained
        if not index or batch.rows is not self._constrained_of:
            return
        picked = tokens.tolist() if len(index) == len(batch.rows) else tokens[index].tolist()
        for i, token in zip(index, picked, strict=True):
            batch.rows[i].matcher.advance(token)

    def _check_finished(self, row: _Row, token: int) -> None:
        # Stop strings need the tokenizer and are checked on the event loop (`_after_step`).
        if token in self._eos_ids:
            row.finish = "stop"
        elif len(row.out_ids) >= row.request.max_new:
            row.finish = "length"

    def _select_rows(self, batch: _Batch, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=batch.next_pos.device)
        batch.rows = [batch.rows[i] for i in keep]
        batch.next_pos = batch.next_pos.index_select(0, index)
        batch.next_input = batch.next_input.index_select(0, index)
        batch.temps = batch.temps.index_select(0, index)
        batch.top_ps = batch.top_ps.index_select(0, index)
        if batch.processors is not None:
            batch.processors = batch.processors.select(keep)
        if batch.top_k is not None:
            top_k = [batch.top_k[i] for i in keep]
            batch.top_k = top_k if any(top_k) else None
        if isinstance(batch.cache, SlotCache):
            batch.cache.select(keep)
            return
        assert batch.mask is not None
        batch.cache.batch_select_indices(index)
        batch.mask = batch.mask.index_select(0, index)
        # Columns that are padding for every remaining row (left-over from a longer, finished row) cost attention
        # time for nothing: cut them.
        used = batch.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            batch.mask = batch.mask[:, first:]
            for layer in batch.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]

    def _load_state(self, state: dict[str, Any]) -> None:
        own = self.model.state_dict()
        unexpected = sorted(set(state) - set(own))
        tied = _tied_keys(self.model)
        missing = sorted(set(own) - set(state) - tied)
        if unexpected or missing:
            raise ValueError(
                f"state dict does not match the served model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        for key, value in state.items():
            if tuple(value.shape) != tuple(own[key].shape):
                raise ValueError(f"shape mismatch for {key}: {tuple(value.shape)} vs {tuple(own[key].shape)}")
        with torch.no_grad():
            for key, value in state.items():
                own[key].copy_(value)  # state_dict() tensors share storage with the parameters: in place
        if self._packed is not None:
            self._packed.repack()  # the packed copies are of the old weights
        if self._fused is not None:
            self._fused.refresh()
        if self._prefixes is not None:
            self._prefixes.clear()  # their keys and values were computed by the old weights

    # -- results --------------------------------------------------------------------------------------------------

    def _build_generation(self, req: _Request) -> Generation:
        choices = []
        for row in req.rows:
            ids, logprobs, top = row.out_ids, row.out_logprobs, row.out_top
            if row.stop_cut is not None:
                ids, logprobs, top = ids[: row.stop_cut], logprobs[: row.stop_cut], top[: row.stop_cut]
            raw = self.decode(ids)
            finish: FinishReason = "length" if row.finish == "length" else "stop"
            content, calls, reasoning = raw, [], None
            if req.chat is not None:
                reasoning, parsed = req.chat.format.parse(raw, tools=req.chat.tools)
                self.stats["malformed_tool_calls"] += parsed.malformed
                content, calls = parsed.content, parsed.tool_calls
                if req.chat.single_call:
                    calls = calls[:1]
                if calls and finish == "stop":
                    finish = "tool_calls"
            choices.append(
                Choice(
                    text=content,
                    token_ids=list(ids),
                    logprobs=list(logprobs) if req.params.logprobs else None,
                    top_logprobs=list(top) if req.params.top_logprobs else None,
                    finish_reason=finish,
                    tool_calls=calls,
                    reasoning=reasoning,
                    stop_sequence=row.stop_string if finish == "stop" else None,
                )
            )
        return Generation(
            model=self.name,
            prompt_ids=list(req.prompt_ids),
            choices=choices,
            policy_version=req.policy_version,
            logprobs_processed=([req.constraint.kind] if req.constraint is not None else []) + _processed(req.params),
        )


def _load_causal_lm(path: Path, dtype: Any) -> Any:
    if (path / "config.json").is_file() or not (path / "adapter_config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise FileNotFoundError(
            f"adapter {path} names base model {base!r}, which is not a local model directory: put the base model "
            "there (or fix base_model_name_or_path in its adapter_config.json), or export with --merge"
        )
    from peft import PeftModel

    # Merged once at load: the engine then serves (and swaps weights of) a plain model under the base's names.
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), path).merge_and_unload()


async def _run_on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """Run ``coro`` on another thread's event loop and await it from this one (cancellation is forwarded)."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def _init_worker() -> None:
    configure_threads()


def _tied_keys(model: Any) -> set[str]:
    """State-dict keys that alias another parameter (e.g. ``lm_head.weight`` tied to the embeddings)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for key, tensor in model.state_dict(keep_vars=True).items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            tied.add(key)
        else:
            seen[ptr] = key
    return tied


def _processed(p: SamplingParams) -> list[str]:
    """The sampling options that shaped a request's distribution beyond temperature (`Generation.logprobs_processed`)."""
    names = [name for name in ("presence_penalty", "frequency_penalty") if getattr(p, name)]
    return names + (["logit_bias"] if any(p.logit_bias.values()) else [])


def _merge(old: _Batch, new: _Batch) -> _Batch:
    """Concatenate two batches along rows, left-padding the shorter KV cache and mask to a common width (a
    `SlotCache` already holds the new rows after the old ones: only the per-row state is joined)."""
    slots = isinstance(old.cache, SlotCache)
    if not slots:
        assert old.mask is not None and new.mask is not None
    width = 0 if slots else max(old.mask.shape[1], new.mask.shape[1])  # type: ignore[union-attr]

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    if not slots:
        for a, b in zip(old.cache.layers, new.cache.layers, strict=True):
            a.keys = torch.cat([pad(a.keys, 2), pad(b.keys, 2)], dim=0)
            a.values = torch.cat([pad(a.values, 2), pad(b.values, 2)], dim=0)
    return _Batch(
        rows=old.rows + new.rows,
        cache=old.cache,
        mask=None if slots else torch.cat([pad(old.mask, 1), pad(new.mask, 1)], dim=0),  # type: ignore[arg-type]
        next_pos=torch.cat([old.next_pos, new.next_pos]),
        next_input=torch.cat([old.next_input, new.next_input]),
        temps=torch.cat([old.temps, new.temps]),
        top_ps=torch.cat([old.top_ps, new.top_ps]),
        processors=LogitProcessors.merge(old.processors, len(old.rows), new.processors, len(new.rows)),
        top_k=None
        if old.top_k is None and new.top_k is None
        else (old.top_k or [0] * len(old.rows)) + (new.top_k or [0] * len(new.rows)),
    )
