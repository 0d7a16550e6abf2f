"""Migrating from verl / agent-lightning: a verl config dict (what ``agl.VERL(config)`` takes) as `GRPO` settings.

`VERL_KEYS` is the one table: every verl key lightrail accepts, the lightrail setting it sets (or, for a key that
only tunes verl's GPU machinery, why it has no effect here), checked value by value. A key outside the table, or a
value lightrail cannot honour (``rollout.name: sglang``), is a one-line `ValueError` naming the key: nothing is
ignored silently. Keys the dict leaves out keep lightrail's defaults, except where verl's default changes what is
trained: such a key carries verl's default (`VerlKey.default`: dual-clip's ``clip_ratio_c`` 3.0; with ``gae``,
``algorithm.gamma`` and ``lam`` 1.0; with ``lora_rank``, ``lora_alpha`` 16), applied as if the dict had said it.

The loss a verl dict describes is verl's own: tests/trainer/test_verl_parity.py runs verl's
``verl.trainer.ppo.core_algos`` (installed by scripts/_env_verl.sh) and lightrail's `policy_loss` on the same
tensors, values and gradients; ``bench/verl_parity.py`` prints the largest difference.

Two ways in, one mapping (`verl_settings`):

* Python, as agent-lightning's seeds do: ``lightrail.VERL(config)`` (`lightrail.trainer.config.VERL`) returns the
  `GRPO` those settings describe;
* a config file: ``algorithm: verl`` with the dict under ``verl:`` (`lightrail.trainer.config.load_config` turns it
  into the ``grpo:`` section, the ``model``, the run's ``name`` and ``trainer.loggers``).

``docs/algorithms.md`` shows the table as `markdown_table` renders it (a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VERL_KEYS", "VerlKey", "VerlSettings", "markdown_table", "verl_settings"]


@dataclass
class VerlSettings:
    """What a verl dict says, in lightrail's terms."""

    grpo: dict[str, Any] = field(default_factory=dict)
    """The ``grpo:`` section of a config file (``config`` a mapping of `UpdateConfig` fields)."""
    model: str | None = None
    """``actor_rollout_ref.model.path``."""
    name: str | None = None
    """``trainer.experiment_name``: the run's name (its folder ``runs/<name>``)."""
    loggers: list[dict[str, Any]] | None = None
    """``trainer.logger`` (and ``project_name``) as ``trainer.loggers`` entries (`LoggerSettings` fields)."""

    def set(self, dotted: str, value: Any) -> None:
        """Set ``grpo.<dotted>`` (``config.lr``, ``sampling.max_tokens``...)."""
        node = self.grpo
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value


Apply = Callable[[Any, Mapping[str, Any], VerlSettings], None]
"""``apply(value, whole, out)``: set ``out`` from one key's value (``whole``: every key of the dict, dotted, for the
keys that depend on another); raise `_Refused` for a value lightrail cannot honour."""


class _Refused(ValueError):
    """A value lightrail cannot honour; `verl_settings` adds the key's path."""


@dataclass(frozen=True)
class VerlKey:
    """One verl key lightrail accepts."""

    path: str
    """verl's dotted path (``actor_rollout_ref.rollout.n``)."""
    sets: str
    """The lightrail setting(s) it sets; empty when it has no effect here."""
    how: str
    """How the value maps, or why it has no effect."""
    apply: Apply
    default: Any = None
    """verl's default, applied when the dict leaves the key out (None: the key is then not applied at all)."""


def _to(setting: str, convert: Callable[[Any], Any] = lambda v: v) -> Apply:
    def apply(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
        out.set(setting, convert(value))

    return apply


def _no_effect(allowed: Callable[[Any], bool] = lambda v: True, refusal: str = "") -> Apply:
    def apply(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
        if not allowed(value):
            raise _Refused(refusal)

    return apply


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused(f"expected an integer, got {value!r}")
    return value


def _positive(value: Any) -> int:
    if _int(value) < 1:
        raise _Refused(f"expected an integer >= 1, got {value!r}")
    return int(value)


def _every(value: Any) -> int:
    return max(_int(value), 0)  # verl's -1 (never) is lightrail's 0 (only at the start/end)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Refused(f"expected a number, got {value!r}")
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Refused(f"expected true or false, got {value!r}")
    return value


def _verl_estimators() -> dict[str, Any]:
    """verl's ``adv_estimator`` names of lightrail's registered estimators (`ADVANTAGE_ESTIMATORS`)."""
    from lightrail.adapters.advantages import ADVANTAGE_ESTIMATORS

    return {e.verl_name: e for e in ADVANTAGE_ESTIMATORS.values() if e.verl_name}


def _estimator(value: Any) -> str:
    known = _verl_estimators()
    if value not in known:
        raise _Refused(f"lightrail's estimators are {', '.join(known)}")
    return str(known[value].name)


def _estimator_names() -> str:
    """``grpo, rloo, reinforce_plus_plus (reinforce_pp), ...``: verl's names, with lightrail's where they differ."""
    return ", ".join(name if name == e.name else f"{name} ({e.name})" for name, e in _verl_estimators().items())


def _loss_names() -> str:
    from lightrail.model.policy_losses import POLICY_LOSSES

    return ", ".join(POLICY_LOSSES)


def _uses_gae(whole: Mapping[str, Any]) -> bool:
    """The dict trains a critic (verl's ``gae``: PPO with a value head)."""
    estimator = _verl_estimators().get(str(whole.get("algorithm.adv_estimator")))
    return estimator is not None and estimator.critic


def _gamma(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    gamma = _number(value)
    if _uses_gae(whole):
        out.set("config.critic.gamma", gamma)
    elif gamma != 1.0:  # verl's reinforce_plus_plus discounts token returns by it; lightrail's estimators do not
        raise _Refused("lightrail discounts only inside GAE (adv_estimator gae): only 1.0 is accepted otherwise")


def _lam(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    lam = _number(value)
    if _uses_gae(whole):
        out.set("config.critic.lam", lam)


_FILTER = "algorithm.filter_groups"
#: verl's filter metrics that are the one reward lightrail records (it has no KL in the reward: ``use_kl_in_reward``).
_FILTER_METRICS = ("score", "seq_reward", "seq_final_reward")


def _filter_groups(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if _flag(value) and f"{_FILTER}.max_num_gen_batches" not in whole:  # (the rounds are set by that key)
        raise _Refused(f"set {_FILTER}.max_num_gen_batches: verl's default 0 samples without limit, lightrail bounds "
                       "the rounds a step samples")  # fmt: skip


def _max_num_gen_batches(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if whole.get(f"{_FILTER}.enable") is not True:
        _int(value)
    elif _int(value) < 1:
        raise _Refused("verl's 0 or less samples without limit; lightrail bounds the rounds a step samples (>= 1)")
    else:
        out.set("filter_groups.max_rounds", value)


def _filter_metric(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    # verl's own defaults (enable false, metric null) pass; enabled, the metric must be the one reward lightrail has
    if whole.get(f"{_FILTER}.enable") is True and value is not None and value not in _FILTER_METRICS:
        raise _Refused(f"lightrail filters on the reward: {', '.join(_FILTER_METRICS)}")


def _kl_type(value: Any) -> str:
    from lightrail.model.kl import KL_ESTIMATORS

    if value not in KL_ESTIMATORS:
        raise _Refused(f"lightrail's KL estimators are {', '.join(KL_ESTIMATORS)}")
    return str(value)


def _clip_ratio_c(value: Any) -> float:
    c = _number(value)
    if not c > 1.0:
        raise _Refused("dual-clip's bound must be > 1 (verl asserts it too)")
    return c


def _loss_mode(value: Any) -> str:
    from lightrail.model.policy_losses import POLICY_LOSSES

    if value not in POLICY_LOSSES:
        raise _Refused(f"lightrail's policy losses are {', '.join(POLICY_LOSSES)}")
    return str(value)


def _dual_clip(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    from lightrail.model.policy_losses import POLICY_LOSSES

    c = _clip_ratio_c(value)
    mode = whole.get(f"{_ACTOR}.policy_loss.loss_mode", "vanilla")
    if mode not in POLICY_LOSSES or POLICY_LOSSES[mode].dual_clip:  # (an unknown mode is refused by its own key)
        out.set("config.clip_ratio_c", c)


_LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _loss_agg(value: Any) -> str:
    if value not in _LOSS_AGG_MODES:
        raise _Refused(f"lightrail aggregates by {', '.join(_LOSS_AGG_MODES)}")
    return str(value).replace("-", "_")


def _loss_scale_factor(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if value is not None:  # verl's null: the padded response length, which is lightrail's default L (max_tokens)
        out.set("config.loss_norm_tokens", _positive(value))


def _engine_kwargs_vllm(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if not isinstance(value, Mapping):
        raise _Refused(f"expected a mapping of vLLM engine arguments, got {value!r}")
    if not _uses_vllm(whole):
        return  # verl reads the sub-dict of the engine in use only
    args = out.grpo.setdefault("vllm", {}).setdefault("args", [])
    for name, arg in value.items():
        flag = f"--{str(name).replace('_', '-')}"
        if arg is True:
            args.append(flag)
        elif arg is False or arg is None:
            raise _Refused(f"{name}: {arg!r}: lightrail passes vllm serve flags, not their absence; leave {name} out")
        else:
            args.extend([flag, str(arg)])


def _lora(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    rank = _int(whole.get(f"{_MODEL}.lora_rank", 0))
    if rank < 0:
        raise _Refused(f"expected lora_rank >= 0, got {rank}")
    alpha = _positive(whole[f"{_MODEL}.lora_alpha"])
    modules = whole.get(f"{_MODEL}.target_modules", "all-linear")
    if modules != "all-linear":
        modules = [modules] if isinstance(modules, str) else modules
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules) or not modules:
            raise _Refused(f"expected all-linear or a list of module names, got {modules!r}")
    if rank == 0:  # verl's 0: full fine-tuning; lora_alpha and target_modules then have no effect there either
        return
    lora: dict[str, Any] = {"r": rank, "alpha": alpha}
    if modules != "all-linear":
        lora["target_modules"] = list(modules)
    out.set("config.lora", lora)


def _aggregation_level(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    levels = {"transition": False, "trajectory": True}
    if value not in levels:
        raise _Refused(f"lightrail's levels are {', '.join(levels)}")
    out.set("merge_calls", levels[value])


def _rollout_engine(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    engines = {"vllm": "vllm", "hf": "embedded"}
    if value not in engines:
        raise _Refused("lightrail samples with vllm or hf (its embedded transformers engine); SGLang is not supported")
    out.set("rollout_engine", engines[value])


def _uses_vllm(whole: Mapping[str, Any]) -> bool:
    return whole.get("actor_rollout_ref.rollout.name") == "vllm"


def _vllm_arg(flag: str, convert: Callable[[Any], Any], embedded: Callable[[Any], bool] = lambda v: True) -> Apply:
    """A ``vllm serve`` argument with rollout.name vllm; with the embedded engine, a value ``embedded`` accepts
    (the flag then has no effect) or a refusal."""

    def apply(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
        value = convert(value)
        if _uses_vllm(whole):
            out.grpo.setdefault("vllm", {}).setdefault("args", []).extend([flag, str(value)])
        elif not embedded(value):
            raise _Refused("the embedded engine (rollout.name hf) runs on one device; use rollout.name vllm")

    return apply


def _clip_both(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    out.set("config.clip_low", _number(value))
    out.set("config.clip_high", _number(value))


def _tool_format(value: Any) -> str:
    from lightrail.engine.formats import TOOL_FORMATS

    if value not in TOOL_FORMATS:
        raise _Refused(f"lightrail's tool-call formats are {', '.join(TOOL_FORMATS)}")
    return str(value)


def _response_length(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    tokens = _positive(value)
    out.set("sampling.max_tokens", tokens)
    out.set("val_sampling.max_tokens", tokens)


def _mini_batch(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    batch, mini = whole.get("data.train_batch_size"), _positive(value)
    if not isinstance(batch, int) or batch % mini:
        raise _Refused(f"it must divide data.train_batch_size ({batch}): each mini-batch holds whole task groups")
    out.set("config.mini_batches", batch // mini)


def _kl(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    use = _flag(whole.get("actor_rollout_ref.actor.use_kl_loss", False))
    coef = _number(whole.get("actor_rollout_ref.actor.kl_loss_coef", 0.001))  # verl's default coefficient
    out.set("config.kl_coef", coef if use else 0.0)


def _gpus(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    out.set("config.ranks", _positive(value))
    out.set("config.device", "auto")


def _epochs(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if whole.get("trainer.total_training_steps") is None:  # verl: total_training_steps wins when given
        out.set("epochs", _positive(value))


def _steps(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if value is not None:
        out.set("steps", _positive(value))


_LOGGERS = ("tensorboard", "mlflow", "wandb")


def _loggers(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _Refused(f"expected a list of logger names, got {value!r}")
    unknown = [n for n in names if n != "console" and n not in _LOGGERS]
    if unknown:
        raise _Refused(f"lightrail logs to console (always), {', '.join(_LOGGERS)}; not {', '.join(unknown)}")
    project = whole.get("trainer.project_name")
    out.loggers = [
        {"kind": n, **({"experiment": str(project)} if project and n != "tensorboard" else {})}
        for n in names
        if n != "console"
    ]


def _set_model(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    if not isinstance(value, str) or not value:
        raise _Refused(f"expected a model directory, got {value!r}")
    out.model = value


def _set_name(value: Any, whole: Mapping[str, Any], out: VerlSettings) -> None:
    out.name = str(value)


_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"
_MODEL = "actor_rollout_ref.model"
_AGL = "agentlightning"
_NO_OFFLOAD = (
    "no effect: nothing is offloaded to the host (sharding is `grpo.config.sharding: fsdp`, not set from verl)"
)

VERL_KEYS: tuple[VerlKey, ...] = (
    VerlKey("algorithm.adv_estimator", "grpo.advantage", f"{_estimator_names()} (`lightrail.adapters.advantages."
            "ADVANTAGE_ESTIMATORS`; gae: PPO with a critic, a value head on the policy, `lightrail.model.ppo`); others "
            "refused", _to("advantage", _estimator)),
    VerlKey("algorithm.gamma", "grpo.config.critic.gamma", "GAE's discount with adv_estimator gae (absent: verl's 1.0); "
            "otherwise 1.0 only", _gamma, default=1.0),
    VerlKey("algorithm.lam", "grpo.config.critic.lam", "GAE's lambda with adv_estimator gae (absent: verl's 1.0, not "
            "lightrail's 0.95); no effect otherwise (verl reads it only in GAE)", _lam, default=1.0),
    VerlKey(f"{_FILTER}.enable", "grpo.filter_groups", "DAPO's dynamic sampling: true needs max_num_gen_batches "
            "(verl's default, no limit, is refused)", _filter_groups),
    VerlKey(f"{_FILTER}.max_num_gen_batches", "grpo.filter_groups.max_rounds", "rounds of rollouts a step samples at "
            "most with enable true, >= 1 (0, no limit, refused)", _max_num_gen_batches),
    VerlKey(f"{_FILTER}.metric", "", f"with enable true: {', '.join(_FILTER_METRICS)} or null, the run's one reward "
            "(lightrail filters groups whose advantages are all 0); acc and other reward_extra_info metrics refused "
            "(not recorded)", _filter_metric),
    VerlKey("algorithm.use_kl_in_reward", "", "false only: lightrail's KL term is in the loss (actor.use_kl_loss)",
            _no_effect(lambda v: v is False, "lightrail puts the KL term in the loss (actor.use_kl_loss), not the "
                       "reward")),
    VerlKey("data.train_files", "", "no effect: the tasks are Trainer.fit's (or the config's data:); agent-lightning "
            "does not read them either, its seed script loads them and passes the rows to fit", _no_effect()),
    VerlKey("data.val_files", "", "no effect: as data.train_files", _no_effect()),
    VerlKey("data.train_batch_size", "grpo.tasks_per_step", "tasks per step", _to("tasks_per_step", _positive)),
    VerlKey("data.max_prompt_length", "", "no effect: verl pads every prompt to this length; lightrail pads a "
            "micro-batch only to its longest row and never truncates a prompt", _no_effect(lambda v: isinstance(v, int) and v > 0,
                                                            "expected an integer >= 1")),
    VerlKey("data.max_response_length", "grpo.sampling.max_tokens, grpo.val_sampling.max_tokens",
            "tokens per response, training and validation", _response_length),
    VerlKey("data.truncation", "", "error only (no effect): lightrail never truncates a prompt",
            _no_effect(lambda v: v == "error", "lightrail never truncates a prompt: only 'error' is accepted")),
    VerlKey(f"{_ROLLOUT}.name", "grpo.rollout_engine", "vllm -> vllm, hf -> embedded; sglang refused",
            _rollout_engine),
    VerlKey(f"{_ROLLOUT}.n", "grpo.n_samples", "rollouts per task (one group)", _to("n_samples", _positive)),
    VerlKey(f"{_ROLLOUT}.temperature", "grpo.sampling.temperature", "sampling temperature of training rollouts",
            _to("sampling.temperature", _number)),
    VerlKey(f"{_ROLLOUT}.multi_turn.format", "grpo.engine_options.tool_format",
            "the tool-call format (hermes, llama3_json, mistral, pythonic)",
            _to("engine_options.tool_format", _tool_format)),
    VerlKey(f"{_ROLLOUT}.tensor_model_parallel_size", "grpo.vllm.args",
            "--tensor-parallel-size with rollout.name vllm; 1 only with hf",
            _vllm_arg("--tensor-parallel-size", _positive, lambda v: v == 1)),
    VerlKey(f"{_ROLLOUT}.gpu_memory_utilization", "grpo.vllm.args",
            "--gpu-memory-utilization with rollout.name vllm; no effect with hf (it allocates as it goes)",
            _vllm_arg("--gpu-memory-utilization", _number)),
    VerlKey(f"{_ROLLOUT}.engine_kwargs.vllm", "grpo.vllm.args", "with rollout.name vllm each entry a `vllm serve` "
            "flag (`tool_call_parser: hermes` -> `--tool-call-parser hermes`, true -> the flag alone; the user's flags "
            "win over lightrail's own); no effect with hf (verl reads only the engine in use's sub-dict)",
            _engine_kwargs_vllm),
    VerlKey(f"{_ROLLOUT}.engine_kwargs.sglang", "", "no effect: tunes verl's SGLang engine, which lightrail does not "
            "run (rollout.name sglang is refused)", _no_effect(lambda v: isinstance(v, Mapping),
                                                               "expected a mapping of SGLang engine arguments")),
    VerlKey(f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu", "", "no effect: lightrail takes the old logprobs "
            "from the sampler (no recompute pass to batch)", _no_effect()),
    VerlKey(f"{_ACTOR}.ppo_mini_batch_size", "grpo.config.mini_batches", "data.train_batch_size / "
            "ppo_mini_batch_size optimizer steps per training step, each on whole task groups", _mini_batch),
    VerlKey(f"{_ACTOR}.ppo_micro_batch_size_per_gpu", "", "no effect: it only splits gradient accumulation; "
            "lightrail sizes micro-batches in tokens (grpo.config.micro_batch_tokens)", _no_effect()),
    VerlKey(f"{_ACTOR}.optim.lr", "grpo.config.lr", "learning rate (AdamW)", _to("config.lr", _number)),
    VerlKey(f"{_ACTOR}.use_kl_loss", "grpo.config.kl_coef", "true: kl_coef = actor.kl_loss_coef; false: 0", _kl),
    VerlKey(f"{_ACTOR}.kl_loss_coef", "grpo.config.kl_coef", "with actor.use_kl_loss true", _kl),
    VerlKey(f"{_ACTOR}.kl_loss_type", "grpo.config.kl_estimator", "the KL estimator, by verl's name (`lightrail."
            "model.kl.KL_ESTIMATORS`; absent: low_var_kl, verl's default and lightrail's)",
            _to("config.kl_estimator", _kl_type)),
    VerlKey(f"{_ACTOR}.clip_ratio_c", "grpo.config.clip_ratio_c", "dual-clip PPO's bound for negative advantages "
            "(absent: verl's 3.0; lightrail's own default is off); read by the vanilla policy loss only, as in verl",
            _dual_clip, default=3.0),
    VerlKey(f"{_ACTOR}.policy_loss.loss_mode", "grpo.config.policy_loss", "the policy loss by verl's name "
            f"(`lightrail.model.policy_losses.POLICY_LOSSES`: {_loss_names()}; absent: vanilla); others refused",
            _to("config.policy_loss", _loss_mode)),
    VerlKey(f"{_ACTOR}.loss_agg_mode", "grpo.loss_agg", "token-mean, seq-mean-token-mean, seq-mean-token-sum-norm "
            "(as token_mean...); token-sum and seq-mean-token-sum refused", _to("loss_agg", _loss_agg)),
    VerlKey(f"{_ACTOR}.loss_scale_factor", "grpo.config.loss_norm_tokens", "seq-mean-token-sum-norm's constant L; "
            "null: the response length (data.max_response_length), as in verl", _loss_scale_factor),
    VerlKey(f"{_ACTOR}.entropy_coeff", "", "0 only: lightrail's loss has no entropy bonus",
            _no_effect(lambda v: v == 0, "lightrail's loss has no entropy bonus: only 0 is accepted")),
    VerlKey(f"{_ACTOR}.clip_ratio", "grpo.config.clip_low, grpo.config.clip_high", "both PPO clip ranges",
            _clip_both),
    VerlKey(f"{_ACTOR}.clip_ratio_low", "grpo.config.clip_low", "PPO clip below 1",
            _to("config.clip_low", _number)),
    VerlKey(f"{_ACTOR}.clip_ratio_high", "grpo.config.clip_high", "PPO clip above 1 (DAPO's clip-higher)",
            _to("config.clip_high", _number)),
    VerlKey(f"{_ACTOR}.fsdp_config.param_offload", "", _NO_OFFLOAD, _no_effect(lambda v: isinstance(v, bool))),
    VerlKey(f"{_ACTOR}.fsdp_config.optimizer_offload", "", _NO_OFFLOAD, _no_effect(lambda v: isinstance(v, bool))),
    VerlKey("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "", "no effect: the reference model's "
            "logprobs are computed in the update's micro-batches (only with kl_coef > 0)", _no_effect()),
    VerlKey("actor_rollout_ref.ref.fsdp_config.param_offload", "", _NO_OFFLOAD,
            _no_effect(lambda v: isinstance(v, bool))),
    VerlKey("actor_rollout_ref.model.path", "model", "the model: a local Hugging Face directory (or smollm2)",
            _set_model),
    VerlKey(f"{_MODEL}.lora_rank", "grpo.config.lora.r", "LoRA's rank; 0 (verl's default): full fine-tuning",
            _lora),
    VerlKey(f"{_MODEL}.lora_alpha", "grpo.config.lora.alpha", "LoRA's alpha with lora_rank > 0 (absent: verl's 16, "
            "not lightrail's 32)", _lora, default=16),
    VerlKey(f"{_MODEL}.target_modules", "grpo.config.lora.target_modules", "with lora_rank > 0: a list of module "
            "names; all-linear (verl's default): lightrail's default, the attention and MLP projections of "
            "Llama/Qwen-family models (their every linear layer but lm_head)", _lora),
    VerlKey("actor_rollout_ref.model.use_remove_padding", "", "no effect: a verl kernel option (packed sequences); "
            "lightrail's micro-batches are sized in padded tokens", _no_effect(lambda v: isinstance(v, bool))),
    VerlKey("actor_rollout_ref.model.enable_gradient_checkpointing", "", "no effect: lightrail keeps activations; "
            "grpo.config.micro_batch_tokens bounds their memory", _no_effect(lambda v: isinstance(v, bool))),
    VerlKey("trainer.n_gpus_per_node", "grpo.config.ranks, grpo.config.device", "ranks = GPUs (data-parallel "
            "update ranks, each a full replica unless `grpo.config.sharding: fsdp`), device auto (CUDA when present, else CPU)", _gpus),
    VerlKey("trainer.nnodes", "", "1 only: the update's ranks run on one machine (runners scale out over the store)",
            _no_effect(lambda v: v == 1, "lightrail's update ranks run on one machine: only 1 is accepted")),
    VerlKey("trainer.val_before_train", "grpo.validate_before", "validate before training",
            _to("validate_before", _flag)),
    VerlKey("trainer.test_freq", "grpo.val_every", "validate every N steps (and at the end); -1 -> 0",
            _to("val_every", _every)),
    VerlKey("trainer.save_freq", "grpo.checkpoint_every", "checkpoint every N steps (lightrail always saves at the "
            "end); -1 -> 0", _to("checkpoint_every", _every)),
    VerlKey("trainer.total_epochs", "grpo.epochs", "passes over the training tasks: epochs x (tasks // "
            "train_batch_size) steps, unless total_training_steps", _epochs),
    VerlKey("trainer.total_training_steps", "grpo.steps", "the step count (wins over total_epochs, as in verl)",
            _steps),
    VerlKey("trainer.critic_warmup", "", "0 only: with gae lightrail trains the value head with the policy from "
            "the first step", _no_effect(lambda v: v == 0, "lightrail has no critic-only warm-up: only 0 is accepted")),
    VerlKey("trainer.logger", "trainer.loggers", "tensorboard, mlflow, wandb (offline unless configured); console: "
            "lightrail always prints progress", _loggers),
    VerlKey("trainer.project_name", "trainer.loggers[].experiment", "the MLflow experiment / W&B project",
            _no_effect()),  # read by trainer.logger
    VerlKey("trainer.experiment_name", "name", "the run's name (its folder under runs/)", _set_name),
    VerlKey(f"{_AGL}.port", "", "no effect: Agent Lightning's LLM server port; lightrail's gateway takes a free port "
            "(`GRPO(gateway=GatewaySettings(port=...))`) and agents get its URL in their LLM resource",
            _no_effect(lambda v: isinstance(v, int), "expected a port number")),
    VerlKey(f"{_AGL}.trace_aggregator.level", "grpo.merge_calls", "transition -> false (one row per LLM call), "
            "trajectory -> true (an episode's calls merged where each prompt extends the previous turn)",
            _aggregation_level),
    VerlKey(f"{_AGL}.trace_aggregator.trajectory_max_prompt_length", "", "no effect: lightrail never truncates a "
            "merged row", _no_effect(lambda v: isinstance(v, int) and v > 0, "expected an integer >= 1")),
    VerlKey(f"{_AGL}.trace_aggregator.trajectory_max_response_length", "", "no effect: as "
            "trajectory_max_prompt_length", _no_effect(lambda v: isinstance(v, int) and v > 0,
                                                       "expected an integer >= 1")),
    VerlKey(f"{_AGL}.trace_aggregator.debug", "", "false only: lightrail logs no merge mismatches (a call whose "
            "prompt does not extend the previous turn starts a new row)",
            _no_effect(lambda v: v is False, "lightrail has no merge-mismatch log: only false is accepted")),
    VerlKey(f"{_AGL}.trace_aggregator.mismatch_log_dir", "", "no effect: with debug false, as in Agent Lightning",
            _no_effect()),
)  # fmt: skip

_BY_PATH = {key.path: key for key in VERL_KEYS}


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The dict's leaves by dotted path; a mapping is descended only where the table has keys below it."""
    flat: dict[str, Any] = {}
    for name, value in config.items():
        path = f"{prefix}{name}"
        section = any(p.startswith(f"{path}.") for p in _BY_PATH)
        if section and value is None:  # YAML's empty section (`ref:` with nothing under it)
            continue
        if section and isinstance(value, Mapping):
            flat.update(_flatten(value, f"{path}."))
        elif path in _BY_PATH:
            flat[path] = value
        else:
            raise ValueError(f"verl key {path} is not supported by lightrail ({_supported_near(path)})")
    return flat


def _supported_near(path: str) -> str:
    """The supported keys of ``path``'s section, or the sections when its section is unknown."""
    parent = path.rpartition(".")[0]
    while parent and not any(p.startswith(f"{parent}.") for p in _BY_PATH):
        parent = parent.rpartition(".")[0]
    if not parent:
        return f"supported sections: {', '.join(sorted({p.split('.')[0] for p in _BY_PATH}))}"
    keys = sorted(p.removeprefix(f"{parent}.") for p in _BY_PATH if p.startswith(f"{parent}."))
    return f"supported under {parent}: {', '.join(keys)}"


def verl_settings(config: Mapping[str, Any]) -> VerlSettings:
    """``config`` (a verl dict, nested as verl's YAML) in lightrail's terms; a key or value lightrail does not
    support is a one-line ValueError naming the key."""
    if not isinstance(config, Mapping):
        raise ValueError(f"a verl config is a mapping, got {type(config).__name__}")
    whole = _flatten(config)
    whole.update({key.path: key.default for key in VERL_KEYS if key.default is not None and key.path not in whole})
    out = VerlSettings()
    for path, value in whole.items():
        try:
            _BY_PATH[path].apply(value, whole, out)
        except _Refused as exc:
            raise ValueError(f"verl key {path}: {value!r} is not supported by lightrail ({exc})") from None
    return out


def markdown_table() -> str:
    """`VERL_KEYS` as the Markdown table of ``docs/algorithms.md``."""
    lines = ["| verl key | lightrail setting | how |", "|---|---|---|"]
    for key in VERL_KEYS:
        sets = f"`{key.sets}`" if key.sets else "(accepted)"
        lines.append(f"| `{key.path}` | {sets} | {key.how} |")
    return "\n".join(lines) + "\n"
