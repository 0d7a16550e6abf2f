"""Supervised fine-tuning from traces: `SFT`, the algorithm, and the rows it trains on.

`SFT` is an `Algorithm` for `Trainer.fit` with two sources of data:

* **Rejection sampling** (no ``teacher``): finished rollouts already in a store (this run's, or another run's via
  ``traces=TraceFilter(store=...)``, narrowed by time window, task metadata and mode), the best of them by reward
  (`lightrail.algorithms.rejection`: a threshold and/or best-of-n per task).
* **Distillation** (``teacher=LLM(...)``, any OpenAI-compatible endpoint, or a program: any gateway `Backend`,
  e.g. a scripted teacher): the agent runs on the training tasks through the runners with the teacher as its
  model, behind a recording gateway (`OpenAIUpstream` in front of an endpoint), and the successful rollouts are
  kept the same way.
* **The student's own samples** (``teacher="self"``: rejection sampling fine-tuning, as in STaR and RFT): the agent
  runs on the training tasks with the student itself, served by the embedded engine at ``sampling`` (``n_samples``
  tries per task), and the student is trained on its own successful tries: no program or stronger model that
  knows the answers, only the reward deciding what is kept.

Either way, each kept rollout's last attempt's spans become one `ChatSample` per LLM call (`episode_messages`);
only the calls of the trained agents (``agents``, an `AgentFilter`, as in `GRPO`) are kept, and `call_rows` turns
them into `TrainingRow`s whose loss covers only those calls' assistant turns (tool calls rendered as the engine
parses them: `ChatFormat.assistant_text`). **The recorded messages, not the recorded token ids, are the data**: a
teacher's tokens are re-rendered with the student's chat template and re-tokenized by the student's tokenizer,
so any teacher works (another vocabulary, a hosted API that returns no ids). `PolicyUpdater.step(rows,
objective="sft")` then trains the student (full or LoRA) for ``steps`` optimizer steps of ``batch_size`` rows
(with ``backend="llamafactory"``, LLaMA-Factory's trainer takes them, in its own environment, on the same rows
exported in its dataset format, and its model is loaded back into the updater: `lightrail.model.llamafactory`).

One run::

    teacher rollouts (distillation) or stored rollouts ──TraceFilter──► candidates ──keep_best──► kept
      kept ──spans──► episode_messages ──AgentFilter──► call_rows ──► PolicyUpdater.step(objective="sft") × steps
      ──► merged weights served by an embedded engine ──► held-out validation ──► <out_dir>/model (HF folder)

Outputs under ``out_dir``: ``traces.json`` (the kept rollout ids and what was dropped, so a resumed run trains on
the same data without calling the teacher again), ``metrics.jsonl`` (one ``data`` line, a ``train`` line per step
with the loss, ``val`` lines), ``checkpoints/step-N`` (updater + loop state, as `GRPO`'s; ``resume=True``
continues from the newest), ``model/`` (the trained policy as a Hugging Face folder: a `GRPO` stage chained after
this one starts from it) and ``report.json``. A fresh run in an ``out_dir`` that holds an earlier run moves that
run's traces, metrics and checkpoints to ``earlier/<UTC time>/`` first.

Concurrency model: coroutines on the trainer's event loop; optimizer steps, model loading and saving run in
worker threads; the gateways and the validation engine serve on the loop meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from lightrail.adapters import AgentFilter, ChatSample, Exclusions, build_episode, episode_messages
from lightrail.algorithms.rejection import TraceFilter, keep_best
from lightrail.algorithms.run.folder import RunFolder
from lightrail.algorithms.run.guard import RunGuard, RunStopped, update_health
from lightrail.algorithms.run.loop import run_steps
from lightrail.algorithms.run.policy import ServedPolicy, last_attempt_spans, policy_resources, validate
from lightrail.algorithms.run.progress import StepBar
from lightrail.algorithms.settings import SFTSection, agents_argument
from lightrail.engine.chat import ChatFormat
from lightrail.engine.models import check_model_dir, resolve_model
from lightrail.types import LLM, Rollout, Task, TrainingRow

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lightrail.algorithms.protocol import TrainerContext
    from lightrail.gateway.backends import Backend
    from lightrail.gateway.server import GatewaySettings
    from lightrail.model.llamafactory import LlamaFactorySettings
    from lightrail.model.update_config import UpdateConfig

__all__ = ["SFT", "call_rows", "conversation_rows"]

_TRACES = "traces.json"
SELF = "self"
"""``SFT(teacher=SELF)``: the student's own samples are the teacher's."""

# One trained turn: the messages before it, the assistant message to learn, the tools offered, the row's owner.
_Turn = tuple[Sequence[dict[str, Any]], dict[str, Any], list[dict[str, Any]] | None, str]


# -- rows ----------------------------------------------------------------------------------------------------------


def conversation_rows(
    tokenizer: Any,
    conversations: Iterable[Sequence[dict[str, Any]]],
    *,
    tools: list[dict[str, Any]] | None = None,
    max_len: int | None = None,
    merge: bool = True,
    chat: ChatFormat | None = None,
) -> list[TrainingRow]:
    """Rows that teach every assistant turn of every conversation: prompt and environment tokens masked out, the
    turn's tokens and EOS trained.

    With ``merge`` (default) the turns of a conversation share one row whenever the next turn's prompt tokens start
    with the row so far (the tool result and the next turn opener are appended as masked context), which is how
    the model sees a multi-turn run and costs each prompt token once; otherwise a new row starts. Rows longer than
    ``max_len`` tokens are dropped (a model cannot attend past its positions). ``chat`` renders prompts and targets
    (default: the tokenizer's template, in the formats it speaks; see `ChatFormat`).
    """
    turns = [
        [(conversation[:i], m, tools, f"sft-{c}") for i, m in enumerate(conversation) if m.get("role") == "assistant"]
        for c, conversation in enumerate(conversations)
    ]
    return _rows(tokenizer, turns, max_len=max_len, merge=merge, dropped=None, chat=chat)


def call_rows(
    tokenizer: Any,
    samples: Iterable[ChatSample],
    *,
    max_len: int | None = None,
    merge: bool = True,
    dropped: Exclusions | None = None,
    chat: ChatFormat | None = None,
) -> list[TrainingRow]:
    """Rows that teach the answer of each recorded chat call (``sample.messages[-1]``) and nothing else: the
    request's messages, earlier assistant turns included, are masked context.

    Samples are grouped by rollout and agent, in turn order; with ``merge`` consecutive calls of one agent share a
    row when the later prompt extends the row so far (one agent's multi-turn loop), while another agent's calls
    never join it. Rows carry their rollout id. Rows longer than ``max_len`` are dropped and counted in
    ``dropped`` as ``too_long`` (by rollout id).
    """
    groups: dict[tuple[str, str | None], list[ChatSample]] = {}
    for sample in samples:
        groups.setdefault((sample.rollout_id, sample.agent_name), []).append(sample)
    turns: list[list[_Turn]] = [
        [(s.messages[:-1], s.messages[-1], s.tools, s.rollout_id) for s in sorted(group, key=lambda s: s.turn)]
        for group in groups.values()
    ]
    return _rows(tokenizer, turns, max_len=max_len, merge=merge, dropped=dropped, chat=chat)


def _rows(
    tokenizer: Any,
    groups: Iterable[list[_Turn]],
    *,
    max_len: int | None,
    merge: bool,
    dropped: Exclusions | None,
    chat: ChatFormat | None,
) -> list[TrainingRow]:
    chat = chat or ChatFormat(tokenizer)
    eos = tokenizer.eos_token_id
    rows: list[TrainingRow] = []
    for turns in groups:
        ids: list[int] = []
        mask: list[int] = []
        owner = ""
        for history, message, tools, key in turns:
            prompt = tokenizer(chat.render(list(history), tools), add_special_tokens=False).input_ids
            target = tokenizer(chat.assistant_text(message), add_special_tokens=False).input_ids + [eos]
            if merge and ids and prompt[: len(ids)] == ids:
                context = prompt[len(ids) :]
            else:
                _append_row(rows, ids, mask, owner, max_len, dropped)
                ids, mask, context = [], [], prompt
            owner = key
            ids += context + target
            mask += [0] * len(context) + [1] * len(target)
        _append_row(rows, ids, mask, owner, max_len, dropped)
    return rows


def _append_row(
    rows: list[TrainingRow],
    ids: list[int],
    mask: list[int],
    owner: str,
    max_len: int | None,
    dropped: Exclusions | None,
) -> None:
    if not ids:
        return
    if max_len is not None and len(ids) > max_len:
        if dropped is not None:
            dropped.add("too_long", owner)
        return
    rows.append(
        TrainingRow(
            input_ids=ids,
            loss_mask=mask,
            old_logprobs=[0.0] * len(ids),
            advantages=[float(m) for m in mask],
            rollout_id=owner,
            group_id=owner,
        )
    )


# -- the algorithm -------------------------------------------------------------------------------------------------


class SFT:
    """Supervised fine-tuning on the best recorded traces: rejection sampling from a store, or distillation from a
    teacher (an `LLM` endpoint or a gateway `Backend`) run through the runners (see the module docstring).

    ``model`` is the student: a name or a folder as a config's ``model:`` takes it (``tiny``, ``small``, ``smollm2``,
    a local directory: `lightrail.engine.models.resolve_model`). Kept rollouts: reward at least ``min_reward`` (None:
    any), at most ``best_of`` per task (None: all). With a ``teacher``, each training task is run ``n_samples``
    times with it (``tasks`` limits how many training tasks; None: all); ``teacher="self"`` samples the student itself
    at ``sampling`` (default temperature 1.0, 64 tokens); without a teacher, ``traces`` says which stored rollouts
    are candidates. ``agents`` picks the trained agents' calls (None: every call). ``config`` sets the
    optimizer and LoRA (its GRPO-only fields are unused; ``kl_coef`` must be 0). Training is ``steps`` optimizer
    steps of ``batch_size`` rows drawn without replacement (reshuffled each epoch). Held-out tasks are run with
    the student at the end (and every ``val_every`` steps; before training with ``validate_before``), greedy
    by default (``val_sampling``). ``backend="llamafactory"`` has LLaMA-Factory's trainer take the ``steps``
    (full fine-tuning; ``llamafactory``, a `LlamaFactorySettings`, names its interpreter; ``val_every`` and
    ``checkpoint_every`` then apply only at the end).

        >>> teacher = LLM(endpoint="http://teacher:8000/v1", model="big", sampling={"temperature": 0.7})  # doctest: +SKIP
        >>> sft = SFT("runs/base", teacher=teacher, n_samples=4, best_of=1, steps=300)                   # doctest: +SKIP
        >>> Trainer(n_runners=2, algorithm=sft).fit(agent, train, val); sft.report["val_after"]          # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path,
        section: SFTSection | None = None,
        *,
        teacher: LLM | Backend | Literal["self"] | None = None,
        traces: TraceFilter | None = None,
        agents: AgentFilter | Sequence[str] | str | None = None,
        config: UpdateConfig | None = None,
        out_dir: str | Path = "runs/sft",
        gateway: GatewaySettings | None = None,
        llamafactory: LlamaFactorySettings | None = None,
        **settings: Any,
    ) -> None:
        """``section`` (a config's ``sft:`` section) or ``settings``, its fields as keyword arguments (both: the
        keywords win), hold every plain setting, its default and its check (`SFTSection`); the keywords above take
        objects (``config`` and ``agents`` else the section's; ``agents`` also an agent's name or a list of names). An
        object of the wrong kind is a one-line error here, before any rollout."""
        base = msgspec.structs.asdict(section) if section is not None else {}
        s = SFTSection(**{**base, **settings})
        backend = s.backend
        config = config if config is not None else s.update_config()
        if backend == "llamafactory" and config is not None and config.lora is not None:
            raise ValueError("the llamafactory backend fine-tunes the full model: leave config.lora unset")
        if teacher is not None and traces is not None:
            raise ValueError("give a teacher (distillation) or traces (rejection sampling from a store), not both")
        self.folder = RunFolder(out_dir, "SFT", keep_checkpoints=s.keep_checkpoints, seed=s.seed)
        if config is not None and config.kl_coef:
            raise ValueError("SFT has no KL term: leave config.kl_coef at 0")
        if config is not None and config.critic is not None:
            raise ValueError("SFT has no critic: config.critic is PPO's (GRPO with advantage gae); leave it unset")
        if config is not None and (mismatch := config.schedule_mismatch(s.steps)):
            log.warning("SFT: %s", mismatch)
        if s.sampling is not None and teacher != SELF:
            raise ValueError("sampling sets how the student samples itself (teacher='self'); an LLM teacher's "
                             "sampling is its own (LLM.sampling)")  # fmt: skip
        if traces is not None and not isinstance(traces, TraceFilter):
            raise TypeError(f"traces: expected a TraceFilter, got {type(traces).__name__} {traces!r}"[:160])
        if (
            teacher is not None
            and not isinstance(teacher, LLM | str)
            and not callable(getattr(teacher, "model_names", None))
        ):
            raise TypeError(f"teacher: expected an LLM, a gateway Backend or 'self', got {type(teacher).__name__}")
        if isinstance(teacher, str) and teacher != SELF:
            raise ValueError(
                f"teacher is an LLM, a gateway Backend or 'self' (the student's own samples), not {teacher!r}"
            )
        if teacher is not None and not isinstance(teacher, (LLM, str)) and not teacher.model_names():
            raise ValueError(
                f"the teacher backend ({type(teacher).__name__}) lists no model names: its model_names() must "
                "name the model the agent is to call"
            )
        self.settings = s
        self._guard = RunGuard(s.guard)
        self.model = resolve_model(model)
        self.teacher = teacher
        self.traces = traces if traces is not None or teacher is not None else TraceFilter()
        self.sampling = {"temperature": 1.0, "max_tokens": 64, **(s.sampling or {})}
        self.agents = agents_argument(agents) if agents is not None else s.agent_filter()
        self.config = config
        self.val_sampling = {"temperature": 0.0, "max_tokens": 64, **(s.val_sampling or {})}
        self.success_threshold = s.success_threshold
        self.out_dir = Path(out_dir)
        self.resume = s.resume
        self.engine_options = s.engine_options or {}
        self.gateway = gateway
        self.backend = backend
        self.llamafactory = llamafactory
        if backend == "llamafactory":
            from lightrail.model.llamafactory import LlamaFactorySettings

            self.llamafactory = llamafactory or LlamaFactorySettings()
            self.llamafactory.interpreter()  # a missing environment is said before any teacher call
        self.report: dict[str, Any] = {}
        self._rows: list[TrainingRow] = []
        self._samples: list[ChatSample] = []
        self._updater: Any = None
        self._tokenizer: Any = None
        self._source: Any = None
        self._owned_source = False
        self._teacher: ServedPolicy | None = None
        self._teacher_backend: Any = None
        self._student: ServedPolicy | None = None

    @property
    def step(self) -> int:
        """Optimizer steps done (a resumed run's included)."""
        return self.folder.step

    @property
    def output_model(self) -> Path:
        """Where the trained policy is written as a Hugging Face folder (a chained `GRPO` stage's ``model``)."""
        return self.out_dir / "model"

    # -- Algorithm protocol ------------------------------------------------------------------------------------

    async def setup(self, ctx: TrainerContext) -> None:
        """Load the student's updater and tokenizer (from the newest checkpoint with ``resume``), open the traces'
        store, and start the recording gateway in front of the teacher."""
        from transformers import AutoTokenizer

        from lightrail.model.updater import PolicyUpdater, UpdateConfig

        config = self.config or UpdateConfig()
        check_model_dir(self.model)  # e.g. the folder an earlier stage of a chain was to write
        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(self.model))
        self._updater = await asyncio.to_thread(PolicyUpdater, str(self.model), config)
        checkpoint, _ = self.folder.start(resume=self.resume, track=ctx.track)
        if self.backend == "llamafactory" and 0 < self.step < self.settings.steps:
            raise ValueError(
                f"{self.out_dir}: resumed at step {self.step} of {self.settings.steps}, a checkpoint of lightrail's "
                "own steps; LLaMA-Factory trains a run from its first step (its schedule cannot take over mid-way): "
                "resume with backend lightrail, or start afresh without resume"
            )
        if checkpoint is not None:
            await asyncio.to_thread(self._updater.load, checkpoint)
        self._source = ctx.store
        if self.traces is not None and self.traces.store is not None:
            from lightrail.store import open_store

            self._source = open_store(self.traces.store, token=os.environ.get("LIGHTRAIL_TOKEN"))
            self._owned_source = True
        if self.teacher is not None and not isinstance(self.teacher, str):  # (SELF: the student serves itself)
            self._teacher_backend = self._backend_of(self.teacher)
            if not (self.resume and (self.out_dir / _TRACES).exists()):  # (else the pinned traces are reloaded)
                self._teacher = await ServedPolicy.start(self._teacher_backend, ctx.store, self.gateway)

    @staticmethod
    def _backend_of(teacher: LLM | Backend) -> Backend:
        """What the teacher's recording gateway forwards to: an `OpenAIUpstream` for an `LLM`, else the program's
        own backend. SFT owns it from here on: it is closed with the run."""
        from lightrail.gateway.backends import OpenAIUpstream

        if isinstance(teacher, LLM):
            return OpenAIUpstream(
                teacher.base_url(),
                api_key=teacher.api_key,
                model=teacher.model,
                request_token_ids=False,  # the messages are the data; hosted APIs reject vLLM's extension
            )
        return teacher

    async def run(self, ctx: TrainerContext) -> None:
        """Collect (or reload) the kept traces, train ``steps`` steps, validate, write the model and the report."""
        started = time.monotonic()
        data = await self._data(ctx)
        collect_s = time.monotonic() - started
        if not self._rows and self.step < self.settings.steps:
            raise RunStopped(f"SFT kept no training rows (dropped: {data['dropped']}); nothing to learn from")
        val_before = None
        if self.settings.validate_before and not self.step:
            val_before = await self._validate(ctx)
        elif self.settings.validate_before:
            val_before = self.folder.first_val()
        t_train = time.monotonic()
        if self.backend == "llamafactory":
            await self._train_llamafactory()
        await run_steps(
            self.folder, self.settings.steps, train_step=self._train_step, validate=lambda: self._validate(ctx),
            checkpoint=self._checkpoint, val_every=self.settings.val_every,
            checkpoint_every=self.settings.checkpoint_every,
        )  # fmt: skip
        train_s = time.monotonic() - t_train
        checkpoint = await self._checkpoint()
        model = await asyncio.to_thread(self._export, self.output_model)
        val_after = await self._validate(ctx)
        losses = [m["loss"] for m in self.folder.history if m["kind"] == "train"]
        self.report = {
            "val_before": val_before,
            "val_after": val_after,
            "steps": self.step,
            "rows": len(self._rows),
            "kept_rollouts": data["kept_rollouts"],
            "dropped": data["dropped"],
            "loss_first": losses[0] if losses else None,
            "loss_last": statistics.fmean(losses[-5:]) if losses else None,
            "collect_minutes": collect_s / 60,
            "train_minutes": train_s / 60,
            "minutes": (time.monotonic() - started) / 60,
            "checkpoint": str(checkpoint),
            "model": str(model),
            "metrics": str(self.out_dir / "metrics.jsonl"),
        }
        self.folder.write_report(self.report)

    async def close(self) -> None:
        if self._teacher is not None:
            await self._teacher.close()
        self._teacher = None
        if self._teacher_backend is not None:
            from lightrail.gateway.backends import close_backend

            backend, self._teacher_backend = self._teacher_backend, None
            await close_backend(backend)
        if self._student is not None:
            await self._student.close()
            self._student = None
        if self._owned_source and self._source is not None:
            await self._source.close()
        self._source = None
        if self._updater is not None:
            await asyncio.to_thread(self._updater.close)

    # -- data ------------------------------------------------------------------------------------------------

    async def _data(self, ctx: TrainerContext) -> dict[str, Any]:
        """The kept rollouts' rows; ``traces.json`` pins which rollouts they are, so a resumed run reloads the same
        ones instead of sampling (or calling the teacher) again."""
        pinned = self.out_dir / _TRACES
        source = self._source if self.teacher is None else ctx.store
        if self.resume and pinned.exists():
            data = json.loads(pinned.read_text())
            kept = await source.query_rollouts(rollout_ids=data["rollout_ids"]) if data["rollout_ids"] else []
            order = {rid: i for i, rid in enumerate(data["rollout_ids"])}
            kept.sort(key=lambda r: order[r.rollout_id])
            self._rows, _ = await self._rows_of(source, kept, Exclusions())
            if "record" in data and not any(m["kind"] == "data" for m in self.folder.history):
                self.folder.record(data["record"])  # resumed with no checkpoint yet: the metrics started over
            return data
        t0 = time.monotonic()
        if self.teacher is not None:
            rollouts = await self._teacher_rollouts(ctx)
            candidates, dropped = TraceFilter().apply(rollouts)
        else:
            rollouts = await source.query_rollouts()  # all of them: what is left out is counted by reason
            rollouts.sort(key=lambda r: (r.created_at, r.rollout_id))
            assert self.traces is not None
            candidates, dropped = self.traces.apply(rollouts)
        kept = keep_best(
            candidates, min_reward=self.settings.min_reward, best_of=self.settings.best_of, dropped=dropped
        )
        self._rows, calls = await self._rows_of(source, kept, dropped)
        trained = {r.rollout_id for r in self._rows}
        data = {
            "source": self._source_name(),
            "rollout_ids": [r.rollout_id for r in kept if r.rollout_id in trained],
            "kept_rollouts": len(trained),
            "dropped": dict(sorted(dropped.counts.items())),
        }
        rewards = [r.reward for r in rollouts if r.reward is not None]
        record = {
            "kind": "data",
            "step": self.step,
            "rollouts": len(rollouts),
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "candidates": len(candidates),
            "kept_rollouts": len(trained),
            "dropped": dropped.total,
            **{f"dropped_{reason}": n for reason, n in sorted(dropped.counts.items())},
            **calls,
            "rows": len(self._rows),
            "response_tokens": sum(sum(r.loss_mask) for r in self._rows),
            "collect_s": time.monotonic() - t0,
        }
        pinned.write_text(json.dumps({**data, "record": record}))
        self.folder.record(record)
        return data

    def _source_name(self) -> str | None:
        """Where the kept rollouts came from, as ``traces.json`` records it: ``self``, ``teacher``, or the traces'
        store (None: this run's)."""
        if self.teacher is not None:
            return SELF if isinstance(self.teacher, str) else "teacher"
        return self.traces.store if self.traces else None

    async def _teacher_rollouts(self, ctx: TrainerContext) -> list[Rollout]:
        assert self.teacher is not None
        served: ServedPolicy | None
        if isinstance(self.teacher, str):  # SELF: the student before any update, served as it is validated
            served, model, sampling = await self._serve_student(ctx), self.settings.served_name, self.sampling
        elif isinstance(self.teacher, LLM):
            served, model, sampling = self._teacher, self.teacher.model, dict(self.teacher.sampling)
        else:  # a program: its first model name, whatever the agent's default sampling is
            served, model, sampling = self._teacher, self.teacher.model_names()[0], {}
        assert served is not None
        version = await ctx.publish(policy_resources(served.llm(sampling, model), self.settings.llm_name))
        tasks = self._teacher_tasks(ctx.train_tasks)
        return await ctx.run_rollouts(
            tasks, mode="train", n_samples=self.settings.n_samples, resources_version=version.version
        )

    def _teacher_tasks(self, train_tasks: Sequence[Task]) -> list[Task]:
        """The training tasks the teacher runs: all of them, or a seeded sample of ``tasks`` of them."""
        tasks = list(train_tasks)
        if not tasks:
            raise ValueError("distillation needs training tasks")
        if self.settings.tasks is None or self.settings.tasks >= len(tasks):
            return tasks
        # Not Random(seed): its sample() makes the same draws as GRPO's Random(seed).shuffle() (exactly when the
        # sample is a sizeable share of the tasks, nearly otherwise), so a GRPO stage chained after this one (same
        # seed) would spend its first len(sample) tasks on exactly these, in this order, before any untaught one.
        return random.Random(f"sft.tasks:{self.settings.seed}").sample(tasks, self.settings.tasks)

    async def _rows_of(
        self, source: Any, kept: Sequence[Rollout], dropped: Exclusions
    ) -> tuple[list[TrainingRow], dict[str, int]]:
        """Rows of the trained agents' calls of each kept rollout (its last attempt); rollouts that end up with no
        row are counted in ``dropped`` (``no_spans``, ``no_llm_calls``, ``no_trained_calls``, ``too_long``)."""
        spans = await last_attempt_spans(source, kept)
        samples: list[ChatSample] = []
        calls = {"calls": 0, "calls_trained": 0, "calls_other_agents": 0}
        for rollout, rollout_spans in zip(kept, spans, strict=True):
            if not rollout_spans:
                dropped.add("no_spans", rollout.rollout_id)
                continue
            chat = [s for s in episode_messages(build_episode(rollout_spans)) if s.choice == 0]
            ours = [s for s in chat if self.agents is None or self.agents(s.agent_name)]
            calls["calls"] += len(chat)
            calls["calls_trained"] += len(ours)
            calls["calls_other_agents"] += len(chat) - len(ours)
            if not chat:
                dropped.add("no_llm_calls", rollout.rollout_id)
            elif not ours:
                dropped.add("no_trained_calls", rollout.rollout_id)
            samples += ours
        self._samples = samples
        tokenizer = self._tokenizer
        student = ChatFormat(  # the student's formats, as its engine reads them (engine_options may name them)
            tokenizer,
            tool_format=self.engine_options.get("tool_format"),
            reasoning=self.engine_options.get("reasoning"),
        )
        rows = await asyncio.to_thread(
            call_rows,
            tokenizer,
            samples,
            max_len=self.settings.max_len,
            merge=self.settings.merge_calls,
            dropped=dropped,
            chat=student,
        )
        return rows, calls

    # -- training --------------------------------------------------------------------------------------------

    async def _train_step(self) -> str:
        """One optimizer step on the next ``batch_size`` rows of the run's seeded shuffle; its status for the bar."""
        t0 = time.monotonic()
        batch = [self._rows[i] for i in self.folder.next_indices(self.settings.batch_size, len(self._rows))]
        update = await asyncio.to_thread(self._updater.step, batch, objective="sft")
        self.folder.step += 1
        metrics = {
            "kind": "train",
            "step": self.step,
            "epoch": self.step * self.settings.batch_size / max(len(self._rows), 1),
            "loss": update["pg_loss"],  # mean negative log-likelihood per trained token
            "grad_norm": update["grad_norm"],
            "lr": update["lr"],
            "rows": len(batch),
            "tokens": update["tokens"],
            "response_tokens": update["response_tokens"],
            "skipped": bool(update["skipped"]),
            "step_s": time.monotonic() - t0,
        }
        self.folder.record(metrics)
        health = update_health(self.step, update, 0 if update["skipped"] else len(batch))
        try:
            await self._guard.check(None, health, [], stage="SFT step")
        except RunStopped as stop:
            self.folder.append({"kind": "stop", "step": self.step, "cause": str(stop)})
            raise
        return f"nll {metrics['loss']:.3f}"

    async def _train_llamafactory(self) -> None:
        """All ``steps`` by LLaMA-Factory's trainer on the rows (`lightrail.model.llamafactory`), its model
        loaded back into the updater: checkpoint, export and validation go on as after lightrail's own steps. A
        resumed run whose checkpoint holds every step does not train again."""
        if self.step >= self.settings.steps:
            return
        from lightrail.model import llamafactory as lf
        from lightrail.model.update_config import UpdateConfig

        assert self.llamafactory is not None
        folder = self.out_dir / "llamafactory"
        # The batches lightrail's own steps would draw, in their order (the run's seeded shuffle, advanced as they
        # would advance it): LLaMA-Factory reads them in sequence, so the two backends differ in the step alone.
        batch_size = min(self.settings.batch_size, len(self._rows))
        steps = range(self.step, self.settings.steps)
        ordered = [self._rows[i] for _ in steps for i in self.folder.next_indices(batch_size, len(self._rows))]
        await asyncio.to_thread(lf.write_dataset, folder, self._samples, ordered)
        arguments = lf.train_arguments(
            folder, self.model, steps=self.settings.steps, batch_size=batch_size,
            config=self.config or UpdateConfig(), max_len=max(len(r.input_ids) for r in self._rows),
            settings=self.llamafactory,
        )  # fmt: skip
        with StepBar("SFT (LLaMA-Factory)", total=self.settings.steps, completed=self.step) as bar:
            output = await lf.train(self.llamafactory.interpreter(), folder, arguments)
            bar.update(self.settings.steps, "trained")
        await asyncio.to_thread(self._load_trained, output)
        for line in lf.read_train_log(output):
            if "loss" in line:
                self.folder.record({"kind": "train", "step": line["current_steps"], "loss": line["loss"],
                              "lr": line.get("lr"), "backend": "llamafactory"})  # fmt: skip
        self.folder.step = self._updater.steps = self.settings.steps

    def _load_trained(self, output: Path) -> None:
        from transformers import AutoModelForCausalLM

        trained = AutoModelForCausalLM.from_pretrained(str(output), dtype=self._updater.dtype)
        self._updater.model.load_state_dict(trained.state_dict())

    def _export(self, path: Path) -> Path:
        """The current policy as a Hugging Face folder (LoRA merged into the base), with the student's tokenizer."""
        import shutil

        from transformers import AutoModelForCausalLM

        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if self._updater.is_lora:
            model = AutoModelForCausalLM.from_pretrained(str(self.model), dtype=self._updater.dtype)
            model.load_state_dict(self._updater.state_dict_for_serving())
        else:
            model = self._updater.model
        model.save_pretrained(tmp)
        self._tokenizer.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        return path

    # -- validation ------------------------------------------------------------------------------------------

    async def _validate(self, ctx: TrainerContext) -> float | None:
        """Held-out success of the student's current weights (served by an embedded engine behind a gateway)."""
        if not ctx.val_tasks:
            return None
        student = await self._serve_student(ctx)
        await student.engine.sync(self._updater, student.engine.policy_version + 1)
        val = await validate(
            ctx, ctx.val_tasks, student.llm(self.val_sampling), self.success_threshold, name=self.settings.llm_name
        )
        from rich import get_console

        get_console().print(val.line("SFT", self.step), markup=False, highlight=False, soft_wrap=True)
        self.folder.record(val.metrics(self.step))
        return val.success

    async def _serve_student(self, ctx: TrainerContext) -> ServedPolicy:
        """The student on an embedded engine behind a gateway, started on first use."""
        if self._student is None:  # the teacher's gateway, when there is one, holds the configured port
            self._student = await ServedPolicy.embedded(
                self.model, ctx.store, self.gateway, name=self.settings.served_name, engine_options=self.engine_options,
                free_port=self._teacher is not None,
            )  # fmt: skip
        return self._student

    async def _checkpoint(self) -> Path:
        return await self.folder.checkpoint(self._updater.save)
