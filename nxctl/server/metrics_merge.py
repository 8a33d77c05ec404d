"""Every replica's /metrics as one Prometheus exposition, each sample labelled with its replica.

    replica a:  vllm:prefix_cache_hits_total{model_name="tiny"} 32.0
    replica b:  vllm:prefix_cache_hits_total{model_name="tiny"} 0.0
    merged:     vllm:prefix_cache_hits_total{model_name="tiny",replica="a"} 32.0
                vllm:prefix_cache_hits_total{model_name="tiny",replica="b"} 0.0

Each family's ``# HELP`` / ``# TYPE`` lines once, then its samples from every replica together (the text
format wants a family's samples in one group). No sum across replicas is added: Prometheus sums
``by (model_name)`` where one is wanted, and an unlabelled total beside the labelled samples would count
twice. A replica whose text did not arrive is left out (the ingress logs it).
"""

from __future__ import annotations

from collections.abc import Mapping

REPLICA_LABEL = "replica"


def _family(name: str, families: Mapping[str, object]) -> str:
    """The family a sample belongs to (a histogram's ``_bucket``/``_sum``/``_count``, a counter's
    ``_total``/``_created``): ``name`` itself when a family has that name (prometheus_client declares
    ``X_created`` and ``X_total`` families of their own), else the family it is a suffix of."""
    if name in families:
        return name
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_gsum", "_gcount"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def with_label(sample: str, label: str, value: str) -> str:
    """A sample line with ``label="value"`` added to its labels."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    pair = f'{label}="{escaped}"'
    brace = sample.find("{")
    space = sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = sample.index("}", brace)
        inside = sample[brace + 1 : close]
        joined = f"{inside},{pair}" if inside.strip() else pair
        return f"{sample[: brace + 1]}{joined}{sample[close:]}"
    return f"{sample[:space]}{{{pair}}}{sample[space:]}"


def merge_metrics(texts: Mapping[str, str]) -> str:
    """``texts`` (replica id -> its exposition) as one exposition, every sample labelled ``replica``."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for replica, text in texts.items():
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    declared = headers.setdefault(parts[2], [])
                    samples.setdefault(parts[2], [])
                    if line not in declared:
                        declared.append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            samples.setdefault(_family(name, headers), []).append(with_label(line, REPLICA_LABEL, replica))
    lines: list[str] = []
    for family, rows in samples.items():
        lines.extend(headers.get(family, []))
        lines.extend(rows)
    return "\n".join(lines) + "\n" if lines else ""
