"""Small random models that speak real model families' chat formats (test support, not a test module).

Each family gets a locally trained byte-level BPE tokenizer holding that family's own special tokens, with the
special flags the published tokenizer gives them (Mistral's ``[TOOL_CALLS]`` and Llama's ``<|python_tag|>`` are
special and vanish from decoded text; Qwen's ``<tool_call>`` and ``<think>`` are not), the family's published chat
template (``templates/``, provenance in ``templates/PROVENANCE.md``) and a ~0.3 M-parameter random Llama
(head size 64: vLLM's CPU attention supports no smaller). Weights are
random: what the tests check is the format around them (rendering, forced calls, parsing), not answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    tool_format: str
    reasoning: str | None
    bos: str | None
    eos: str
    pad: str
    special: tuple[str, ...]
    """Added tokens the published tokenizer marks special (dropped when decoding)."""
    plain: tuple[str, ...] = ()
    """Added tokens that are not special (they survive decoding)."""
    tool_result_marker: str = ""
    """What a rendered tool result looks like in this family's prompt."""


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "qwen2.5", "qwen2.5.jinja", "hermes", None, None, "<|im_end|>", "<|endoftext|>",
            ("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
            ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
            "<tool_response>",
        ),
        Family(
            "qwen3", "qwen3.jinja", "hermes", "think", None, "<|im_end|>", "<|endoftext|>",
            ("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
            ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
            "<tool_response>",
        ),
        Family(
            "llama3.2", "llama3.2.jinja", "llama3_json", None, "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
            ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
             "<|python_tag|>", "<|finetune_right_pad_id|>"),
            (),
            "<|start_header_id|>ipython<|end_header_id|>",
        ),
        Family(
            "mistral-v0.3", "mistral-v0.3.jinja", "mistral", None, "<s>", "</s>", "<unk>",
            ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
             "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
            (),
            "[TOOL_RESULTS]",
        ),
        Family(
            "llama3.2-pythonic", "llama3.2-pythonic.jinja", "pythonic", None, "<|begin_of_text|>", "<|eot_id|>",
            "<|finetune_right_pad_id|>",
            ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
             "<|python_tag|>", "<|finetune_right_pad_id|>"),
            (),
            '{"output": ',
        ),
    )
}  # fmt: skip

_CORPUS = [
    'get_weather(city="Paris") {"name": "get_weather", "parameters": {"city": "Paris"}} the weather in Paris is 21',
    '{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {}}}',
    "You are a helpful assistant. What is 2 + 3? The answer is 5. Cutting Knowledge Date: December 2023",
    'Respond in the format {"name": function name, "arguments": <args-json-object>} [func_name1(a=1, b=2)]',
    "properties required integer string object type true false null 0123456789 () [] {} , : ; = \" ' \n",
]


def build_family_model(family: Family, out: Path, seed: int = 0) -> Path:
    """A random ~0.3 M-parameter Llama with ``family``'s tokenizer and chat template, saved to ``out``."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=list(family.special), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.plain])
    kwargs = {"bos_token": family.bos} if family.bos else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=family.eos, pad_token=family.pad, clean_up_tokenization_spaces=False, **kwargs
    )
    fast.chat_template = (TEMPLATES / family.template).read_text()
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=256, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def overfit(
    path: Path, messages: list[dict], tools: list[dict] | None, reply: str, *, loss_below: float = 5e-4
) -> None:
    """Train the model at ``path`` in place until it answers ``messages`` (offering ``tools``) with ``reply`` then
    EOS, as its own family writes it: a few seconds of AdamW on one row, rendered by the family's template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightrail.engine.chat import ChatFormat

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = tok(ChatFormat(tok).render(messages, tools), add_special_tokens=False).input_ids
    target = tok(reply, add_special_tokens=False).input_ids + [tok.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = torch.tensor([[-100] * len(prompt) + target])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # 1e-2 oscillates at this width
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(1200):  # to ~5e-4 nats a token: the reply is then the greedy answer, token for token
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < loss_below:
                break
    model.save_pretrained(path)
