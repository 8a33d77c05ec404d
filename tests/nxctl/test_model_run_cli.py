"""`nxctl model` and `nxctl run` through Typer's CliRunner: output, and one clear line for bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from nxctl.cli import app

runner = CliRunner()


def test_model_list_names_both_models() -> None:
    result = runner.invoke(app, ["model", "list"])
    assert result.exit_code == 0
    assert "smollm2" in result.stdout and "tiny" in result.stdout


def test_model_info_tiny() -> None:
    result = runner.invoke(app, ["model", "info", "tiny"])
    assert result.exit_code == 0
    for key in ("architecture", "parameters", "weight_bytes", "kv_bytes_per_token", "context_length"):
        assert key in result.stdout
    assert "1,024" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["model", "info", "nope"], "smollm2"),
        (["model", "info", "/nonexistent/model.gguf"], "not found"),
        (["run", "nope", "hi"], "unknown model"),
        (["run", "tiny", "hi", "--max-tokens", "0"], "max_tokens"),
        (["run", "tiny", "hi", "--temperature", "-1"], "temperature"),
        (["run", "tiny", "hi", "--top-p", "0"], "top_p"),
        (["run", "tiny", "hi", "--top-p", "1.5"], "top_p"),
        (["run", "tiny", "hi", "--top-k", "-2"], "top_k"),
        (["run", "tiny", "hi", "--activations", "fp8"], "unsupported activations 'fp8'"),
        (["run", "tiny", "word " * 1100], "context"),
        (["run", "tiny", "hi", "--regex", "[a-"], "invalid regex grammar"),
        (["run", "tiny", "hi", "--regex", "a", "--json"], "at most one"),
        (["run", "tiny", "hi", "--json-schema", "no-such-schema.json"], "cannot read the JSON schema"),
        (
            ["run", "tiny", "hi", "--speculative", "ngram", "--num-speculative-tokens", "40"],
            "num_speculative_tokens",
        ),
        (["run", "tiny", "hi", "--speculative", "draft", "--draft-model", "smollm2"], "vocabulary"),
        (["run", "tiny", "hi", "--speculative", "draft", "--draft-model", "no/such/dir"], "cannot be loaded"),
        (["run", "tiny", "hi", "--kv-cache-dtype", "fp8"], "kv_cache_dtype"),
        (["run", "tiny", "hi", "--dtype", "bfloat16", "--kv-cache-dtype", "float16"], "kv_cache_dtype"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


GREEDY_8 = SamplingParams(max_tokens=8, temperature=0)


def test_run_tiny_prints_the_engines_chat_turn(tiny_llm: LLM) -> None:
    result = runner.invoke(app, ["run", "tiny", "Hello", "--max-tokens", "8", "--temperature", "0"])
    assert result.exit_code == 0
    expected = tiny_llm.chat([{"role": "user", "content": "Hello"}], GREEDY_8).text
    assert expected and result.stdout == expected + "\n"


def test_run_speculating_prints_the_same_turn(tiny_llm: LLM) -> None:
    args = ["run", "tiny", "Hello", "--max-tokens", "8", "--temperature", "0", "--speculative", "ngram"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert result.stdout == tiny_llm.chat([{"role": "user", "content": "Hello"}], GREEDY_8).text + "\n"


def test_run_reads_a_raw_prompt_from_stdin(tiny_llm: LLM) -> None:
    args = ["run", "tiny", "--raw", "--max-tokens", "8", "--temperature", "0"]
    result = runner.invoke(app, args, input="Once upon")
    assert result.exit_code == 0
    expected = tiny_llm.generate("Once upon", GREEDY_8)[0].text
    assert expected and result.stdout == expected + "\n"


@pytest.mark.smollm2
def test_run_smollm2_paris() -> None:
    # a question whose first token has a clear lead (see tests/engine/test_engine.py's Paris test)
    result = runner.invoke(app, ["run", "smollm2", "Name the capital of France.", "--max-tokens", "32"])
    assert result.exit_code == 0
    assert "Paris" in result.stdout


def test_run_json_schema_answers_in_the_schema(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "maximum": 9}},
        "required": ["word", "n"],
        "additionalProperties": False,
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    result = runner.invoke(
        app, ["run", "tiny", "Hello", "--json-schema", str(tmp_path / "schema.json"), "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert set(answer) == {"word", "n"} and len(answer["word"]) <= 6 and answer["n"] <= 9


def test_run_regex_answers_in_the_pattern() -> None:
    result = runner.invoke(
        app, ["run", "tiny", "Hello", "--regex", "[0-9]{3}-[a-z]{2}", "--temperature", "1"]
    )
    assert result.exit_code == 0 and re.fullmatch(r"[0-9]{3}-[a-z]{2}\n", result.stdout)
