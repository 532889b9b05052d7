"""Start-up cost of the settings: importing ``eventbus.settings`` and building them.

    .venv/bin/python bench/settings_startup.py            # five runs of each, medians
    .venv/bin/python bench/settings_startup.py --runs 9

Each import is timed in a fresh interpreter (``python -X importtime``, the
cumulative microseconds of the module's own line after ``import eventbus``:
what the module adds to the package), after one untimed run that writes the
bytecode caches; so is a whole process that imports ``Settings`` and reads
them (wall time). The builds are timed in one more fresh process:
the first ``from_env`` of the process (the settings' classes already imported)
and then ``timeit`` medians of each constructor over a realistic environment
(a dozen variables set, lists and pairs among them) and an empty one. Nothing
here runs per push: the settings are read once, at start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENV = {
    "MONGODB_URI": "mongodb://db.example:27017/?replicaSet=rs0",
    "MONGODB_DB": "events",
    "EVENTBUS_LEASE_SECONDS": "30",
    "EVENTBUS_MAX_ATTEMPTS": "50",
    "EVENTBUS_AUTH": "true",
    "EVENTBUS_AUTH_AUDIENCE": "https://svc.example/push",
    "EVENTBUS_AUTH_SERVICE_ACCOUNTS": "push@p.iam.gserviceaccount.com, other@p.iam.example",
    "EVENTBUS_PARTNER_RATES": "acme=5,globex=0.5",
    "EVENTBUS_PARTNER_CONCURRENCIES": "acme=4,globex=1",
    "EVENTBUS_TELEMETRY_EXPORTER": "OTLP",
    "EVENTBUS_TRACE_SAMPLE_RATIO": "0.25",
    "EVENTBUS_TRACE_LIBRARIES": "requests,pymongo",
    "EVENTBUS_PARTNER_URL": "https://partner.example/{partnerId}/events",
    "EVENTBUS_PARTNER_TIMEOUT_SECONDS": "3",
    "EVENTBUS_CONSOLE_PORT": "8082",
    "EVENTBUS_CONSOLE_OPERATORS": "a@example.com,b@example.com",
}

BUILD = """
import json, statistics, sys, time, timeit
env = json.loads(sys.argv[1]); number = int(sys.argv[2])
from eventbus.settings import Settings
from eventbus.ops.config import OpsSettings
from handlers.settings import AppSettings
started = time.perf_counter(); Settings.from_env(env); first = time.perf_counter() - started
def per_call(build):
    return statistics.median(timeit.repeat(build, number=number, repeat=5)) / number
base = Settings.from_env(env)
print(json.dumps({
    "first Settings.from_env in a process": first,
    "Settings.from_env, 16 variables set": per_call(lambda: Settings.from_env(env)),
    "Settings.from_env, empty environment": per_call(lambda: Settings.from_env({})),
    "AppSettings.from_env, 16 variables set": per_call(lambda: AppSettings.from_env(env)),
    "OpsSettings.from_env, 16 variables set": per_call(lambda: OpsSettings.from_env(base, env)),
}))
"""


def child_env() -> dict[str, str]:
    """The environment of the timed processes: this checkout first, bytecode caches on."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("EVENTBUS_", "MONGODB_", "PUBSUB_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return env


def import_us(module: str) -> int:
    """What importing ``module`` adds to ``import eventbus``, in microseconds.

    A fresh interpreter imports the package ``eventbus`` (and google-cloud-pubsub
    with it) first; the cumulative time of ``module``'s own line is then what
    it and whatever it brings in that the package did not cost. For ``eventbus``
    itself: the whole package.
    """
    code = f"import {module}" if module == "eventbus" else f"import eventbus; import {module}"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, check=True, env=child_env(), cwd=ROOT)
    for line in done.stderr.splitlines():
        parts = [part.strip() for part in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"{module} not in the import times:\n{done.stderr[-2000:]}")


def process_seconds() -> float:
    """The wall time of a fresh interpreter that imports ``Settings`` and reads them."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c",
                    "from eventbus.settings import Settings; Settings.from_env()"],
                   check=True, env=child_env(), cwd=ROOT)
    return time.perf_counter() - started


def imported(module: str, probe: str) -> bool:
    """Whether importing ``module`` loads ``probe`` too."""
    done = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                           f"print({probe!r} in sys.modules)"],
                          capture_output=True, text=True, check=True, env=child_env(), cwd=ROOT)
    return done.stdout.strip() == "True"


def main() -> None:
    """Print the medians of ``--runs`` runs as a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000, help="builds per timeit run")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    for module in ("eventbus.settings", "eventbus.ops.config", "handlers.settings", "eventbus"):
        import_us(module)  # writes the bytecode caches
        rows[f"import {module} (ms)"] = [import_us(module) / 1000 for _ in range(args.runs)]
    rows["process: python -c 'Settings.from_env()' (ms)"] = [
        process_seconds() * 1000 for _ in range(args.runs)]
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", BUILD, json.dumps(ENV), str(args.number)],
                              capture_output=True, text=True, check=True, env=child_env(),
                              cwd=ROOT)
        for name, seconds in json.loads(done.stdout).items():
            rows.setdefault(f"{name} (µs)", []).append(seconds * 1e6)
    print(f"| what | median of {args.runs} | min | max |")
    print("| --- | --- | --- | --- |")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} "
              f"| {max(values):.1f} |")
    print(f"\n`import eventbus` loads pydantic: {imported('eventbus', 'pydantic')}")


if __name__ == "__main__":
    main()
