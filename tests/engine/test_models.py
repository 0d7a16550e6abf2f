"""The offline model registry and the tiny-model builder."""

from __future__ import annotations

import argparse
import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightrail.engine import build_tiny_model, list_models, prepare_model
from lightrail.engine.cli import add_parser
from lightrail.engine.models import MARKER


def test_tiny_model_loads_and_has_the_right_shape(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert 0.8e6 < sum(p.numel() for p in model.parameters()) < 1.5e6
    assert model.config.max_position_embeddings == 512 and model.config.tie_word_embeddings
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert model.config.vocab_size == len(tok)
    assert tok.tokenize("x 2024") == ["x", "Ġ", "2", "0", "2", "4"]  # digits one by one
    ids = tok("<tool_call>\n</tool_call>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\n</tool_call>"  # markup survives decoding


def test_build_is_deterministic(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", size="tiny", seed=0)
    for name in ("tokenizer.json", "model.safetensors"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()


def test_registry_prepares_once_and_repairs_interrupted_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTRAIL_CACHE", str(tmp_path))
    info = {m.name: m for m in list_models()}
    assert set(info) == {"tiny", "small", "smollm2"}
    assert not info["tiny"].prepared and info["tiny"].path == tmp_path / "models" / "tiny"
    path = prepare_model("tiny")
    assert path == info["tiny"].path and (path / MARKER).is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_model("tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # cached, not rebuilt
    assert {m.name: m.prepared for m in list_models()}["tiny"]
    (path / MARKER).unlink()  # as if the process died before finishing the save
    prepare_model("tiny")
    assert (path / MARKER).is_file() and (path / "model.safetensors").stat().st_mtime_ns != stamp
    assert prepare_model(str(path)) == path  # a local directory is accepted as is
    with pytest.raises(FileNotFoundError):
        prepare_model("no-such-model")


def test_build_never_deletes_a_directory_it_does_not_own(tmp_path):
    precious = tmp_path / "mine" / "notes.txt"
    precious.parent.mkdir()
    precious.write_text("keep me")
    with pytest.raises(FileExistsError):
        build_tiny_model(precious.parent)
    assert precious.read_text() == "keep me"
    assert not (tmp_path / ".mine.partial").exists()


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="lightrail")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_list_and_prepare(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIGHTRAIL_CACHE", str(tmp_path))
    assert run_cli("models", "list", "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["tiny", "small", "smollm2"] and not any(r["prepared"] for r in rows)
    assert run_cli("models", "prepare", "tiny") == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "models" / "tiny")
    assert run_cli("models", "list") == 0
    assert "tiny     prepared" in capsys.readouterr().out
    assert run_cli("models", "prepare", str(tmp_path / "nowhere")) == 2
    with pytest.raises(SystemExit):
        run_cli("models", "--help")
    assert "prepare" in capsys.readouterr().out
