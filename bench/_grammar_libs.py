"""Which grammar library for the engine's constrained decoding: xgrammar vs llguidance vs outlines-core, measured.

    .venv/bin/python bench/_grammar_libs.py [--libs xgrammar,llguidance,outlines_core] [--no-engine]

For each library that is importable:

* ``tokenizer_s``: one-off cost of wrapping an HF tokenizer (tiny: 613 tokens, SmolLM2-135M: 49152 tokens);
* ``compile_ms``: compiling each schema of `SCHEMAS` (cold, per tokenizer);
* coverage: each schema compiles, accepts a valid instance (fed token by token as the HF tokenizer encodes
  ``json.dumps(instance)``) and rejects an invalid one (a violation of the constraint the schema is about);
* per-token mask cost for 8 rows in lockstep on the "agent" schema: computing the 8 token bitmasks (batched
  where the library can), applying them to a [8, vocab] float logits tensor, and advancing the 8 matchers;
* install size: du of the package directories in site-packages (the library plus the deps it pulls in).

Then, unless ``--no-engine``, ``constrained_overhead``: the embedded engine on SmolLM2-135M, 8 chat requests at
once, 48 new tokens each (temperature 1, schemas that cannot close before that, so every row runs to
``max_tokens``), unconstrained vs ``response_format=json_schema``; tokens/s of both and their ratio (uses
whichever library `lightrail.engine.constraints` is built on).

On a shared 2-core box set ``LIGHTRAIL_TORCH_THREADS=1``. Progress goes to stderr; the table to stdout; the last
stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import importlib
import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import log  # noqa: E402

SEP = {"separators": (", ", ": ")}  # json.dumps' default: what chat templates (tojson) show the model


# -- schemas an agent framework produces ---------------------------------------------------------------------------


class Priority(enum.StrEnum):
    low = "low"
    high = "high"


class Address(BaseModel):
    street: str
    city: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    address: Address
    tags: list[str]


class Task(BaseModel):
    title: str = Field(min_length=1, max_length=40)
    priority: Priority
    due: str | None = None
    subtasks: list[str] = Field(default_factory=list, max_length=3)


class Plan(BaseModel):
    """The schema of the per-token benchmark: nested objects, an enum, optional fields, arrays, $defs/$ref."""

    goal: str
    steps: list[Task]
    owner: Person
    done: bool


class Team(BaseModel):
    people: list[Person]


class Tree(BaseModel):
    label: str
    children: list[Tree] = Field(default_factory=list)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")


def _strict(schema: dict) -> dict:
    """OpenAI strict mode: additionalProperties false and every property required, on every object."""
    schema = json.loads(json.dumps(schema))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node["additionalProperties"] = False
                node["required"] = list(node["properties"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


ADDR = {"street": "1 Main St", "city": "Paris", "zip": None}
PERSON = {"name": "Ada", "age": 36, "address": ADDR, "tags": ["math", "code"]}
PLAN = {
    "goal": "ship it",
    "steps": [{"title": "write code", "priority": "high", "due": None, "subtasks": ["a", "b"]}],
    "owner": PERSON,
    "done": False,
}

# name -> (schema, valid instance, invalid instance: violates what the schema is about)
SCHEMAS: dict[str, tuple[dict, Any, Any]] = {
    "nested_refs": (Person.model_json_schema(), PERSON, {**PERSON, "address": {"city": "Paris"}}),
    "array_of_objects": (
        Team.model_json_schema(),
        {"people": [PERSON, PERSON]},
        {"people": [{"name": "Ada"}]},
    ),
    "enum": (Task.model_json_schema(), {"title": "t", "priority": "low"}, {"title": "t", "priority": "urgent"}),
    "optional_anyof_null": (
        Address.model_json_schema(),
        {"street": "s", "city": "c", "zip": None},
        {"street": "s", "city": "c", "zip": 75},
    ),
    "strict_additional_false": (_strict(Plan.model_json_schema()), PLAN, {**PLAN, "extra": 1}),
    "string_formats": (
        {
            "type": "object",
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "email": {"type": "string", "format": "email"},
                "id": {"type": "string", "format": "uuid"},
            },
            "required": ["when", "email", "id"],
        },
        {"when": "2024-05-01T10:00:00Z", "email": "a@b.co", "id": "123e4567-e89b-12d3-a456-426614174000"},
        {"when": "yesterday", "email": "a@b.co", "id": "123e4567-e89b-12d3-a456-426614174000"},
    ),
    "min_max": (
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 1, "maximum": 10},
                "s": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                "xs": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
            },
            "required": ["n", "s", "xs"],
        },
        {"n": 3, "s": "abc", "xs": [1.5]},
        {"n": 11, "s": "abc", "xs": [1.5]},
    ),
    "recursive_ref": (
        Tree.model_json_schema(),
        {"label": "root", "children": [{"label": "a", "children": []}]},
        {"label": "root", "children": [{"children": []}]},
    ),
    "discriminated_union": (
        Pet.model_json_schema(),
        {"pet": {"kind": "dog", "good": True}},
        {"pet": {"kind": "dog", "lives": 9}},
    ),
    "dict_additional_schema": (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"a": 1, "b": 2},
        {"a": "x"},
    ),
    "tool_params_empty": ({"type": "object", "properties": {}}, {}, []),
    "malformed": ({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, {"a": 1}, None),
}
BENCH_SCHEMA = "strict_additional_false"

# -- one adapter per library ---------------------------------------------------------------------------------------


class Lib:
    """compile / matcher / fill (batched) / accept / is_done for one library."""

    name = ""
    dists: tuple[str, ...] = ()

    def tokenizer(self, hf: Any, vocab: int) -> Any:
        raise NotImplementedError

    def compile(self, tok: Any, schema: dict) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def accepting(self, matcher: Any) -> bool:
        raise NotImplementedError


class XGrammar(Lib):
    name = "xgrammar"
    dists = ("xgrammar", "apache-tvm-ffi", "triton")

    def __init__(self):
        import xgrammar as xgr

        self.xgr = xgr
        self.batch = xgr.BatchGrammarMatcher()

    def tokenizer(self, hf, vocab):
        info = self.xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
        return self.xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, tok, schema):
        return tok.compile_json_schema(json.dumps(schema), any_whitespace=False, **SEP)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers, bitmask):
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, m, token):
        return m.accept_token(token)

    def accepting(self, m):
        return m.is_completed() or m.accept_token(m.stop_token_ids[0])


class LLGuidance(Lib):
    name = "llguidance"
    dists = ("llguidance",)

    def __init__(self):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.executor = llguidance.LLExecutor(num_threads=2)

    def tokenizer(self, hf, vocab):
        return self.llg.hf.from_tokenizer(hf, n_vocab=vocab)

    def compile(self, tok, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        error = self.llg.LLMatcher.validate_grammar(grammar, tok)
        if error and not error.startswith("WARNING"):
            raise ValueError(error)
        return tok, grammar

    def matcher(self, compiled):
        m = self.llg.LLMatcher(*compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, matchers, bitmask):
        self.llg.torch.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, m, token):
        return m.consume_token(token)

    def accepting(self, m):
        return m.is_accepting()


class OutlinesCore(Lib):
    name = "outlines_core"
    dists = ("outlines-core",)

    def __init__(self):
        import outlines_core

        self.oc = outlines_core

    def tokenizer(self, hf, vocab):
        # Byte-level BPE: map each token's unicode form back to bytes (GPT-2's byte <-> unicode table).
        dec = {v: k for k, v in _bytes_to_unicode().items()}
        special = set(hf.all_special_ids)
        words: dict[bytes, list[int]] = {}
        for token, i in hf.get_vocab().items():
            if i in special or i >= vocab:
                continue
            data = bytes(dec[c] for c in token) if all(c in dec for c in token) else token.encode()
            words.setdefault(data, []).append(i)
        return self.oc.Vocabulary(hf.eos_token_id, words)

    def compile(self, tok, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), r"[ ]?")
        return self.oc.Index(regex, tok)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, matchers, bitmask):
        for i, m in enumerate(matchers):
            row = bitmask[i]
            m.write_mask_into(row.data_ptr(), row.numel(), 4)

    def accept(self, m, token):
        try:
            m.advance(token, return_tokens=False)
            return True
        except Exception:
            return False

    def accepting(self, m):
        return m.is_finished()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode character table (byte-level BPE vocabularies are written in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


LIBS = {"xgrammar": XGrammar, "llguidance": LLGuidance, "outlines_core": OutlinesCore}

_BYTE_BITS = torch.tensor([[0.0 if (b >> j) & 1 else float("-inf") for j in range(8)] for b in range(256)])


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Plain-torch bitmask application (no torch.compile): bit j of int32 word i allows token 32*i + j.

    One embedding lookup of each mask byte in a [256, 8] table of 0 / -inf, added to the logits: 3-6x faster on
    CPU than unpacking the bits with shifts and ``masked_fill`` (and than xgrammar's own CPU kernel)."""
    rows = bitmask.shape[0]
    bias = torch.nn.functional.embedding(bitmask.view(torch.uint8).long(), _BYTE_BITS).view(rows, -1)
    logits.add_(bias[:, : logits.shape[1]])


# -- measurements --------------------------------------------------------------------------------------------------


def install_mb(dists: tuple[str, ...]) -> float:
    total = 0
    for dist in dists:
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            path = Path(f.locate())
            if path.is_file():
                total += path.stat().st_size
    return round(total / 1e6, 1)


def feed(lib: Lib, m: Any, ids: list[int]) -> bool:
    return all(lib.accept(m, t) for t in ids) and lib.accepting(m)


def coverage(lib: Lib, tok: Any, hf: Any) -> dict[str, dict]:
    out = {}
    for name, (schema, good, bad) in SCHEMAS.items():
        row: dict[str, Any] = {}
        start = time.perf_counter()
        try:
            compiled = lib.compile(tok, schema)
            lib.matcher(compiled)
        except Exception as exc:
            row.update(compiles=False, error=str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__)
            out[name] = row
            continue
        row["compiles"] = True
        row["compile_ms"] = round((time.perf_counter() - start) * 1e3, 1)
        row["accepts_valid"] = feed(lib, lib.matcher(compiled), hf(json.dumps(good))["input_ids"])
        if bad is not None:
            row["rejects_invalid"] = not feed(lib, lib.matcher(compiled), hf(json.dumps(bad))["input_ids"])
        out[name] = row
    return out


def mask_cost(lib: Lib, tok: Any, hf: Any, vocab: int, rows: int = 8) -> dict[str, float]:
    schema, instance, _ = SCHEMAS[BENCH_SCHEMA]
    compiled = lib.compile(tok, schema)
    ids = hf(json.dumps(instance))["input_ids"]
    bitmask = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)
    logits = torch.randn(rows, vocab)
    fills, applies, advances = [], [], []
    for _rep in range(3):
        matchers = [lib.matcher(compiled) for _ in range(rows)]
        for token in ids:
            t0 = time.perf_counter()
            lib.fill(matchers, bitmask)
            t1 = time.perf_counter()
            work = logits.clone()
            t2 = time.perf_counter()
            apply_bitmask(work, bitmask)
            t3 = time.perf_counter()
            for m in matchers:
                lib.accept(m, token)
            t4 = time.perf_counter()
            assert work[0, token] != float("-inf"), "the instance's token was masked out"
            fills.append(t1 - t0)
            applies.append(t3 - t2)
            advances.append(t4 - t3)
    return {
        "steps": len(ids),
        "fill_us": round(statistics.mean(fills) * 1e6),
        "fill_p99_us": round(sorted(fills)[int(0.99 * len(fills))] * 1e6),
        "apply_us": round(statistics.mean(applies) * 1e6),
        "advance_us": round(statistics.mean(advances) * 1e6),
        "total_us": round((statistics.mean(fills) + statistics.mean(applies) + statistics.mean(advances)) * 1e6),
    }


def measure_lib(name: str, tokenizers: dict[str, Any]) -> dict | None:
    try:
        t0 = time.perf_counter()
        lib = LIBS[name]()
        import_s = time.perf_counter() - t0
    except ImportError as exc:
        log(f"{name}: not installed ({exc})")
        return None
    result: dict[str, Any] = {
        "version": importlib.metadata.version(lib.dists[0]),
        "import_s": round(import_s, 2),
        "install_mb": install_mb(lib.dists),
        "deps": list(lib.dists[1:]),
    }
    for tname, (hf, vocab) in tokenizers.items():
        t0 = time.perf_counter()
        tok = lib.tokenizer(hf, vocab)
        entry: dict[str, Any] = {"tokenizer_s": round(time.perf_counter() - t0, 2)}
        entry["coverage"] = coverage(lib, tok, hf)
        entry["mask"] = mask_cost(lib, tok, hf, vocab)
        log(f"{name} / {tname}: {entry['mask']}")
        result[tname] = entry
    return result


def print_table(results: dict[str, dict], tokenizers: list[str]) -> None:
    names = list(results)
    print(f"{'':34}" + "".join(f"{n:>22}" for n in names))
    for key in ("version", "install_mb", "import_s"):
        print(f"{key:34}" + "".join(f"{str(results[n][key]):>22}" for n in names))
    for t in tokenizers:
        print(f"-- {t} tokenizer")
        print(f"{'  tokenizer_s':34}" + "".join(f"{results[n][t]['tokenizer_s']:>22}" for n in names))
        for k in ("fill_us", "fill_p99_us", "apply_us", "advance_us", "total_us"):
            print(f"{'  8 rows ' + k:34}" + "".join(f"{results[n][t]['mask'][k]:>22}" for n in names))
        for schema in SCHEMAS:
            cells = []
            for n in names:
                c = results[n][t]["coverage"][schema]
                if not c["compiles"]:
                    cells.append("FAIL")
                else:
                    ok = "ok" if c["accepts_valid"] else "rejects-valid"
                    enf = {True: "+enf", False: "+LAX", None: ""}[c.get("rejects_invalid")]
                    cells.append(f"{ok}{enf} {c['compile_ms']:.0f}ms")
            print(f"{'  ' + schema:34}" + "".join(f"{c:>22}" for c in cells))


# -- engine overhead -----------------------------------------------------------------------------------------------

OVERHEAD_PROMPTS = [
    "List the cities you would visit on a trip around Europe, with reasons.",
    "Describe the steps to bake bread.",
    "Write a packing list for a week of hiking.",
    "Name the planets and one fact about each.",
    "Plan a week of dinners.",
    "List the tools a carpenter needs.",
    "Describe a day in the life of a farmer.",
    "Write down ideas for a birthday party.",
]
# minItems keeps the array open for the whole run: every constrained row reaches max_tokens, like the free ones.
OVERHEAD_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "items": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20}, "kind": {"enum": ["a", "b", "c"]}},
                "required": ["name", "kind"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "items"],
    "additionalProperties": False,
}


async def engine_overhead(tokens: int, repeats: int, model: str = "smollm2") -> dict:
    from lightrail.engine import Engine
    from lightrail.engine.models import prepare_model
    from lightrail.types import ChatRequest, SamplingParams

    engine = Engine.from_pretrained(prepare_model(model), device="cpu", gather_window_s=0.05)

    def reqs(constrained: bool, seed: int) -> list[ChatRequest]:
        fmt = {"type": "json_schema", "json_schema": {"name": "list", "schema": OVERHEAD_SCHEMA}}
        return [
            ChatRequest(
                model="m",
                messages=[{"role": "user", "content": p}],
                response_format=fmt if constrained else None,
                sampling=SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed + i),
            )
            for i, p in enumerate(OVERHEAD_PROMPTS)
        ]

    async def run(constrained: bool, seed: int) -> tuple[float, int, list]:
        start = time.perf_counter()
        gens = await asyncio.gather(*(engine.chat(r) for r in reqs(constrained, seed)))
        elapsed = time.perf_counter() - start
        return elapsed, sum(len(g.choices[0].token_ids) for g in gens), gens

    try:
        await run(True, 0)  # warm-up: compiles the grammar (cached afterwards), warms torch
        await run(False, 0)
        free, cons = [], []
        for r in range(repeats):  # interleaved, so drift on a shared box hits both arms
            e, n, gens = await run(False, 100 + r)
            free.append((e, n))
            e, n, gens = await run(True, 100 + r)
            cons.append((e, n))
            finishes = [g.choices[0].finish_reason for g in gens]
            log(f"  repeat {r}: free {free[-1]}, constrained {cons[-1]} finish={finishes}")
        log("  constrained sample: " + gens[0].choices[0].text[:160])
    finally:
        await engine.close()
    free_tps = sum(n for _, n in free) / sum(e for e, _ in free)
    cons_tps = sum(n for _, n in cons) / sum(e for e, _ in cons)
    return {
        "batch": len(OVERHEAD_PROMPTS),
        "max_tokens": tokens,
        "tokens_free": sum(n for _, n in free),
        "tokens_constrained": sum(n for _, n in cons),
        "tokens_per_s_free": round(free_tps, 1),
        "tokens_per_s_json_schema": round(cons_tps, 1),
        "ratio": round(cons_tps / free_tps, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", default=",".join(LIBS))
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--no-libs", action="store_true")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    from lightrail.engine.models import prepare_model

    out: dict[str, Any] = {"libs": {}}
    if not args.no_libs:
        tokenizers = {}
        for name in ("tiny", "smollm2"):
            path = prepare_model(name)
            hf = AutoTokenizer.from_pretrained(path)
            tokenizers[name] = (hf, AutoConfig.from_pretrained(path).vocab_size)
        for name in args.libs.split(","):
            res = measure_lib(name, tokenizers)
            if res is not None:
                out["libs"][name] = res
        if out["libs"]:
            print_table(out["libs"], list(tokenizers))
    if not args.no_engine:
        log("engine: constrained_overhead on smollm2 ...")
        out["constrained_overhead"] = asyncio.run(engine_overhead(args.tokens, args.repeats))
        print("constrained_overhead:", out["constrained_overhead"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
