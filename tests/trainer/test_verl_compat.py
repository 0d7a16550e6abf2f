"""A verl config dict (agent-lightning's ``agl.VERL(config)``) runs as lightrail's `GRPO`: every key of the seeds'
SQL walkthrough dict maps onto a setting (or is accepted with its reason written down), an unknown key or a value
lightrail cannot honour is a one-line error naming the key, and the walkthrough's config trains end to end."""

from __future__ import annotations

import asyncio
import copy
import sqlite3
from pathlib import Path

import pytest

import lightrail
from lightrail.model.updater import LoraSettings
from lightrail.trainer.config import ConfigError, load_config, train
from lightrail.trainer.verl_compat import VERL_KEYS, markdown_table, verl_settings
from tests._frameworks import needs_langgraph

ROOT = Path(__file__).resolve().parents[2]
VERL_CONFIG = ROOT / "examples" / "sql_agent" / "config.verl.yaml"

# RL_TRAINING_CONFIG of microsoft/agent-lightning examples/spider/train_sql_agent.py (commit 1be4e8d2), the seeds'
# SQL walkthrough, verbatim, plus the keys its `fast` variant sets (total_training_steps).
SEED: dict = {
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "data": {
        "train_files": "data/train_spider.parquet",
        "val_files": "data/test_dev_500.parquet",
        "train_batch_size": 32,
        "max_prompt_length": 4096,
        "max_response_length": 2048,
        "truncation": "error",
    },
    "actor_rollout_ref": {
        "rollout": {
            "tensor_model_parallel_size": 1,
            "n": 4,
            "log_prob_micro_batch_size_per_gpu": 4,
            "multi_turn": {"format": "hermes"},
            "name": "vllm",
            "gpu_memory_utilization": 0.8,
        },
        "actor": {
            "ppo_mini_batch_size": 32,
            "ppo_micro_batch_size_per_gpu": 4,
            "optim": {"lr": 1e-6},
            "use_kl_loss": False,
            "kl_loss_coef": 0.0,
            "entropy_coeff": 0,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.3,
            "fsdp_config": {"param_offload": True, "optimizer_offload": True},
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": 8, "fsdp_config": {"param_offload": True}},
        "model": {
            "path": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "use_remove_padding": True,
            "enable_gradient_checkpointing": True,
        },
    },
    "trainer": {
        "n_gpus_per_node": 1,
        "val_before_train": True,
        "critic_warmup": 0,
        "logger": ["console", "wandb"],
        "project_name": "AgentLightning",
        "experiment_name": "spider",
        "nnodes": 1,
        "test_freq": 32,
        "total_epochs": 2,
    },
}


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out |= _leaves(value, f"{path}.") if isinstance(value, dict) else {path}
    return out


def test_every_key_of_the_seed_dict_is_in_the_table_and_the_example_config_holds_the_seed():
    assert _leaves(SEED) <= {key.path for key in VERL_KEYS}
    assert all(key.how for key in VERL_KEYS)
    example = load_config(VERL_CONFIG).verl  # the shipped walkthrough differs from the seed in two values only
    differ = {p for p in _leaves(SEED) if _get(example, p) != _get(SEED, p)}
    assert differ == {"actor_rollout_ref.rollout.name", "actor_rollout_ref.model.path"}
    assert _leaves(example) == _leaves(SEED)


def _get(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree[key]
    return tree


def test_the_seed_dict_becomes_these_grpo_settings(tmp_path):
    grpo = lightrail.VERL(SEED, out_dir=tmp_path / "run")
    assert isinstance(grpo, lightrail.GRPO)
    assert str(grpo.model) == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert grpo.settings.advantage == "grpo"  # algorithm.adv_estimator
    assert (grpo.settings.tasks_per_step, grpo.settings.n_samples) == (32, 4)  # data.train_batch_size, rollout.n
    assert grpo.sampling["max_tokens"] == grpo.val_sampling["max_tokens"] == 2048  # data.max_response_length
    assert grpo.rollout_engine == "vllm"  # rollout.name
    assert grpo.vllm == {"args": ["--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.8"]}
    assert grpo.engine_options == {"tool_format": "hermes"}  # rollout.multi_turn.format
    config = grpo.config
    assert config is not None
    assert (config.lr, config.kl_coef, config.clip_low, config.clip_high) == (1e-6, 0.0, 0.2, 0.3)
    assert (config.ranks, config.device) == (1, "auto")  # trainer.n_gpus_per_node
    # absent keys whose verl default changes the loss carry verl's default: dual-clip at 3; k3 as in verl
    assert (config.clip_ratio_c, config.kl_estimator, config.critic) == (3.0, "low_var_kl", None)
    assert config.mini_batches == 1  # train_batch_size 32 / ppo_mini_batch_size 32
    assert grpo.settings.validate_before is True and grpo.settings.val_every == 32  # val_before_train, test_freq
    assert grpo.settings.epochs == 2  # total_epochs: steps = 2 x (train tasks // 32), counted when the run starts
    settings = verl_settings(SEED)
    assert settings.name == "spider" and settings.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert settings.loggers == [{"kind": "wandb", "experiment": "AgentLightning"}]  # console: always printed

    fast = copy.deepcopy(SEED)  # the seed's `fast` variant: a step count wins over epochs, as in verl
    fast["trainer"].update(total_training_steps=1, save_freq=-1, val_before_train=False)
    fast["actor_rollout_ref"]["actor"].update(use_kl_loss=True, kl_loss_coef=0.05)
    fast["algorithm"]["adv_estimator"] = "reinforce_plus_plus"
    grpo = lightrail.VERL(fast, out_dir=tmp_path / "fast")
    assert (
        grpo.settings.steps,
        grpo.settings.epochs,
        grpo.settings.checkpoint_every,
        grpo.settings.validate_before,
    ) == (1, None, 0, False)
    assert grpo.config is not None and grpo.config.kl_coef == 0.05 and grpo.settings.advantage == "reinforce_pp"


def test_agent_lightning_example_keys_map_onto_lightrail_settings(tmp_path):
    """What Agent Lightning's own examples add to the seed dict: ``engine_kwargs`` (every example), ``lora_rank``
    (calc_x ``--lora``), the ``agentlightning`` section (calc_x ``--trajectory-level``); and PPO with a critic."""
    config = copy.deepcopy(SEED)
    rollout, actor, model = (config["actor_rollout_ref"][k] for k in ("rollout", "actor", "model"))
    rollout["engine_kwargs"] = {"vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
                                "sglang": {"attention_backend": "triton"}}  # fmt: skip
    model.update(lora_rank=32)
    actor.update(clip_ratio_c=10.0, kl_loss_type="k3+", use_kl_loss=True, kl_loss_coef=0.01,
                 loss_agg_mode="seq-mean-token-mean")  # fmt: skip
    config["agentlightning"] = {
        "port": 9999,
        "trace_aggregator": {
            "level": "transition",
            "debug": False,
            "trajectory_max_prompt_length": 2048,
            "trajectory_max_response_length": 8192,
        },
    }
    grpo = lightrail.VERL(config, out_dir=tmp_path / "run")
    assert grpo.vllm["args"][-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert grpo.config is not None and grpo.config.lora is not None
    assert (grpo.config.lora.r, grpo.config.lora.alpha) == (32, 16)  # verl's lora_alpha default, not lightrail's 32
    assert grpo.config.lora.target_modules == LoraSettings().target_modules  # verl's all-linear
    assert (grpo.config.clip_ratio_c, grpo.config.kl_estimator, grpo.config.kl_coef) == (10.0, "k3+", 0.01)
    assert grpo.settings.loss_agg == "seq_mean_token_mean" and grpo.settings.merge_calls is False

    config["agentlightning"]["trace_aggregator"]["level"] = "trajectory"
    model.update(lora_rank=0, lora_alpha=64, target_modules=["q_proj", "v_proj"])  # rank 0: full fine-tuning
    grpo = lightrail.VERL(config, out_dir=tmp_path / "run")
    assert grpo.settings.merge_calls is True and grpo.config is not None and grpo.config.lora is None

    gae = copy.deepcopy(SEED)
    gae["algorithm"]["adv_estimator"] = "gae"
    grpo = lightrail.VERL(gae, out_dir=tmp_path / "gae")
    assert grpo.settings.advantage == "gae"
    critic = grpo.config.critic if grpo.config is not None else None
    assert critic is not None and (critic.gamma, critic.lam) == (1.0, 1.0)  # verl's, not lightrail's
    gae["algorithm"].update(gamma=0.99, lam=0.9)
    grpo = lightrail.VERL(gae, out_dir=tmp_path / "gae")
    critic = grpo.config.critic if grpo.config is not None else None
    assert critic is not None and (critic.gamma, critic.lam) == (0.99, 0.9)


def test_dapo_dynamic_sampling_maps_onto_grpo_filter_groups(tmp_path):
    """verl's ``algorithm.filter_groups`` (DAPO's recipes set enable, max_num_gen_batches and metric) is lightrail's
    ``grpo.filter_groups`` sub-section; disabled, its other keys change nothing."""
    dapo = _with("algorithm.filter_groups", {"enable": True, "max_num_gen_batches": 6, "metric": "seq_final_reward"})
    grpo = lightrail.VERL(dapo, out_dir=tmp_path / "run")
    assert grpo.settings.filtering is not None and grpo.settings.filtering.max_rounds == 6
    off = _with("algorithm.filter_groups", {"enable": False, "max_num_gen_batches": 0, "metric": None})  # verl's
    assert lightrail.VERL(off, out_dir=tmp_path / "off").settings.filtering is None


def _with(path: str, value) -> dict:
    config = copy.deepcopy(SEED)
    node = config
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("actor_rollout_ref.actor.foo", 1, "verl key actor_rollout_ref.actor.foo is not supported by lightrail "
         "(supported under actor_rollout_ref.actor: clip_ratio, "),
        ("critic.optim.lr", 1e-5, "verl key critic is not supported by lightrail (supported sections: "),
        ("actor_rollout_ref.rollout.name", "sglang", "verl key actor_rollout_ref.rollout.name: 'sglang' is not "
         "supported by lightrail (lightrail samples with vllm or hf"),
        ("algorithm.adv_estimator", "remax", "verl key algorithm.adv_estimator: 'remax' is not supported by "
         "lightrail (lightrail's estimators are grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, gae)"),
        ("algorithm.gamma", 0.9, "algorithm.gamma: 0.9 is not supported by lightrail (lightrail discounts only inside "
         "GAE"),
        ("actor_rollout_ref.actor.clip_ratio_c", 1.0, "clip_ratio_c: 1.0 is not supported by lightrail (dual-clip's "
         "bound must be > 1"),
        ("actor_rollout_ref.actor.kl_loss_type", "full", "kl_loss_type: 'full' is not supported by lightrail "
         "(lightrail's KL estimators are kl, k1, abs, mse, k2, low_var_kl, k3, "),
        ("actor_rollout_ref.actor.loss_agg_mode", "token-sum", "lightrail aggregates by token-mean, "),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm", {"enable_prefix_caching": False}, "enable_prefix_caching: "
         "False: lightrail passes vllm serve flags, not their absence"),
        ("actor_rollout_ref.rollout.engine_kwargs.trtllm", {}, "verl key actor_rollout_ref.rollout.engine_kwargs.trtllm "
         "is not supported by lightrail (supported under actor_rollout_ref.rollout.engine_kwargs: sglang, vllm)"),
        ("actor_rollout_ref.model.target_modules", 5, "expected all-linear or a list of module names"),
        ("agentlightning.reward_fillna_value", 0.0, "verl key agentlightning.reward_fillna_value is not supported by "
         "lightrail (supported under agentlightning: port, trace_aggregator.debug, "),
        ("agentlightning.trace_aggregator.level", "trajectory-strict", "lightrail's levels are transition, trajectory"),
        ("actor_rollout_ref.actor.entropy_coeff", 0.01, "actor_rollout_ref.actor.entropy_coeff: 0.01 is not"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 5, "it must divide data.train_batch_size (32)"),
        ("actor_rollout_ref.rollout.multi_turn.format", "qwen25", "tool-call formats are hermes, llama3_json"),
        ("trainer.nnodes", 2, "verl key trainer.nnodes: 2 is not supported"),
        ("trainer.logger", ["console", "swanlab"], "not swanlab"),
        ("algorithm.filter_groups", {"enable": True}, "verl key algorithm.filter_groups.enable: True is not supported "
         "by lightrail (set algorithm.filter_groups.max_num_gen_batches: verl's default 0 samples without limit"),
        ("algorithm.filter_groups", {"enable": True, "max_num_gen_batches": 0}, "algorithm.filter_groups."
         "max_num_gen_batches: 0 is not supported by lightrail (verl's 0 or less samples without limit"),
        ("algorithm.filter_groups", {"enable": True, "max_num_gen_batches": 4, "metric": "acc"}, "algorithm."
         "filter_groups.metric: 'acc' is not supported by lightrail (lightrail filters on the reward: score, "),
    ],
)  # fmt: skip
def test_an_unsupported_key_or_value_is_one_line_naming_the_key(path, value, message):
    with pytest.raises(ValueError) as caught:
        lightrail.VERL(_with(path, value))
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_a_config_file_with_a_bad_verl_key_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^verl: verl key actor_rollout_ref\.rollout\.name: 'sglang'"):
        load_config(VERL_CONFIG, ["verl.actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ConfigError, match="grpo: n_samples set by the verl section already"):
        load_config(VERL_CONFIG, ["grpo.n_samples=2"])
    with pytest.raises(ConfigError, match=r"^grpo: config\.lr set by the verl section already"):
        load_config(VERL_CONFIG, ["grpo.config.lr=0.1"])
    # a grpo.config key the verl dict leaves unset is added beside verl's (clip_ratio_c: verl's default 3.0)
    config = load_config(VERL_CONFIG, ["grpo.config.micro_batch_tokens=1024"])
    assert config.grpo.config["micro_batch_tokens"] == 1024 and config.grpo.config["clip_ratio_c"] == 3.0
    with pytest.raises(ConfigError, match="runs with algorithm: verl"):
        load_config(VERL_CONFIG, ["algorithm=grpo"])


def test_the_config_file_maps_onto_the_grpo_section_model_name_and_loggers():
    config = load_config(VERL_CONFIG)
    assert config.algorithm == "grpo" and config.model == "smollm2" and config.name == "spider"
    assert config.grpo.tasks_per_step == 32 and config.grpo.agents == ["write_query", "rewrite_query"]
    assert config.grpo.rollout_engine == "embedded" and config.grpo.epochs == 2
    assert [(x.kind, x.experiment) for x in config.trainer.loggers] == [("wandb", "AgentLightning")]


def test_a_verl_config_made_in_python_maps_as_the_file_does():
    """`train(TrainConfig(algorithm="verl", verl=...))` converts the dict as `load_config` does: the same ``grpo``
    section, model and loggers; a GRPO setting beside the verl dict is kept, one the dict sets too is refused."""
    import msgspec
    import yaml

    from lightrail.algorithms.settings import GRPOSection
    from lightrail.trainer.config import TrainConfig, verl_as_grpo

    made = msgspec.convert(yaml.safe_load(VERL_CONFIG.read_text()), TrainConfig)  # as made in Python: not converted
    assert made.algorithm == "verl"
    assert msgspec.to_builtins(verl_as_grpo(made)) == msgspec.to_builtins(load_config(VERL_CONFIG))
    kept = verl_as_grpo(msgspec.structs.replace(made, grpo=GRPOSection(credit="identical")))
    assert kept.grpo.credit == "identical" and kept.grpo.tasks_per_step == 32
    with pytest.raises(ConfigError, match="grpo: n_samples set by the verl section already"):
        verl_as_grpo(msgspec.structs.replace(made, grpo=GRPOSection(n_samples=2)))


def test_the_docs_show_the_table_the_code_uses():
    docs = (ROOT / "docs" / "algorithms.md").read_text()
    assert markdown_table() in docs


@needs_langgraph
@pytest.mark.timeout(1500)  # 13 minutes on 2 busy cores (a training run beside it); far less on a quiet machine
async def test_the_seed_walkthrough_config_trains_with_a_small_model(tmp_path, monkeypatch):
    """The shipped walkthrough (the seed dict) through `train`: the tiny model, 4 tasks x 2 samples a step, one epoch."""
    monkeypatch.chdir(ROOT)
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        "name=spider",  # the seed's experiment_name: the same name twice is no conflict
        "verl.actor_rollout_ref.model.path=tiny",
        "verl.data.train_batch_size=4",
        "verl.actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "verl.actor_rollout_ref.rollout.n=2",
        "verl.data.max_response_length=16",
        "verl.actor_rollout_ref.actor.optim.lr=1.0e-3",
        "verl.trainer.total_epochs=1",
        "verl.trainer.logger=[console]",
        "data_args={seed: 0, n_train: 8, n_val: 2}",  # splits cached by other tests: no queries on a busy machine
        "trainer.n_runners=1",
        "trainer.concurrency=4",
    ]
    config = load_config(VERL_CONFIG, overrides)
    result = await asyncio.to_thread(train, config)
    assert result.report["steps"] == 2  # total_epochs 1: 8 tasks // 4 per step
    assert result.report["val_before"] is not None  # val_before_train
    with sqlite3.connect(result.store) as db:
        modes = dict(db.execute("SELECT mode, count(*) FROM rollouts GROUP BY mode").fetchall())
    assert modes == {"train": 16, "val": 4}  # 2 steps x 4 tasks x 2 samples; 2 held-out tasks before and after
