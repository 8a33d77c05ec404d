"""`nxctl model list|info`: the models this machine has (named, pulled by Ollama, in the Hugging Face
cache) and what a model file holds, with the bytes its weights take as they will be held."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from engine.errors import NxError
from engine.loader import NAMED_MODELS, ModelSource, hf_cache, load_config, ollama_store, resolve_model
from engine.model_config import ModelConfig, dtype_name
from engine.models.held_weights import held_kv_dtype, held_weight_bytes
from engine.settings import DTYPE_HELP, DTYPE_NAMES, QUANTIZE_HELP, QUANTIZE_MODES, check_choice
from nxctl.commands.common import fail

app = typer.Typer(help="List the models at hand and describe model files.", no_args_is_help=True)


def model_info(name: str, dtype: str = "float32", quantize: str = "auto") -> dict[str, object]:
    """What `nxctl model info` prints, as a dict (raises typed engine errors)."""
    check_choice("dtype", dtype, DTYPE_NAMES)
    check_choice("quantize mode", quantize, QUANTIZE_MODES)
    source = resolve_model(name)
    config: ModelConfig = load_config(source)
    kv_dtype = held_kv_dtype(config, dtype, quantize)
    kept = {qtype for _, qtype in config.quantized_weights} if quantize != "none" else set()
    kept |= {"Q8_0"} if quantize == "int8" else set()
    return {
        "name": source.name,
        "source": source.kind,
        "from": source.origin,
        "path": str(source.path),
        "file_bytes": _file_bytes(source),
        "architecture": config.architecture,
        "parameters": config.num_params,
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "heads": f"{config.num_heads} (kv {config.num_kv_heads})",
        "vocab_size": config.vocab_size,
        "dtype": dtype,
        "quantized": ", ".join(sorted(kept)) or "none",
        "weight_bytes": held_weight_bytes(config, dtype, quantize),
        "kv_cache_dtype": dtype_name(kv_dtype),
        "kv_bytes_per_token": config.kv_bytes_per_token(kv_dtype),
        "context_length": config.max_position_embeddings,
    }


def _file_bytes(source: ModelSource) -> int:
    """Bytes of the model file, or of a folder's weight files."""
    if source.kind == "gguf":
        return source.path.stat().st_size
    return sum(f.stat().st_size for f in source.path.glob("*.safetensors"))


def _list_row(name: str, origin: str, description: str) -> tuple[str, str, str, str, str]:
    """One row of `model list`: name, where from, file bytes, weight bytes as held (or why not), description."""
    try:
        source = resolve_model(name)
        held = f"{held_weight_bytes(load_config(source), 'float32', 'auto') / 2**20:,.1f} MiB"
        size = f"{_file_bytes(source) / 2**20:,.1f} MiB"
    except NxError as exc:
        return name, origin, "-", f"unavailable: {exc}", description
    return name, origin, size, held, description


@app.command("list")
def list_models() -> None:
    """Named models, models Ollama has pulled (OLLAMA_MODELS) and Hugging Face cache repositories
    (HF_HUB_CACHE / HF_HOME): each with its file size and its weights' bytes as held (float32, auto)."""
    rows = [_list_row(name, "named", description) for name, description in NAMED_MODELS.items()]
    rows += [_list_row(m.name, "ollama", "pulled by Ollama") for m in ollama_store.list_models()]
    rows += [_list_row(m.name, "hf-cache", "Hugging Face cache") for m in hf_cache.list_models()]
    table = Table("name", "from", "file", "weights held", "description")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)


@app.command("info")
def info(
    model: Annotated[str, typer.Argument(help="A named model, a model folder or a .gguf file.")],
    dtype: Annotated[str, typer.Option(help="The dtype the weights load as: " + DTYPE_HELP)] = "float32",
    quantize: Annotated[str, typer.Option("--quantize", help=QUANTIZE_HELP)] = "auto",
) -> None:
    """Architecture, parameter count, dtype, weights held quantized, weight bytes as held (on the CPU),
    KV bytes per token, context length."""
    try:
        facts = model_info(model, dtype, quantize)
    except NxError as exc:
        fail(str(exc))
    for key, value in facts.items():
        typer.echo(f"{key:20} {value:,}" if isinstance(value, int) else f"{key:20} {value}")
