"""`lightrail train CONFIG.yaml`: configs are checked field by field before anything starts, and a small config
trains end to end through real runner processes, store, gateway and engine."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightrail.cli import main
from lightrail.trainer.config import ConfigError, load_config, train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
name: calc
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
data_args: {n_train: 8, n_val: 4, seed: 1}
model: tiny
trainer: {n_runners: 1, concurrency: 4}
grpo:
  steps: 1
  tasks_per_step: 2
  n_samples: 2
  val_every: 0
  credit: discounted
  credit_args: {gamma: 0.5}
  tool_rewards: {success: 0.2, error: -0.2}
  sampling: {temperature: 1.0, max_tokens: 8}
  val_sampling: {temperature: 0.0, max_tokens: 8}
  config: {lr: 1.0e-3}
"""


def _write(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_config_maps_every_section_onto_grpo(tmp_path):
    # (agents_pattern only here: the calculator's calls name no agent, so a run selecting by name trains nothing,
    # which the run guard stops at its first step)
    config = load_config(
        _write(tmp_path, CONFIG),
        [f"out_dir={tmp_path / 'run'}", "grpo.config.kl_coef=0.05", "grpo.agents_pattern='.*'"],
    )
    assert config.run_dir == tmp_path / "run" and config.store_location == str(tmp_path / "run" / "store.db")
    from lightrail.algorithms.grpo import GRPO
    from lightrail.trainer.config import _grpo_kwargs

    grpo = GRPO("m", **_grpo_kwargs(config))  # the section's names and mappings become GRPO's objects
    assert grpo.credit.gamma == 0.5
    assert (grpo.tool_rewards.success, grpo.tool_rewards.error) == (0.2, -0.2)
    assert grpo.agents("anything") and not grpo.agents(None)
    assert (grpo.config.lr, grpo.config.kl_coef) == (1e-3, 0.05)
    assert grpo.out_dir == tmp_path / "run" and grpo.settings.n_samples == 2


def test_scale_out_sections_reach_the_trainer_and_the_gateway(tmp_path):
    """Runners elsewhere: no local runner processes, Ray actors, a reachable store server, an advertised gateway."""
    overrides = [
        "trainer.n_runners=0",
        "trainer.runners.ray={address: auto, n: 8, k: 4, resources: {num_cpus: 1}}",
        "trainer.store_host=0.0.0.0",
        "trainer.store_port=4747",
        "store=postgresql://lightrail@db-host/runs",
        "gateway={host: 0.0.0.0, port: 8900, advertise_url: 'http://trainer-host:8900'}",
    ]
    config = load_config(_write(tmp_path, CONFIG), overrides)
    assert config.trainer.n_runners == 0 and config.trainer.runners.ray.n == 8
    assert config.trainer.runners.ray.resources == {"num_cpus": 1}
    assert (config.trainer.store_host, config.trainer.store_port) == ("0.0.0.0", 4747)
    assert config.store_location == "postgresql://lightrail@db-host/runs"
    from lightrail.trainer.config import _grpo_kwargs

    gateway = _grpo_kwargs(config)["gateway"]
    assert (gateway.host, gateway.port, gateway.advertise_url) == ("0.0.0.0", 8900, "http://trainer-host:8900")
    with pytest.raises(ConfigError, match="gateway"):  # it has a section of its own, not a grpo setting
        load_config(_write(tmp_path, CONFIG), ["grpo.gateway={host: 0.0.0.0}"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.steps=many", "grpo.steps"),
        ("trainer.concurrency=[1]", "trainer.concurrency"),
        ("trainer.gpus=2", "gpus"),
        ("grpo.epoch=3", "grpo: unknown setting(s) ['epoch']; did you mean 'epochs'?"),
        ("trainer.concurency=2", "trainer: unknown setting(s) ['concurency']; did you mean 'concurrency'?"),
        ("grpo.sft_steps=2", "grpo: unknown setting(s) ['sft_steps']; did you mean 'steps'?"),
        ("grpo.epochs=3", "grpo: give steps or epochs, not both"),
        ("grpo.config.lr=fast", "grpo.config.lr"),
        ("grpo.credit=magic", "grpo.credit: expected one of ['identical', 'per_turn', 'discounted'], got 'magic'"),
        ("grpo.tool_rewards=7", "grpo.tool_rewards"),
        ("grpo.config.kl_coeff=0.05", "grpo.config: unknown setting(s) ['kl_coeff']; did you mean 'kl_coef'?"),
        ("grpo.config.lora={rank: 8}", "grpo.config.lora: unknown setting(s) ['rank']"),
        ("grpo.config.lora={r: many}", "grpo.config.lora.r"),
        ("grpo.tool_rewards={success: big}", "grpo.tool_rewards.success"),
        ("grpo.tool_rewards={is_error: x}", "grpo.tool_rewards: unknown setting(s) ['is_error']"),
        ("steps", "expected dotted.path=value"),
        ("gateway.advertise_ur=http://h:1/v1", "advertise_ur"),
        ("gateway.advertise_url=trainer-host:8900", "gateway: advertise_url must be an http(s) URL"),
        ("gateway.port=70000", "gateway port must be"),
        ("trainer.runners.slurm={n: 2}", "slurm"),
        ("trainer.runners.ray={n: 0}", "ray: n and k must be >= 1"),
        ("trainer.runners.ray={adress: auto}", "adress"),
        ("grpo.vllm={pyhton: x}", "grpo.vllm: unknown vllm option(s) ['pyhton']"),
        ("grpo.rollout_engine=sglang", "rollout_engine"),
        ("grpo.policies={w: [a], r: [b, a]}", "grpo.policies: agent 'a' is in both 'w' and 'r'"),
        ("grpo.policies={w: []}", "grpo.policies.w: expected a non-empty list of agent names"),
        ("grpo.policies={'a b': [x]}", "grpo.policies: 'a b' is not a policy name"),
        ("grpo={policies: {w: [a]}, agents: [b]}", "give agents or policies, not both"),
        (
            "grpo.config.temperature=0.5",
            "grpo.config.temperature: the update divides logits by the sampling "
            "temperature (sampling.temperature, here 1.0), not by 0.5",
        ),
        (
            "grpo={async: true, is_cap: 3.0}",
            "grpo.is_cap: no longer a setting: the cap is the update's grpo.config.is_cap",
        ),
        ("grpo.max_staleness=2", "grpo.max_staleness: no longer a setting: it is grpo.async.max_staleness"),
        ("grpo.mode=async", "grpo.mode: no longer a setting: asynchronous GRPO is the grpo.async section"),
        ("grpo={async: {ahead: 0}}", "grpo.async.ahead must be >= 1"),
        ("grpo={async: true, filter_groups: true}", "grpo.async: not with filter_groups"),
        (
            "grpo.max_sample_rounds=4",
            "grpo.max_sample_rounds: no longer a setting: it is grpo.filter_groups.max_rounds",
        ),
        ("grpo={filter_groups: {max_rounds: 0}}", "grpo.filter_groups.max_rounds must be >= 1, got 0"),
        ("grpo={filter_groups: {rounds: 2}}", "grpo.filter_groups: unknown setting(s) ['rounds']"),
        (
            "grpo.config.gamma=0.9",
            "grpo.config.gamma: no longer an update setting: PPO's critic settings are grpo.config.critic",
        ),
        ("grpo.config.critic={gamma: 0.9}", "grpo.config.critic: PPO's critic settings, for advantage gae only"),
        ("grpo={advantage: gae, config: {critic: {lam: 2.0}}}", "grpo.config.critic: gamma and lam must be in [0, 1]"),
        ("grpo={advantage: gae, config: {critic: {gama: 0.9}}}", "grpo.config.critic: unknown setting(s) ['gama']"),
        ("sft.config.critic={gamma: 0.9}", "sft.config.critic: PPO's critic settings (grpo with advantage gae)"),
        ("grpo={async: true, config: {mini_batches: 2}}", "grpo.config.mini_batches: async weighs stale tokens"),
        (
            "grpo.config.max_staleness=2",
            "grpo.config.max_staleness: no longer an update setting: GRPO's grpo.async.max_staleness",
        ),
        (
            "algorithm=gpro",
            "algorithm: expected one of ['grpo', 'sft', 'apo', 'verl'] or the chain ['sft', 'grpo'], "
            "got 'gpro'; did you mean 'grpo'?",
        ),
        ("algorithm=[grpo, apo]", "algorithm: the one chain is ['sft', 'grpo'] (GRPO from SFT's weights)"),
        ("algorithm=[grpo]", "algorithm: the one chain is ['sft', 'grpo'] (GRPO from SFT's weights), got ['grpo']"),
    ],
)
def test_bad_config_is_rejected_with_the_field_path(tmp_path, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(_write(tmp_path, CONFIG), [override])


def test_several_policies_on_vllm_are_refused_without_lora_when_the_config_is_read(tmp_path):
    policies = ["grpo.agents_pattern=null", "grpo.policies={w: [a], r: [b]}", "grpo.rollout_engine=vllm"]
    refusal = (
        "grpo.policies: with rollout_engine vllm each policy is a LoRA adapter on one vLLM server: set grpo.config.lora"
    )
    for config in ("grpo.config.lr=1.0e-3", "grpo.config={}"):
        with pytest.raises(ConfigError, match=re.escape(refusal)):
            load_config(_write(tmp_path, CONFIG), [*policies, config])
    config = load_config(_write(tmp_path, CONFIG), [*policies, "grpo.config.lora={r: 4}"])
    assert config.grpo.policies == {"w": ["a"], "r": ["b"]}


def test_bad_references_and_files_are_named(tmp_path, capsys):
    config = load_config(_write(tmp_path, CONFIG), ["data=examples.calculator.data:nope"])
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        train(config)
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_train_runs_a_small_config_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # references resolve from the current directory, as with `python -m`
    path = _write(tmp_path, CONFIG)
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "held-out success:" in out and "checkpoint:" in out
    report = load_config(path, [f"out_dir={tmp_path / 'run'}"])
    with sqlite3.connect(report.store_location) as db:
        modes = dict(db.execute("SELECT mode, count(*) FROM rollouts GROUP BY mode").fetchall())
    assert modes == {"train": 4, "val": 8}  # 2 tasks x 2 samples; 4 val tasks before and after
    assert (tmp_path / "run" / "reward_curve.png").exists()


def test_ctrl_c_stops_a_training_run_and_its_processes(tmp_path):
    """SIGINT reaches the trainer (not only the gateway it serves): the run ends at once and leaves no runner or
    store server behind."""
    import signal
    import subprocess
    import sys
    import time

    path = _write(tmp_path, CONFIG)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "lightrail.cli", "train", str(path), "--out", str(run), "--steps", "1000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists():  # validation done: training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children  # the store server and the runner processes
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{pid}") for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pid for pid in children if os.path.exists(f"/proc/{pid}")] == []
    finally:
        proc.kill()


@pytest.mark.parametrize("path", sorted(ROOT.glob("examples/*/config.gpu.yaml")), ids=lambda p: p.parent.name)
def test_gpu_configs_are_valid_and_say_what_they_run(path):
    """The GPU configs cannot run here (no GPU), so every field is checked: a stale key would only show on a GPU box."""
    config = load_config(path)
    from lightrail.trainer.config import _grpo_kwargs

    kwargs = _grpo_kwargs(config)
    assert kwargs["section"].rollout_engine == "vllm" and kwargs["section"].vllm["python"] == ".venv-vllm/bin/python"
    settings = kwargs["config"]
    assert (settings.device, settings.dtype, settings.ranks) == ("cuda", "bfloat16", 3)
    assert config.model.startswith("models/") and config.trainer.otel
    variant = "grpo.config.lora=null" if settings.lora else "grpo.config.lora={r: 32, alpha: 64}"
    assert variant in path.read_text().replace('"', "")  # each file documents the other variant with this override
    other = _grpo_kwargs(load_config(path, [variant]))["config"]
    assert (other.lora is None) != (settings.lora is None)
    # vLLM parses the agents' tool calls in the model family's own format (Llama 3.2: bare JSON; Qwen2.5: Hermes)
    family = {"models/Llama-3.2-3B-Instruct": "llama3_json", "models/Qwen2.5-Coder-1.5B-Instruct": "hermes"}
    assert kwargs["section"].engine_options["tool_format"] == family[config.model]


def test_the_gpu_configs_cover_the_three_agents_and_models():
    models = {p.parent.name: load_config(p).model for p in ROOT.glob("examples/*/config.gpu.yaml")}
    assert models == {
        "calc_agent": "models/Llama-3.2-3B-Instruct",
        "rag_agent": "models/Llama-3.2-3B-Instruct",
        "sql_agent": "models/Qwen2.5-Coder-1.5B-Instruct",
    }


@pytest.mark.parametrize("path", sorted(ROOT.glob("examples/*/config.smollm2.yaml")), ids=lambda p: p.parent.name)
def test_pretrained_model_recipes_are_valid_grpo_alone_with_no_teacher(path):
    """The SmolLM2 recipes run 25-45 minutes: every key is checked here. Each is what `bench/real_models.py
    --showcases` claims: SmolLM2 with LoRA, GRPO alone (no SFT stage, so no teacher), held-out tasks that do not
    move with the seed (``data_args.seed`` fixed), and a recipe the bench knows."""
    from bench._smollm2_showcases import RECIPES
    from lightrail.algorithms.settings import SFTSection
    from lightrail.trainer.config import _grpo_kwargs

    config = load_config(path)

    assert config.model == "smollm2" and config.algorithm == "grpo" and config.sft == SFTSection()  # none written
    assert _grpo_kwargs(config)["config"].lora is not None
    assert "seed" in config.data_args and load_config(path, ["seed=7"]).data_args == config.data_args
    assert RECIPES[path.parent.name] == str(path.relative_to(ROOT))


def test_a_model_whose_tool_format_is_unknown_is_a_one_line_error_naming_the_formats(tmp_path):
    """A chat template that lists tools in a markup lightrail cannot read would leave the agent with text where it
    expects tool calls: `lightrail train` refuses it at start, naming the formats a config can choose from."""
    import shutil

    from lightrail.engine.models import prepare_model

    model = tmp_path / "model"
    shutil.copytree(prepare_model("tiny"), model)
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<fn>{{ tools }}</fn>{% endif %}"
    (model / "chat_template.jinja").write_text(template)
    cmd = [sys.executable, "-m", "lightrail", "train", str(ROOT / "examples" / "calc_agent" / "config.yaml")]
    cmd += ["--set", f"model={model}", "--set", "algorithm=grpo", "--set", f"out_dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "hermes, llama3_json, mistral, pythonic" in lines[0], done.stderr
    assert "grpo.engine_options" in lines[0]


def test_checking_a_config_with_an_update_section_loads_no_torch(tmp_path):
    """A config is checked before anything heavy loads: its ``grpo.config`` section (`UpdateConfig`, torch-free in
    `lightrail.model.update_config`) included."""
    import subprocess
    import sys

    path = _write(tmp_path, CONFIG.replace("config: {lr: 1.0e-3}", "config: {lr: 1.0e-3, policy_loss: gspo}"))
    probe = (
        "import sys; from lightrail.trainer.config import load_config; "
        f"c = load_config({str(path)!r}); print(c.grpo.config, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split()[-1] == "False", done.stdout
