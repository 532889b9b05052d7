"""The library as users install it: the wheel's contents, a publisher-only install, the example.

Each test builds in a temporary directory and installs into a fresh virtual
environment, as a new user would. uv (the dev venv's, ``uv.find_uv_bin``) builds the
wheel from an sdist, makes the venvs and installs: the same metadata and resolution as
pip, in seconds instead of tens of seconds.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from uv import find_uv_bin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "receipts"
UV = find_uv_bin()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.same_worker(
        reason="its tests share one built wheel (a module fixture); "
        "a second worker would build it again"
    ),
]


def run(*command: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``command``; fail the test with its output when it fails.

    uv trusts the system's certificates (as ``infra/venv.sh`` makes it): it reads
    neither pip's configuration nor, by default, the system's store.
    """
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False,
                          env={**os.environ, "UV_SYSTEM_CERTS": "1"})
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Through an sdist, as a release is built: the sdist must hold what the wheel needs.
    run(UV, "build", "-q", "--out-dir", out, ROOT)
    [built] = out.glob("eventbus-*.whl")
    return built


def fresh_venv(path: Path) -> Path:
    """A new virtual environment at ``path`` (nothing in it); its python."""
    run(UV, "venv", "-q", path)
    return path / "bin" / "python"


def install(python: Path, *requirements: str | Path) -> None:
    """Install ``requirements`` into ``python``'s environment, resolved as pip would.

    uv reuses a local project's cached build until its pyproject.toml changes, so the
    library and the example are always built again: the test must install this checkout.
    """
    run(UV, "pip", "install", "-q", "--refresh-package", "eventbus",
        "--refresh-package", "receipts-example", "--python", python, *requirements)


def test_the_wheel_holds_the_eventbus_package_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"eventbus", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                    + ".dist-info"}
    assert "eventbus/py.typed" in names
    assert "eventbus/testing.py" in names
    assert not any(name.startswith(("handlers/", "localdb/", "infra/", "tests/")) for name in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    assert b"Provides-Extra: service" in metadata
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names
                                                    if n.endswith("entry_points.txt")))
    assert b"eventbus = eventbus.ops.cli:main" in entry_points


def test_a_publisher_installs_without_flask_pymongo_or_pydantic(wheel: Path,
                                                                tmp_path: Path) -> None:
    # The settings are pydantic-settings models, in the [service] extra (issue 41): a
    # publisher has neither them nor LocalBus, which runs handlers on them.
    python = fresh_venv(tmp_path / "venv")
    install(python, wheel)
    probe = ("import importlib.util as u\n"
             "from eventbus import publish, Router, Context, PermanentError, TransientError\n"
             "from eventbus.settings_base import SettingsError, publish_target\n"
             "print(u.find_spec('flask') is None, u.find_spec('pymongo') is None,\n"
             "      u.find_spec('pydantic') is None)\n")
    assert run(python, "-c", probe).stdout.split() == ["True", "True", "True"]
    for statement, needs in (("from eventbus import create_app; create_app", "flask"),
                             ("from eventbus import Settings", "pydantic")):
        failed = subprocess.run([str(python), "-c", statement],
                                capture_output=True, text=True, check=False)
        assert failed.returncode != 0 and needs in failed.stderr.lower(), statement


def test_the_service_extra_gives_everything_the_push_service_needs(wheel: Path,
                                                                   tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    install(python, f"{wheel}[service]")
    probe = ("import flask, pymongo, gunicorn, functions_framework, google.auth, requests\n"
             "import pydantic, pydantic_settings, dotenv\n"
             "from eventbus import Router, Settings, create_app\n"
             "from eventbus.testing import LocalBus\n"
             "from eventbus.store.memory import MemoryEventStore\n"
             "app = create_app(Router(), store=MemoryEventStore())\n"
             "print(app.test_client().get('/health').status_code)\n")
    assert run(python, "-c", probe).stdout.split()[-1] == "200"
    assert (python.parent / "eventbus").exists()


def test_the_example_service_passes_its_own_tests_with_localbus(tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    install(python, f"{EXAMPLE}[test]")
    done = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", EXAMPLE / "tests",
               cwd=EXAMPLE)
    assert " passed" in done.stdout and "failed" not in done.stdout
