"""`APO`: automatic prompt optimization of an unmodified agent's `PromptTemplate` resources, by beam search over
prompt candidates evaluated through the real loop (runners → gateway → engine → store).

One round::

    beam (best k so far) ──expand──► children: textual gradients (optimizer LLM: critique, then edit)
                                                and/or demonstrations (worked examples from successful traces)
    beam + children ──one resources version each──► all enqueued at once on the round's batch of train tasks
      ──wait──► score = mean reward per candidate ──► keep the best k ──► next round

* **Candidates.** A candidate is one text per optimized template (``prompts``) plus a list of demonstrations. Each
  is published as its own resources version (the policy `LLM` and the rendered templates), so a rollout names the
  exact prompt it ran with. Parents are re-evaluated on each round's batch with their children: scores within a
  round compare on the same tasks.
* **Textual gradients** (``optimizer``: any OpenAI-compatible `LLM`, or ``"self"``: the policy model itself). The
  optimizer reads the parent's prompt and some failed and successful traces of its last evaluation (task, messages,
  tool calls, results, reward: all read back from the store's spans), writes a critique (``critique.md``), then an
  edit (``edit.md``). Both prompts are files shipped in ``lightrail/algorithms/apo_prompts/``; ``prompts_dir``
  points at a folder with the user's own versions (same names, ``{placeholders}`` filled by name). An edit that
  drops or adds a ``{placeholder}`` of the template is rejected (the agent's `str.format` would break).
* **Demonstrations** (no optimizer LLM needed). Worked examples are picked from the agent's own successful traces
  in the store (reward ≥ ``success_threshold``): highest reward first, then diverse (greedy farthest-first on the
  tasks' words), within ``demo_chars`` characters and ``demo_k`` examples; each child starts from a different
  example, so children differ. They are rendered as text (``User:`` / ``Assistant:`` with tool calls in the
  Hermes ``<tool_call>`` markup most tool-calling models emit / ``Tool:`` results) after the instructions of the
  template named ``demo_template`` (default: the first). In a template with ``{placeholders}`` their braces are
  escaped, so `PromptTemplate.format` renders them literally. With ``demo_format="messages"`` the template named
  ``demo_template`` is instead a JSON list of chat messages (seed: ``"[]"``) that the agent puts between its system
  prompt and the task (a few-shot slot, like ``examples=`` of the calculator agent); the demonstrations' own
  messages (user, assistant with ``tool_calls``, ``tool`` results, final answer) are appended to it. Small models
  follow worked examples given as turns far better than as text: SmolLM2-135M solved 0 of 30 held-out calculator
  problems with a perfect example as text in the system prompt. Tasks used as demonstrations by a round's candidates
  are kept out of its batch (a demonstration of the very task would score the copy, not the prompt). A small model
  may never succeed on its own: ``demo_traces`` (a `TraceFilter`: this store or another run's) adds the successful
  stored rollouts of the same agent run with another model (a stronger one, production) to the pool.
* **Budget.** ``max_rollouts`` counts search rollouts (the held-out validations before and after are reported
  apart, ``val_rollouts``): a round that does not fit is evaluated on fewer tasks, and the search stops when not
  even one task per candidate fits; the total never exceeds it. ``max_optimizer_calls`` counts critique and edit
  calls (a gradient child costs two); when it runs out, only demonstration children are proposed.
* **Records and resume.** Every candidate (its prompts, parent, origin, critique, resources version and score per
  round) is in ``apo_state.json`` and ``metrics.jsonl`` in ``out_dir``; in the store, each candidate is a resources
  version and each of its rollouts carries ``metadata`` ``{"apo_run", "apo_round", "apo_candidate",
  "apo_parent"}``. Rollout and resources ids are derived from the run id, the round and the candidate, so
  re-running the same config continues: proposals already made are not asked for again (the state is saved after
  each optimizer call), rollouts already enqueued are not enqueued twice (the store returns them as stored;
  finished ones are not re-run) and finished rounds are not re-evaluated. The best candidate goes to
  ``best_prompt.json`` (and one ``best_prompt.<name>.txt`` per template) and is published as the last resources
  version; ``report.json`` has ``val_before`` / ``val_after`` (held-out success of the seed and the best prompt).

Why not GEPA (``gepa`` 0.1.4 on PyPI, reflective prompt evolution) as the engine of the textual-gradient path:
its loop (`gepa.core.engine.GEPAEngine.run`) is synchronous and proposes one candidate per iteration (Pareto
selection → reflect on a minibatch → accept test → full evaluation), calling a blocking ``adapter.evaluate`` for one
candidate at a time, so the candidates of a round could not be evaluated in parallel as separate resources
versions; it keeps its own state (a pickled ``GEPAState`` in its ``run_dir``) that would have to agree with the
store instead of being derived from it; its budget counts metric calls, not rollouts and optimizer calls; and the
demonstrations path is outside it. Its ideas are used instead: per-example traces with rewards as the reflective
dataset, and user-editable reflection prompts.

Concurrency model: coroutines on the trainer's event loop; the engine computes in its own worker thread, the
optimizer is called with the async OpenAI client.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import statistics
import string
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from lightrail.adapters.selection import POLICY_OUTCOMES
from lightrail.algorithms.rejection import TraceFilter
from lightrail.algorithms.run.folder import RunFolder
from lightrail.algorithms.run.guard import RunGuard, rollout_health
from lightrail.algorithms.run.policy import (
    ServedPolicy,
    last_attempt_spans,
    policy_resources,
    succeeded,
    success_rate,
)
from lightrail.algorithms.settings import APOSection, convert
from lightrail.engine.models import check_model_dir, resolve_model
from lightrail.store.base import Store
from lightrail.types import LLM, PromptTemplate, Resources, Rollout, RolloutSpec, RolloutStatus, Task

if TYPE_CHECKING:
    from lightrail.algorithms.protocol import TrainerContext
    from lightrail.gateway.server import GatewaySettings

__all__ = ["APO", "Candidate", "demonstration_messages", "render_demonstration", "select_demonstrations"]

PROMPTS_DIR = Path(__file__).parent / "apo_prompts"
_STATE = "apo_state.json"
DEMO_HEADER = "Worked examples:"
DEMO_TRACES_MAX = 256
"""At most this many of the newest successful rollouts ``demo_traces`` picks are read as demonstrations."""


@dataclass
class Candidate:
    """One point of the search: a text per optimized template and the demonstrations rendered after one of them."""

    id: str
    parent: str | None
    round: int
    origin: str
    """``seed``, ``gradient`` or ``demos``."""
    instructions: dict[str, str]
    demos: list[dict[str, Any]] = field(default_factory=list)
    """``{"rollout_id", "task_id", "reward", "text"}`` per demonstration."""
    slot: int = 0
    """Which child of its parent it is (resume finds proposals already made by (round, parent, origin, slot))."""
    critique: str | None = None
    version: int | None = None
    scores: dict[str, float] = field(default_factory=dict)
    """Mean reward per round it was evaluated in (keys are round numbers as strings: JSON)."""


class APO:
    """Beam search over prompt candidates for the `PromptTemplate` resources of an agent.

    ``prompts`` maps resource names to the initial templates (an agent taking ``prompt_template`` gets the one
    template, or the one named so). The policy model is ``model`` (a name or a local model folder as a config's ``model:`` takes it, served by the embedded
    engine behind a recording gateway, like `GRPO`) or ``llm`` (an `LLM` already served by a lightrail gateway that
    records into the same store). ``optimizer`` is an `LLM` (any OpenAI-compatible endpoint, ``routed=False``) or
    ``"self"`` for the policy model; None turns textual gradients off.

        >>> apo = APO(model, prompts={"prompt_template": "Solve it."}, rounds=4, max_rollouts=400)  # doctest: +SKIP
        >>> Trainer(n_runners=2, algorithm=apo).fit(agent, train, val)                           # doctest: +SKIP
        >>> apo.report["best_prompt"]                                                              # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | None = None,
        section: APOSection | None = None,
        *,
        llm: LLM | None = None,
        optimizer: LLM | str | None = None,
        demo_traces: TraceFilter | None = None,
        gateway: GatewaySettings | None = None,
        **settings: Any,
    ) -> None:
        """``section`` (a config's ``apo:`` section) or ``settings``, its fields as keyword arguments (both: the
        keywords win), hold every plain setting, its default and its check (`APOSection`); the keywords above take
        objects (a config's mappings converted by `kwargs_from_config`)."""
        base = msgspec.structs.asdict(section) if section is not None else {}
        s = APOSection(**{**base, **settings})
        prompts, demo_template, demo_format = s.prompts, s.demo_template, s.demo_format
        if (model is None) == (llm is None):
            raise ValueError("give the policy as exactly one of model (a model folder) or llm (a served LLM)")
        for name, value, kinds, what in (
            ("llm", llm, LLM, "an LLM"),
            ("demo_traces", demo_traces, TraceFilter, "a TraceFilter"),
            ("optimizer", optimizer, LLM | str, "an LLM or 'self'"),
        ):
            if value is not None and not isinstance(value, kinds):
                raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
        if isinstance(optimizer, str) and optimizer != "self":
            raise ValueError(f"optimizer must be an LLM, 'self' or None, not {optimizer!r}")
        if optimizer == "self" and model is None:
            raise ValueError("optimizer 'self' needs the policy model (model=...)")
        if s.prompts_dir is not None and not Path(s.prompts_dir).is_dir():
            raise ValueError(f"prompts_dir {s.prompts_dir} is not a folder")
        self.settings = s
        self._guard = RunGuard(s.guard)
        self.model = None if model is None else resolve_model(model)
        self.llm = llm
        self.prompts = dict(prompts)
        self.optimizer = optimizer
        self.gradient_children = s.gradient_children if optimizer is not None else 0
        self.demo_children = s.demo_children if s.demonstrations else 0
        self.demo_template = demo_template or next(iter(prompts))
        self.demo_format = demo_format
        if demo_format == "messages":
            try:
                seed_messages = json.loads(prompts[self.demo_template] or "[]")
            except json.JSONDecodeError:
                seed_messages = None
            if not isinstance(seed_messages, list):
                raise ValueError(f"demo_format 'messages': prompts[{self.demo_template!r}] must be a JSON list ('[]')")
            if len(prompts) == 1 and optimizer is not None:
                raise ValueError("demo_format 'messages' with an optimizer needs another template to edit")
        self.demo_traces = demo_traces if s.demonstrations else None
        self._stored_pool: list[dict[str, Any]] | None = None
        self.bootstrap_rollouts = s.bootstrap_rollouts if s.demonstrations else 0
        self.bootstrap_sampling = {"temperature": 1.0, **(s.bootstrap_sampling or {})}
        self.prompts_dir = None if s.prompts_dir is None else Path(s.prompts_dir)
        self.sampling = {"temperature": 0.0, "max_tokens": 128, **(s.sampling or {})}
        self.val_sampling = {"temperature": 0.0, "max_tokens": 128, **(s.val_sampling or {})}
        self.optimizer_sampling = {"temperature": 0.7, "max_tokens": 512, **(s.optimizer_sampling or {})}
        self.success_threshold = s.success_threshold
        self.out_dir = Path(s.out_dir)
        self.folder = RunFolder(s.out_dir, "APO")  # metrics.jsonl and report.json (the search's state: apo_state.json)
        self.engine_options = s.engine_options or {}
        self.gateway = gateway
        self.report: dict[str, Any] = {}
        self.candidates: dict[str, Candidate] = {}
        self.beam: list[str] = []
        self._state: dict[str, Any] = {}
        self._served: ServedPolicy | None = None
        self._policy: LLM | None = None
        self._optimizer_llm: LLM | None = None
        self._client: Any = None
        self._versions: dict[str, int] = {}  # candidate -> resources version published by this session
        self._convos: dict[str, list[dict[str, Any]]] = {}  # rollout id -> conversation (read from the store)
        self._logged: set[str] = set()

    # -- Algorithm protocol ------------------------------------------------------------------------------------

    async def setup(self, ctx: TrainerContext) -> None:
        """Serve the policy (embedded engine + gateway) unless an `LLM` was given, load the run's state if there is
        one (resume), and publish the seed prompts."""
        self.folder.track = ctx.track
        if self.model is not None:
            check_model_dir(self.model)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._load_state()
        self._state["session"] = self._state.get("session", 0) + 1
        self._save_state()
        # a resumed run: rollouts a crashed session left queued or running name its gateway (gone): cancel them
        active = await ctx.store.query_rollouts(status=[RolloutStatus.QUEUED, RolloutStatus.RUNNING])
        stale = [x.rollout_id for x in active if x.metadata.get("apo_run") == self._state["run_id"]]
        if stale:
            await ctx.store.cancel(stale)
        if self.model is not None:
            self._served = await ServedPolicy.embedded(
                self.model, ctx.store, self.gateway, name=self.settings.served_name, engine_options=self.engine_options
            )
            self._policy = self._served.llm(self.sampling)
        else:
            llm = self.llm
            assert llm is not None  # __init__ requires one of model and llm
            self._policy = msgspec.structs.replace(llm, sampling={**llm.sampling, **self.sampling})
        if self.optimizer == "self":
            assert self._served is not None  # __init__ requires the model for optimizer "self"
            self._optimizer_llm = LLM(
                endpoint=self._served.gateway.bound_url, model=self.settings.served_name,
                api_key=self._served.gateway.token, sampling=self.optimizer_sampling, routed=False,
            )  # fmt: skip
        elif isinstance(self.optimizer, LLM):
            self._optimizer_llm = msgspec.structs.replace(
                self.optimizer, sampling={**self.optimizer_sampling, **self.optimizer.sampling}
            )
        if self._optimizer_llm is not None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(
                base_url=self._optimizer_llm.base_url(), api_key=self._optimizer_llm.api_key or "none", max_retries=2
            )
        await ctx.publish(self._resources(self.candidates["c0"], self.sampling, "seed"))

    async def run(self, ctx: TrainerContext) -> None:
        """Validate the seed prompt, search for ``rounds`` rounds (or until the budget runs out), validate the best
        candidate, write ``best_prompt.json`` and ``report.json``."""
        if not ctx.train_tasks:
            raise ValueError("APO needs training tasks")
        started = time.monotonic()
        val_before = await self._validate(ctx, "c0")
        while self._state["round"] < self.settings.rounds + 1:  # round 0 scores the seed, rounds 1.. expand the beam
            if not await self._round(ctx, self._state["round"]):
                break
        best = self.candidates[self.beam[0]]
        val_after = await self._validate(ctx, best.id)
        published = await ctx.publish(self._resources(best, self.sampling, "best"))
        prompts = self._render(best)
        (self.out_dir / "best_prompt.json").write_text(
            json.dumps({"candidate": best.id, "score": _last_score(best), "prompts": prompts}, indent=2)
        )
        for name, text in prompts.items():
            (self.out_dir / f"best_prompt.{name}.txt").write_bytes(text.encode())  # exactly: a "\r" stays one
        self.report = {
            "val_before": val_before,
            "val_after": val_after,
            "best_candidate": best.id,
            "best_score": _last_score(best),
            "best_prompt": prompts,
            "best_resources_version": published.version,
            "rounds": self._state["round"],
            "candidates": len(self.candidates),
            "rollouts": self._state["rollouts_used"],
            "val_rollouts": self._state["val_rollouts"],
            "optimizer_calls": self._state["optimizer_calls"],
            "minutes": (time.monotonic() - started) / 60,
            "metrics": str(self.out_dir / "metrics.jsonl"),
        }
        self.folder.write_report(self.report)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._served is not None:
            await self._served.close()
            self._served = None

    # -- one round -----------------------------------------------------------------------------------------------

    async def _round(self, ctx: TrainerContext, r: int) -> bool:
        """Propose (round > 0), evaluate every candidate of the round at once, keep the best ``beam_width``.
        Returns False when the budget does not allow the round."""
        pending = self._state.get("pending")
        if pending is None or pending["round"] != r:
            if r == 0:
                ids = ["c0"]
            else:
                per_task = self.settings.n_samples * (len(self.beam) + 1)
                left = self._rollouts_left()
                if left is not None and left < per_task:
                    return False  # not even one task for the beam and one child
                if self.bootstrap_rollouts and self.demo_children:
                    await self._bootstrap(ctx)
                    left = self._rollouts_left()
                    if left is not None and left < per_task:
                        return False
                ids = list(self.beam) + await self._expand(ctx, r)
                if len(ids) == len(self.beam):
                    return False  # nothing new to try
            exclude = {d["task_id"] for i in ids for d in self.candidates[i].demos}
            size = self.settings.batch_size
            left = self._rollouts_left()
            if left is not None:
                size = min(size, left // (len(ids) * self.settings.n_samples))
                if size < 1:
                    return False
            pending = {"round": r, "candidates": ids, "tasks": self._next_tasks(ctx.train_tasks, size, exclude)}
            # counted when fixed
            self._state["rollouts_used"] += len(ids) * len(pending["tasks"]) * self.settings.n_samples
            self._state["pending"] = pending
            self._save_state()
        ids, tasks = pending["candidates"], pending["tasks"]
        for cid in ids:  # one resources version per candidate, published by this session (its gateway's URL)
            if cid not in self._versions:
                version = (await ctx.publish(self._resources(self.candidates[cid], self.sampling, "search"))).version
                self._versions[cid] = self.candidates[cid].version = version
        entries = pending.get("rollouts")
        if entries is None:
            entries = [
                [cid, i, s, self._rollout_id(r, cid, i, s)]
                for cid in ids
                for i in tasks
                for s in range(self.settings.n_samples)
            ]
        elif pending.get("session") != self._state["session"]:  # resumed: keep what finished, redo what did not
            stored = {x.rollout_id: x for x in await ctx.store.query_rollouts(rollout_ids=[e[3] for e in entries])}
            for e in entries:
                if e[3] in stored and stored[e[3]].status not in POLICY_OUTCOMES:
                    e[3] = f"{self._rollout_id(r, e[0], e[1], e[2])}-x{self._state['session']}"
        pending.update(rollouts=entries, session=self._state["session"])
        self._save_state()
        t0 = time.monotonic()
        specs = [
            RolloutSpec(
                task=ctx.train_tasks[i], mode="train", sample_index=s, resources_version=self._versions[cid],
                policy=ctx.retry, rollout_id=rid, metadata=self._metadata(r, cid),
            )
            for cid, i, s, rid in entries
        ]  # fmt: skip
        # every candidate of the round at once, then wait for all of them (rollouts already stored are returned
        # as stored by the store, not run again)
        await ctx.store.enqueue(specs)
        rollouts = await ctx.wait_for([s.rollout_id for s in specs])
        await self._guard.check(ctx.store, rollout_health(r, rollouts), rollouts, stage="APO round")
        by_candidate: dict[str, list[Rollout]] = {cid: [] for cid in ids}
        for rollout in rollouts:
            by_candidate[str(rollout.metadata["apo_candidate"])].append(rollout)
        for cid, runs in by_candidate.items():
            self.candidates[cid].scores[str(r)] = _score(runs)
        ranked = sorted(ids, key=lambda c: (-self.candidates[c].scores[str(r)], _index(c)))
        self.beam = ranked[: self.settings.beam_width]
        for cid in ids:
            c = self.candidates[cid]
            self._record(
                f"candidate:{r}:{cid}",
                {
                    "kind": "candidate", "round": r, "candidate": cid, "parent": c.parent, "origin": c.origin,
                    "score": c.scores[str(r)], "rollouts": len(by_candidate[cid]),
                    "successes": sum(1 for x in by_candidate[cid] if succeeded(x, self.success_threshold)),
                    "excluded": sum(1 for x in by_candidate[cid] if x.status not in POLICY_OUTCOMES),
                    "resources_version": c.version, "kept": cid in self.beam, "demos": len(c.demos),
                    "prompts": self._render(c),
                },
            )  # fmt: skip
        self._state["round"] = r + 1
        self._state["pending"] = None
        self._state["beam"] = self.beam
        self._state.setdefault("last_rollouts", {})[str(r)] = {
            cid: [x.rollout_id for x in by_candidate[cid]] for cid in ids
        }
        self._save_state()
        best = self.candidates[self.beam[0]]
        self._record(
            f"round:{r}",
            {
                "kind": "round", "round": r, "candidates": ids, "beam": self.beam, "best": best.id,
                "best_score": best.scores[str(r)], "rollouts_used": self._state["rollouts_used"],
                "optimizer_calls": self._state["optimizer_calls"], "round_s": time.monotonic() - t0,
            },
        )  # fmt: skip
        ctx.log(r, best_score=best.scores[str(r)], candidates=len(ids), rollouts_used=self._state["rollouts_used"])
        return True

    async def _expand(self, ctx: TrainerContext, r: int) -> list[str]:
        """Children of every beam member; proposals already made for this round (a resumed run) are reused."""
        children: list[str] = []
        seen = {json.dumps(self._render(self.candidates[c]), sort_keys=True) for c in self.beam}
        pool = await self._demo_pool(ctx) if self.demo_children else []
        for parent_id in self.beam:
            parent = self.candidates[parent_id]
            for slot in range(self.gradient_children):
                child = self._existing(r, parent_id, "gradient", slot)
                if child is None:
                    if not self._optimizer_calls_left(2):
                        break
                    child = await self._gradient_child(ctx, parent, r, slot)
                children += self._unique(child, seen)
            for slot in range(self.demo_children):
                child = self._existing(r, parent_id, "demos", slot)
                if child is None:
                    child = self._demo_child(parent, r, slot, pool)
                children += self._unique(child, seen)
        return children

    def _unique(self, child: Candidate | None, seen: set[str]) -> list[str]:
        if child is None or child.origin == "rejected":
            return []
        key = json.dumps(self._render(child), sort_keys=True)
        if key in seen:
            return []
        seen.add(key)
        return [child.id]

    def _existing(self, r: int, parent: str, origin: str, slot: int) -> Candidate | None:
        for c in self.candidates.values():
            if c.round == r and c.parent == parent and c.slot == slot and c.origin in (origin, f"rejected-{origin}"):
                return c
        return None

    def _new_candidate(self, **fields: Any) -> Candidate:
        candidate = Candidate(id=f"c{len(self.candidates)}", **fields)
        self.candidates[candidate.id] = candidate
        self._save_state()
        return candidate

    # -- textual gradients -------------------------------------------------------------------------------------

    async def _gradient_child(self, ctx: TrainerContext, parent: Candidate, r: int, slot: int) -> Candidate | None:
        names = [n for n in self.prompts if not (self.demo_format == "messages" and n == self.demo_template)]
        name = names[(r + slot) % len(names)]
        traces = await self._traces_for(ctx, parent)
        values = {"name": name, "prompt": parent.instructions[name], "traces": traces}
        critique = await self._ask(self._fill("critique.md", values))
        placeholders = _placeholders(self.prompts[name])
        values.update(critique=critique, placeholders=", ".join("{" + p + "}" for p in placeholders) or "(none)")
        edited = _extract_prompt(await self._ask(self._fill("edit.md", values)))
        instructions = {**parent.instructions, name: edited}
        ok = bool(edited.strip()) and _placeholders(edited) == placeholders
        return self._new_candidate(
            parent=parent.id, round=r, origin="gradient" if ok else "rejected-gradient", slot=slot,
            instructions=instructions, demos=list(parent.demos), critique=critique,
        )  # fmt: skip

    async def _ask(self, prompt: str) -> str:
        self._state["optimizer_calls"] += 1
        self._save_state()  # counted before the call: a crash never lets the budget be exceeded
        llm = self._optimizer_llm
        assert llm is not None  # asked only when an optimizer is configured (textual gradients)
        response = await self._client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": prompt}], **llm.sampling
        )
        return response.choices[0].message.content or ""

    def _fill(self, file: str, values: dict[str, str]) -> str:
        path = (
            self.prompts_dir / file if self.prompts_dir and (self.prompts_dir / file).exists() else PROMPTS_DIR / file
        )
        template = path.read_text(encoding="utf-8")
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template)

    async def _traces_for(self, ctx: TrainerContext, parent: Candidate) -> str:
        """Up to ``trace_examples`` runs of the parent's last evaluation, failures and successes alternating."""
        last = max(parent.scores, key=int)
        ids = self._state["last_rollouts"][last][parent.id]
        rollouts = await ctx.store.query_rollouts(rollout_ids=ids)
        failed = [x for x in rollouts if x.status in POLICY_OUTCOMES and not succeeded(x, self.success_threshold)]
        good = [x for x in rollouts if succeeded(x, self.success_threshold)]
        picked: list[Rollout] = []
        while len(picked) < self.settings.trace_examples and (failed or good):
            for group in (failed, good):
                if group and len(picked) < self.settings.trace_examples:
                    picked.append(group.pop(0))
        blocks = []
        for i, x in enumerate(picked, 1):
            convo = render_conversation(await self._conversation(ctx.store, x))[: self.settings.trace_chars]
            task = json.dumps(x.task.input, ensure_ascii=False)[:500]
            blocks.append(f"### Run {i} (reward {x.reward if x.reward is not None else 0.0})\nTask: {task}\n{convo}")
        return "\n\n".join(blocks) or "(no finished runs)"

    # -- demonstrations ---------------------------------------------------------------------------------------

    async def _demo_pool(self, ctx: TrainerContext) -> list[dict[str, Any]]:
        """Successful rollouts of this run's search so far, rendered as demonstrations, then those ``demo_traces``
        picks from a store."""
        ids = [
            rid for per_round in self._state["last_rollouts"].values() for runs in per_round.values() for rid in runs
        ]
        pool = await self._demonstrations(ctx.store, await ctx.store.query_rollouts(rollout_ids=ids))
        return pool + await self._stored_demos(ctx)

    async def _demonstrations(self, store: Store, rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
        pool = []
        for x in rollouts:
            if not succeeded(x, self.success_threshold):
                continue
            convo = await self._conversation(store, x)
            if not convo:
                continue
            text = render_demonstration(convo)
            pool.append(
                {"rollout_id": x.rollout_id, "task_id": x.task.task_id, "reward": x.reward, "text": text,
                 "messages": demonstration_messages(convo)}
            )  # fmt: skip
        return pool

    async def _stored_demos(self, ctx: TrainerContext) -> list[dict[str, Any]]:
        """The successful rollouts ``demo_traces`` picks (the newest `DEMO_TRACES_MAX`; this run's own search
        rollouts left out, they are in the pool already), read once per session: their conversations become
        demonstrations like the search's own successes (a stronger model's or production's runs of the same agent
        teach a small model that rarely succeeds on its own)."""
        if self.demo_traces is None:
            return []
        if self._stored_pool is None:
            source: Store = ctx.store
            if self.demo_traces.store is not None:
                from lightrail.store import open_store

                source = open_store(self.demo_traces.store, token=os.environ.get("LIGHTRAIL_TOKEN"))
            try:
                picked, _ = self.demo_traces.apply(await source.query_rollouts())
                run_id = self._state["run_id"]
                picked = [
                    x for x in picked
                    if x.metadata.get("apo_run") != run_id and succeeded(x, self.success_threshold)
                ][-DEMO_TRACES_MAX:]  # fmt: skip
                self._stored_pool = await self._demonstrations(source, picked)
                # another run's task ids are its own: a demonstration of one of our training problems must keep
                # that problem out of the batches all the same, so it takes the id of our task with its input
                ours = {_input_key(t.input): t.task_id for t in ctx.train_tasks}
                inputs = {x.rollout_id: _input_key(x.task.input) for x in picked}
                for demo in self._stored_pool:
                    demo["task_id"] = ours.get(inputs[demo["rollout_id"]], demo["task_id"])
            finally:
                if source is not ctx.store:
                    await source.close()
            self._record(
                "demo_traces",
                {"kind": "demo_traces", "successes": len(picked), "demonstrations": len(self._stored_pool)},
            )
        return self._stored_pool

    async def _bootstrap(self, ctx: TrainerContext) -> None:
        """Once per run, when the search has fewer than ``demo_k`` successful traces (a zero-shot prompt a small model
        rarely solves): up to ``bootstrap_rollouts`` more rollouts of the best candidate on new tasks, sampled with
        ``bootstrap_sampling`` (hotter: more diverse), counted in the rollout budget. Their successes join the pool
        of demonstrations; they score nothing."""
        boot = self._state.get("bootstrap")
        if boot is None:
            successes = sum(1 for _ in await self._demo_pool(ctx))
            left = self._rollouts_left()
            size = self.bootstrap_rollouts if left is None else min(self.bootstrap_rollouts, left)
            if successes >= self.settings.demo_k or size < 1:
                boot = {"candidate": None, "tasks": [], "done": True}
            else:
                boot = {
                    "candidate": self.beam[0],
                    "tasks": self._next_tasks(ctx.train_tasks, size, set()),
                    "done": False,
                }
                self._state["rollouts_used"] += len(boot["tasks"])
            self._state["bootstrap"] = boot
            self._save_state()
        if boot["done"]:
            return
        cid = boot["candidate"]
        version = (await ctx.publish(self._resources(self.candidates[cid], self._boot_sampling(), "bootstrap"))).version
        specs = [
            RolloutSpec(
                task=ctx.train_tasks[i], mode="train", resources_version=version, policy=ctx.retry,
                rollout_id=f"apo-{self._state['run_id']}-boot-{cid}-t{i}", metadata=self._metadata("bootstrap", cid),
            )
            for i in boot["tasks"]
        ]  # fmt: skip
        await ctx.store.enqueue(specs)
        rollouts = await ctx.wait_for([x.rollout_id for x in specs])
        boot.update(done=True, rollouts=[x.rollout_id for x in rollouts])
        self._state["last_rollouts"].setdefault("bootstrap", {})[cid] = boot["rollouts"]
        self._save_state()
        found = sum(1 for x in rollouts if succeeded(x, self.success_threshold))
        self._record(
            "bootstrap",
            {"kind": "bootstrap", "candidate": cid, "rollouts": len(rollouts), "successes": found,
             "rollouts_used": self._state["rollouts_used"]},
        )  # fmt: skip

    def _boot_sampling(self) -> dict[str, Any]:
        return {**self.sampling, **self.bootstrap_sampling}

    def _demo_child(self, parent: Candidate, r: int, slot: int, pool: list[dict[str, Any]]) -> Candidate | None:
        demos = select_demonstrations(
            pool, k=self.settings.demo_k, max_chars=self.settings.demo_chars, start=slot + r - 1
        )
        picked = [d["rollout_id"] for d in demos]
        siblings = [c for c in self.candidates.values() if c.round == r and c.parent == parent.id and c.demos]
        if not demos or any(picked == [d["rollout_id"] for d in c.demos] for c in [parent, *siblings]):
            return None  # a pool smaller than the slots: the same pick again would only be scored twice
        return self._new_candidate(
            parent=parent.id, round=r, origin="demos", slot=slot, instructions=dict(parent.instructions), demos=demos
        )

    async def _conversation(self, store: Store, rollout: Rollout) -> list[dict[str, Any]]:
        """The last chat call's messages plus its answer, from the spans of the rollout's last attempt."""
        if rollout.rollout_id not in self._convos:
            from lightrail.adapters.messages import spans_to_messages

            (spans,) = await last_attempt_spans(store, [rollout])
            samples = spans_to_messages(spans)
            self._convos[rollout.rollout_id] = samples[-1].messages if samples else []
        return self._convos[rollout.rollout_id]

    # -- candidates as resources -------------------------------------------------------------------------------

    def _render(self, candidate: Candidate) -> dict[str, str]:
        out = dict(candidate.instructions)
        if candidate.demos and self.demo_format == "messages":
            seed = json.loads(candidate.instructions[self.demo_template] or "[]")
            out[self.demo_template] = json.dumps(seed + [m for d in candidate.demos for m in d["messages"]])
        elif candidate.demos:
            block = (
                DEMO_HEADER
                + "\n\n"
                + "\n\n".join(f"Example {i}:\n{d['text']}" for i, d in enumerate(candidate.demos, 1))
            )
            if _placeholders(self.prompts[self.demo_template]):
                block = block.replace("{", "{{").replace("}", "}}")
            out[self.demo_template] = out[self.demo_template].rstrip() + "\n\n" + block
        return out

    def _resources(self, candidate: Candidate, sampling: dict[str, Any], purpose: str) -> Resources:
        assert self._policy is not None  # set by setup, before any round
        policy = msgspec.structs.replace(self._policy, sampling=sampling)
        items: dict[str, LLM | PromptTemplate] = dict(policy_resources(policy, self.settings.llm_name))
        items.update({name: PromptTemplate(template=text) for name, text in self._render(candidate).items()})
        digest = hashlib.sha256(json.dumps([purpose, candidate.id], sort_keys=True).encode()).hexdigest()[:12]
        # the gateway's token changes with each start: a resumed run publishes a new version, never a conflict
        token = hashlib.sha256((policy.api_key or "").encode()).hexdigest()[:8]
        return Resources(items=items, resources_id=f"res-apo-{self._state['run_id']}-{digest}-{token}")

    def _rollout_id(self, r: int, cid: str, task_index: int, sample: int) -> str:
        return f"apo-{self._state['run_id']}-r{r}-{cid}-t{task_index}-s{sample}"

    def _metadata(self, r: int | str, cid: str) -> dict[str, Any]:
        return {
            "apo_run": self._state["run_id"], "apo_round": r, "apo_candidate": cid,
            "apo_parent": self.candidates[cid].parent,
        }  # fmt: skip

    # -- validation --------------------------------------------------------------------------------------------

    async def _validate(self, ctx: TrainerContext, cid: str) -> float | None:
        """Held-out success of a candidate (greedy by default); done once per candidate per run."""
        if not ctx.val_tasks:
            return None
        done = self._state["val"].get(cid)
        if done is not None:
            return done
        version = (await ctx.publish(self._resources(self.candidates[cid], self.val_sampling, "val"))).version
        specs = [
            RolloutSpec(
                task=task, mode="val", resources_version=version, policy=ctx.retry,
                rollout_id=f"apo-{self._state['run_id']}-val-{cid}-t{i}-x{self._state['session']}",
                metadata=self._metadata("val", cid),
            )
            for i, task in enumerate(ctx.val_tasks)
        ]  # fmt: skip
        await ctx.store.enqueue(specs)
        rollouts = await ctx.wait_for([s.rollout_id for s in specs])
        success = success_rate(rollouts, self.success_threshold)
        self._state["val"][cid] = success
        self._state["val_rollouts"] += len(specs)
        self._save_state()
        self._record(
            f"val:{cid}", {"kind": "val", "candidate": cid, "val_success": success, "val_rollouts": len(specs)}
        )
        return success

    # -- budget, tasks, state ----------------------------------------------------------------------------------

    def _rollouts_left(self) -> int | None:
        return None if self.settings.max_rollouts is None else self.settings.max_rollouts - self._state["rollouts_used"]

    def _optimizer_calls_left(self, need: int) -> bool:
        return (
            self.settings.max_optimizer_calls is None
            or self._state["optimizer_calls"] + need <= self.settings.max_optimizer_calls
        )

    def _next_tasks(self, tasks: Sequence[Task], size: int, exclude: set[str]) -> list[int]:
        """Indexes of the next ``size`` tasks of a seeded shuffle (reshuffled each epoch), skipping ``exclude``."""
        order: list[int] = self._state["order"]
        picked: list[int] = []
        tries = 0
        while len(picked) < min(size, len(tasks)) and tries < 2 * len(tasks) + size:
            tries += 1
            if not order:
                self._state["epoch"] += 1
                order.extend(range(len(tasks)))
                random.Random(f"{self.settings.seed}:{self._state['epoch']}").shuffle(order)
            i = order.pop()
            if tasks[i].task_id not in exclude and i not in picked:
                picked.append(i)
        return picked

    def _load_state(self) -> None:
        path = self.out_dir / _STATE
        if path.exists():
            self._state = json.loads(path.read_text())
            if self._state.get("prompts") != self.prompts:
                raise ValueError(
                    f"{path} is a run over other seed prompts; use another out_dir (or delete it) to start over"
                )
            self.candidates = {c["id"]: Candidate(**c) for c in self._state["candidates"]}
            self.beam = list(self._state["beam"])
            metrics = self.out_dir / "metrics.jsonl"
            if metrics.exists():
                self._logged = {json.loads(line).get("key", "") for line in metrics.read_text().splitlines() if line}
            return
        self._state = {
            "run_id": secrets.token_hex(4), "prompts": self.prompts, "round": 0, "beam": [], "pending": None,
            "optimizer_calls": 0, "rollouts_used": 0, "val_rollouts": 0, "val": {}, "order": [], "epoch": 0,
            "last_rollouts": {}, "candidates": [],
        }  # fmt: skip
        self.candidates = {}
        self._new_candidate(parent=None, round=0, origin="seed", instructions=dict(self.prompts))

    def _save_state(self) -> None:
        self._state["candidates"] = [asdict(c) for c in self.candidates.values()]
        path = self.out_dir / _STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        tmp.replace(path)  # atomic: a crash leaves the old state or the new one

    def _record(self, key: str, metrics: dict[str, Any]) -> None:
        if key in self._logged:  # written before a crash that came before the state was saved
            return
        self._logged.add(key)
        self.folder.append({"key": key, **metrics})  # trackers skip the key (not a number)


# -- pure helpers ------------------------------------------------------------------------------------------------


def _input_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def render_conversation(messages: Sequence[dict[str, Any]]) -> str:
    """A conversation as text (the system prompt left out: it is the prompt being optimized)."""
    lines = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = (content or "").strip()
        if role == "system":
            continue
        if role == "user":
            lines.append(f"User: {content}")
        elif role == "assistant":
            calls = [_render_call(c) for c in m.get("tool_calls") or ()]
            lines.append("Assistant: " + "\n".join(x for x in [content, *calls] if x))
        elif role == "tool":
            lines.append(f"Tool: {content}")
    return "\n".join(lines)


def render_demonstration(messages: Sequence[dict[str, Any]]) -> str:
    """A successful conversation as a worked example (same rendering as `render_conversation`)."""
    return render_conversation(messages)


def demonstration_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A successful conversation as chat messages to put before a new task (system messages left out)."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    return [{k: m[k] for k in keep if k in m} for m in messages if m.get("role") != "system"]


def _render_call(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # else shown as the model wrote it
            args = json.loads(args)
    body = json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def select_demonstrations(
    pool: Sequence[dict[str, Any]], *, k: int, max_chars: int, start: int = 0
) -> list[dict[str, Any]]:
    """Pick up to ``k`` demonstrations (one per task) whose texts fit ``max_chars`` together: ranked by reward
    (higher first), then length (shorter first); the first pick is the ``start``-th of that ranking (so sibling
    candidates differ), the rest farthest-first by word overlap with those already picked (diversity)."""
    best: dict[str, dict[str, Any]] = {}
    for d in pool:  # one per task: its best, shortest run
        key = d["task_id"]
        if key not in best or (-d["reward"], len(d["text"])) < (-best[key]["reward"], len(best[key]["text"])):
            best[key] = d
    ranked = sorted(best.values(), key=lambda d: (-d["reward"], len(d["text"]), d["rollout_id"]))
    ranked = [d for d in ranked if len(d["text"]) <= max_chars]
    if not ranked:
        return []
    first = ranked[start % len(ranked)]
    chosen, used = [first], len(first["text"])
    words = {d["rollout_id"]: set(re.findall(r"[a-z]+", d["text"].lower())) for d in ranked}
    while len(chosen) < k:
        options = [d for d in ranked if d not in chosen and used + len(d["text"]) <= max_chars]
        if not options:
            break

        def distance(d: dict[str, Any]) -> float:
            return min(1 - _jaccard(words[d["rollout_id"]], words[c["rollout_id"]]) for c in chosen)

        pick = max(options, key=lambda d: (distance(d), d["reward"], -len(d["text"])))
        chosen.append(pick)
        used += len(pick["text"])
    return [{k_: d[k_] for k_ in ("rollout_id", "task_id", "reward", "text", "messages") if k_ in d} for d in chosen]


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _placeholders(template: str) -> list[str]:
    """The ``{field}`` names of a `str.format` template, sorted (escaped ``{{`` braces are not fields)."""
    try:
        return sorted({name for _, name, _, _ in string.Formatter().parse(template) if name is not None})
    except ValueError:  # unbalanced braces: not a valid template
        return ["<invalid template>"]


def _extract_prompt(text: str) -> str:
    found = re.findall(r"<prompt>(.*?)</prompt>", text, re.DOTALL)
    if found:
        return found[-1].strip()
    return re.sub(r"^\s*<prompt>|</prompt>\s*$", "", text).strip()


def _score(rollouts: Sequence[Rollout]) -> float:
    """Mean reward over the rollouts that ran (infrastructure failures are not the prompt's fault)."""
    rewards = [r.reward if r.reward is not None else 0.0 for r in rollouts if r.status in POLICY_OUTCOMES]
    return statistics.fmean(rewards) if rewards else 0.0


def _last_score(candidate: Candidate) -> float | None:
    return candidate.scores[max(candidate.scores, key=int)] if candidate.scores else None


def _index(cid: str) -> int:
    return int(cid[1:])


def kwargs_from_config(section: dict[str, Any], where: str = "apo") -> dict[str, Any]:
    """A config's ``apo:`` section (plain data) as `APO` arguments (`section_objects`); errors are ValueErrors that
    start with the field's path (``apo.rounds: Expected `int`, got `str```)."""
    return section_objects(convert(section, APOSection, where, strict=False), where)


def section_objects(settings: APOSection, where: str = "apo") -> dict[str, Any]:
    """A checked `APOSection` as `APO` arguments: the section and, as objects, ``llm``, ``optimizer`` and
    ``demo_traces``; a ValueError naming the field when one of them is not what it should be."""
    kwargs: dict[str, Any] = {"section": settings, "optimizer": settings.optimizer}
    for name, routed in (("optimizer", False), ("llm", True)):
        value = getattr(settings, name)
        if isinstance(value, dict):
            kwargs[name] = convert({"routed": routed, **value}, LLM, f"{where}.{name}")
        elif value is not None and (routed or value != "self"):
            raise ValueError(f"{where}.{name}: expected {'' if routed else 'self or '}a mapping of LLM fields")
    if settings.demo_traces is not None:
        kwargs["demo_traces"] = convert(settings.demo_traces, TraceFilter, f"{where}.demo_traces")
    return kwargs
