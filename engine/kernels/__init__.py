"""Our own fixed-order CPU kernels: linear, paged attention read in place, RMSNorm, SiLU gate, softmax.

Batch invariance rests on these: each reduction's order is written in engine/kernels/csrc/kernels.h
and depends on a row's own data and position, never on the batch, the row's place in it, the
thread count or a library's choice of kernel. Five backends, fastest first, chosen once per process
(choice.py: each compiled one is one table of kernels for one fixed set of CPU features):

    avx512_vnni  the avx512 kernels with the int8/int16-activation linears in VNNI (CPUs with AVX512F,
                 BW, VL and VNNI too): exact integer sums, so the same bits as avx512
    avx512       the avx2 kernels with 16-lane linears, attention and input quantizer (CPUs with AVX512F
                 too): a linear's lanes are output columns, so the same bits as avx2
    avx2         the C++ kernels compiled for AVX2 + FMA + F16C (x86 CPUs that have them)
    generic      the same C++ kernels over scalar lanes: any CPU with a C++ compiler, same bits as avx2
    portable     pure torch, each row computed alone: no compiler needed, invariant, slow

Left alone a process takes the fastest compiled one the CPU has and torch's own dispatch
(ATEN_CPU_CAPABILITY) allows: AVX512 for the avx512 ones, AVX2 or better for avx2.
``NXCTL_KERNELS=avx512_vnni|avx512|avx2|generic|portable`` forces one (tests use it to exercise each);
forcing one whose instructions this CPU lacks raises KernelBackendError naming what it lacks.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from engine.kernels import choice, portable

PANEL = 16  # output columns per packed weight panel (kernels.h kPanel)
HALF_DTYPES = (torch.bfloat16, torch.float16)  # 16-bit weights the linears read as held
BACKENDS = choice.BACKENDS


@dataclass(frozen=True)
class Backend:
    name: str  # one of BACKENDS
    reason: str  # why this one: shown by `python -m engine.kernels` and in gate TSVs
    module: ModuleType | None  # the compiled module (None for portable)


@functools.cache
def backend() -> Backend:
    """The backend this process uses (built on first use; one line on stderr when it falls back).

    Raises KernelBackendError (one line) when NXCTL_KERNELS names no backend, or one this CPU lacks."""
    forced = choice.forced_name(os.environ.get("NXCTL_KERNELS", ""))
    if forced == "portable":
        return Backend("portable", "NXCTL_KERNELS=portable", None)
    from engine.kernels import build

    try:
        module = build.load()
    except Exception as exc:  # no compiler, no headers, a failed build: run invariant, slowly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"nxctl: the C++ kernels could not be built ({first}); using the portable torch kernels "
            "(batch-invariant, much slower)",
            file=sys.stderr,
        )
        return Backend("portable", f"build failed: {first}", None)
    chosen = choice.choose(forced, module.cpu_features(), torch.backends.cpu.get_cpu_capability())
    return Backend(chosen.name, chosen.reason, module)


def compiled_isas() -> tuple[str, ...]:
    """The compiled backends this process may run, fastest first (the tests compare their bits): its own
    backend and every slower one this CPU runs, down to generic (a process capped by
    ATEN_CPU_CAPABILITY or NXCTL_KERNELS runs nothing faster); () for the portable backend."""
    b = backend()
    if b.module is None:
        return ()
    below = BACKENDS[BACKENDS.index(b.name) :]
    return tuple(name for name in choice.runnable(b.module.cpu_features()) if name in below)


def pack_linear_weight(weight: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """[N, K] (or parts [N_i, K] whose rows stack, a fused weight) -> [P, K, 16] with P = ceil(N / 16): 16
    output columns side by side per k, zero-padded. One C++ pass over the parts where they are (a file's
    mapping) when the kernels are compiled; torch's copies otherwise, the same values.

    bfloat16 and float16 stay 16-bit (half the bytes to stream; the kernels widen them in registers,
    exactly); any other dtype is packed as float32. Parts of different dtypes are packed as float32.
    """
    parts = weight if isinstance(weight, list) else [weight]
    dtypes = {p.dtype for p in parts}
    dtype = dtypes.pop() if len(dtypes) == 1 and parts[0].dtype in HALF_DTYPES else torch.float32
    parts = [p.to(dtype) for p in parts]  # no copy where a part is in its dtype already
    module = backend().module
    if module is not None:
        return module.pack_panels(parts)
    weight = parts[0] if len(parts) == 1 else torch.cat(parts)
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.zeros(panels * PANEL, k, dtype=dtype)
    padded[:n] = weight
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()  # [P, K, 16]


def unpack_linear_weight(packed: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``pack_linear_weight``: [P, K, 16] -> [N, K] in ``dtype``."""
    panels, k, _ = packed.shape
    return packed.transpose(1, 2).reshape(panels * PANEL, k)[:n].to(dtype).contiguous()


def _float_input(x: torch.Tensor) -> torch.Tensor:
    """x contiguous, as float32 or bfloat16 (the dtypes the kernels read)."""
    return x.contiguous() if x.dtype in (torch.float32, torch.bfloat16) else x.float().contiguous()


def _run(name: str, *args: object) -> torch.Tensor:
    """Kernel ``name`` on this process's backend: the compiled module, or its portable twin."""
    return _call(name, *args)


def _call(name: str, *args: object) -> Any:
    """``_run`` for a kernel whose result is not one tensor."""
    b = backend()
    if b.module is None:
        return getattr(portable, name)(*args)
    return getattr(b.module, name)(b.name, *args)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] (any float dtype) @ packed weight [P, K, 16] (float32, bfloat16 or float16) -> [M, N]
    float32; each output one fma chain over K, a 16-bit weight widened exactly as it is read."""
    return _run("linear", x.float().contiguous(), packed, n)


def qlinear(x: torch.Tensor, packed: torch.Tensor, fmt: int, n: int) -> torch.Tensor:
    """x [M, K] (any float dtype) @ a packed quantized weight (quant_pack.py) -> [M, N] float32.

    Bit-identical to ``linear`` over the dequantized weight: the same fma chain over K per output; for
    a weight in a dot layout (format >= quant_pack.DOT), each row's inputs quantized to int8 (or, for
    format >= quant_pack.WIDE, int16) per 32 (csrc/qdot.h): the same bits on every compiled instruction
    set, a row's output its own."""
    return _run("qlinear", x.float().contiguous(), packed, fmt, n)


def quantized_rows(packed: torch.Tensor, fmt: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] of a packed quantized weight (quant_pack.py) as [T, K] float32: an embedding
    lookup read in place from the tiles; the values of quant_pack.unpack_quantized, exactly."""
    return _run("quantized_rows", packed, fmt, ids.long().contiguous())


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> x / sqrt(mean(x^2) + eps), [T, D] float32, row by row."""
    return _run("rms_norm", _float_input(x), eps)


def softmax(logits: torch.Tensor, log: bool = False) -> torch.Tensor:
    """Softmax (or log-softmax) over the last dimension of [V] or [S, V] float32 logits, row by row."""
    rows = logits.float().reshape(-1, logits.shape[-1]).contiguous()
    return _run("softmax", rows, log).view(logits.shape)


def row_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For [S, V] float32 logits, row by row: (argmax [S] long: the first maximum, or the first NaN, as
    torch.argmax; max [S], log_sum [S] float32: the row's log-softmax is (x - max) - log_sum, the bits
    ``softmax(log=True)`` gives), without writing an [S, V] result."""
    argmax, peak, log_sum = _call("row_stats", logits.float().contiguous())
    return argmax, peak, log_sum


def silu_mul(gate_up: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """[T, 2I] rows of [gate | up] -> silu(gate) * up (GELU, tanh form, when ``gelu``: Gemma's gate),
    [T, I] float32, row by row."""
    return _run("silu_mul", _float_input(gate_up), gelu)


def has_decoder_stack() -> bool:
    """Whether this process's backend has the C++ layer loop (``decoder_stack``): every compiled one."""
    return backend().module is not None


def decoder_stack(
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    eps: float,
    scale: float,
    window: int = 0,
) -> Any | None:
    """An empty C++ layer loop (csrc/decoder.h) on this process's compiled backend, layers added with
    its ``add_layer`` (engine/models/decoder_layer.py's add_to_stack hands it a layer's record); None on
    the portable backend (``has_decoder_stack``: the caller runs its layers one by one)."""
    module = backend().module
    if module is None:
        return None
    return module.DecoderStack(hidden, heads, kv_heads, head_dim, intermediate, eps, scale, window)


def decoder_forward(
    stack: Any,
    x: torch.Tensor,
    slots: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    tables: torch.Tensor,
    owners: torch.Tensor,
    positions: torch.Tensor,
    context_rows: int = 0,
) -> torch.Tensor:
    """Every layer of ``stack`` over a step's rows: x [N, hidden] float32 -> [N - C, hidden] float32
    (C = ``context_rows``), K/V written at ``slots`` [N]; cos, sin [N, head_dim]; tables [R, nb], owners
    and positions [N] long. The last C rows are context rows: each linear takes them in its context
    format (add_layer's ``context_formats``), and the last layer writes their K/V and drops them (no
    one reads their output). The same bits as running the layers one kernel call at a time."""
    return stack.forward(
        backend().name, x.contiguous(), slots, cos, sin, tables, owners, positions, context_rows
    )


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    owners: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each query row over its request's keys, read in place from the paged cache.

    q: [rows, H, d]; k_cache, v_cache: [blocks, Hkv, block, d] (q's dtype, or float16 or int8 under float32
    q: read widened, exactly; the C++ kernel takes float32 and bfloat16 q, float16 q takes the portable
    path); an int8 cache comes with its scales ``k_scales``, ``v_scales`` [blocks, Hkv, block, ceil(d / 32)]
    float16 laid out as the caches (engine/kv/int8.py); tables: [R, nb] long block tables; owners: [rows]
    long (row of ``tables``); positions: [rows] long (a row sees keys at positions 0..its own, or the last
    ``window``). Returns [rows, H, d] float32.
    """
    args = (
        q.contiguous(),
        k_cache,
        v_cache,
        tables.contiguous(),
        owners.contiguous(),
        positions.contiguous(),
    )
    if q.dtype == torch.float16:
        return portable.attention(*args, scale, window, softcap, k_scales, v_scales)
    return _run("attention", *args, scale, window, softcap, k_scales, v_scales)
