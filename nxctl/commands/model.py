"""`nxctl model list|info`: the named models and what a model file holds."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from engine.config import ModelConfig, parse_dtype
from engine.errors import InvalidRequestError, NxError
from engine.loader import NAMED_MODELS, load_config, resolve_model
from engine.models.held_weights import held_weight_bytes
from engine.mux.registry import QUANTIZE_MODES
from nxctl.commands.common import QUANTIZE_HELP, fail

app = typer.Typer(help="List named models and describe model files.", no_args_is_help=True)


def model_info(name: str, dtype: str = "float32", quantize: str = "auto") -> dict[str, object]:
    """What `nxctl model info` prints, as a dict (raises typed engine errors)."""
    if quantize not in QUANTIZE_MODES:
        raise InvalidRequestError(f"--quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    source = resolve_model(name)
    config: ModelConfig = load_config(source)
    torch_dtype = parse_dtype(dtype)
    kept = {qtype for _, qtype in config.quantized_weights} if quantize != "none" else set()
    kept |= {"Q8_0"} if quantize == "int8" else set()
    return {
        "name": source.name,
        "source": source.kind,
        "architecture": config.architecture,
        "parameters": config.num_params,
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "heads": f"{config.num_heads} (kv {config.num_kv_heads})",
        "vocab_size": config.vocab_size,
        "dtype": dtype,
        "quantized": ", ".join(sorted(kept)) or "none",
        "weight_bytes": held_weight_bytes(config, dtype, quantize),
        "kv_bytes_per_token": config.kv_bytes_per_token(torch_dtype),
        "context_length": config.max_position_embeddings,
    }


@app.command("list")
def list_models() -> None:
    """The named models this installation knows."""
    table = Table("name", "description", "available")
    for name, description in NAMED_MODELS.items():
        try:
            resolve_model(name)
            available = "yes"
        except NxError as exc:
            available = f"no: {exc}"
        table.add_row(name, description, available)
    Console().print(table)


@app.command("info")
def info(
    model: Annotated[str, typer.Argument(help="A named model, a model folder or a .gguf file.")],
    dtype: Annotated[str, typer.Option(help="The dtype the weights load as.")] = "float32",
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
