"""`nxctl serve --ray`'s options and refusals, without starting Ray: settings, one-line errors, what a
local instance is told, the deployment's reservations, and that the seat without --ray never imports ray."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nxctl.commands import serve as serve_cmd
from nxctl.server.settings import LOCAL_RAY, ClusterSettings
from tests.nxctl.test_serve_cli import make_app

runner = CliRunner()


def serve(*args: str) -> tuple[int, str]:
    result = runner.invoke(make_app(), ["serve", *args])
    return result.exit_code, result.output


def test_ray_options_make_cluster_settings() -> None:
    settings = serve_cmd.build_settings(models=["tiny"], ray=LOCAL_RAY, replicas=2, threads=3)
    assert settings.cluster == ClusterSettings(address=LOCAL_RAY, replicas=2, threads=3)
    assert settings.cluster.local
    assert serve_cmd.build_settings(models=["tiny"], ray=LOCAL_RAY).cluster == ClusterSettings()
    joined = serve_cmd.build_settings(models=["tiny"], ray="auto").cluster
    assert joined is not None and not joined.local
    assert serve_cmd.build_settings(models=["tiny"], threads=4).cluster is None  # no --ray: one process


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "2"], "nxctl: error: --replicas needs --ray"),
        (["--ray", "--replicas", "0"], "nxctl: error: invalid --ray setting(s): replicas"),
        (["--ray", "--threads", "0"], "nxctl: error: invalid --ray setting(s): threads"),
        (["--ray-address", "-x"], "nxctl: error: invalid --ray setting(s): ray address"),
    ],
)
def test_bad_ray_options_are_one_clear_line(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # an option let through fails fast here, starting no Ray
    code, output = serve("--model", "tiny", *args)
    assert code == 2 and message in output and "Traceback" not in output


def test_an_unknown_model_is_refused_before_ray_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # were Ray reached, this would fail differently
    code, output = serve("--ray", "--model", "no-such-model")
    assert code == 2 and "nxctl: error: unknown model 'no-such-model'" in output


def test_without_the_cluster_extra_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    code, output = serve("--ray", "--model", "tiny")
    assert code == 2 and "--ray needs Ray Serve: pip install 'nxctl[cluster]'" in output.replace("\n", " ")


def test_an_address_where_no_cluster_listens_is_one_line_not_a_wait() -> None:
    pytest.importorskip("ray")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    code, output = serve("--ray-address", f"127.0.0.1:{port}", "--model", "tiny")
    assert code == 2 and f"no Ray cluster answers at 127.0.0.1:{port}" in output.replace("\n", " ")


def test_a_local_instance_stays_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    from nxctl.server import ray_cluster

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    ray_cluster.import_ray()
    assert ray_cluster.os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    kwargs = ray_cluster.init_kwargs(ClusterSettings(replicas=2, threads=3))
    assert kwargs["address"] == "local"  # a new instance even where RAY_ADDRESS is set
    assert kwargs["num_cpus"] == 6 and kwargs["include_dashboard"] is False
    assert kwargs["object_store_memory"] == 100 << 20
    joined = ray_cluster.init_kwargs(ClusterSettings(address="auto"))
    assert joined["address"] == "auto" and "num_cpus" not in joined  # a cluster keeps its own


def test_each_replica_reserves_a_cpu_per_torch_thread() -> None:
    pytest.importorskip("ray")
    from nxctl.server.ray_replica import seat_deployment

    settings = serve_cmd.build_settings(models=["tiny"], ray=LOCAL_RAY, replicas=2, threads=3, max_queue=7)
    deployment = seat_deployment(settings)
    assert deployment.num_replicas == 2 and deployment.ray_actor_options["num_cpus"] == 3
    assert deployment.max_ongoing_requests > 7  # the seat's own queue answers 503, not Ray's proxy


IMPORTS_OF_A_SEAT = """
import sys
from nxctl.commands.serve import build_settings
from nxctl.server.app import create_app, preload_models
app = create_app(build_settings(models=["tiny"], quiet=True, dlq={dlq!r}), preload=False)
preload_models(app)
app.state.seat.host.close()
{extra}
print("ray" in sys.modules, any(name.startswith("ray.") for name in sys.modules))
"""


def imports_ray(tmp: str, extra: str = "") -> str:
    code = IMPORTS_OF_A_SEAT.format(dlq=f"{tmp}/dlq.sqlite", extra=extra)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_the_seat_without_ray_never_imports_it(tmp_path) -> None:
    assert imports_ray(str(tmp_path)) == "False False"


def test_the_check_sees_ray_where_the_ray_path_imports_it(tmp_path) -> None:
    """The negative control: the --ray path's import does load ray, and the check says so."""
    pytest.importorskip("ray")
    extra = "from nxctl.server.ray_cluster import import_ray; import_ray()"
    assert imports_ray(str(tmp_path), extra) == "True True"
