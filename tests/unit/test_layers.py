"""The layers' import rules, checked on the source of every module under src/eventbus.

* ``eventbus/model/`` is pure: the standard library, ``eventbus.model`` and
  ``eventbus.settings`` only (imports under ``if TYPE_CHECKING:`` are types, not code);
* ``eventbus/contracts/`` (contract files) imports the standard library and the model only;
* rules on roles: only a ``mongo`` module (``store/mongo*.py``, a feature's ``mongo.py``) and
  ``store/roundtrips.py`` import pymongo or bson; only a ``command`` or ``cli`` module (or
  ``ops/commands/``) imports argparse; only ``store/`` and a feature's ``mongo`` and
  ``memory`` modules touch a collection (``.collection``, ``find_one``, ``update_one``...);
* the core (``CORE``) never imports a feature (``eventbus.partners``, ``eventbus.rebuild``) at
  run time, but for the breaks listed in ``KNOWN_CORE_IMPORTS_OF_FEATURES``, each with why;
* a moved module's old path is a stub that imports ``eventbus._moved`` only;
* only ``eventbus/web/`` imports Flask (or Werkzeug);
* ``eventbus/processor/`` imports the model, the store protocol and documents, the guard,
  correlation and settings: never telemetry, the outbox, the web or the workers;
* ``eventbus/telemetry/`` imports settings, correlation, the model and the processor (the
  middleware it is), never the outbox, the store's drivers, the web or the workers;
* ``eventbus/assembly.py`` (the parts of a service) imports no Flask;
* ``eventbus/workers/`` imports the layers below it (model, settings, store protocol and
  documents, processor, outbox, ``pubsub.message``, telemetry, assembly) and google-cloud-pubsub in
  ``subscriber`` and ``deadletter`` only; never ``eventbus.ops`` (the CLI imports the
  workers, not the other way round), ``eventbus.web`` or ``eventbus.testing``;
* ``import eventbus`` (and the test bus) works where neither Flask nor pymongo is installed;
* ``import eventbus`` and ``publish()`` work where pydantic is not installed either (a
  publisher-only install): only ``Settings`` and what builds on it need pydantic.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "eventbus"
MODULES = sorted(PACKAGE.rglob("*.py"))

PYMONGO = ("pymongo", "bson", "gridfs", "motor")
FEATURES = ("eventbus.partners", "eventbus.rebuild")
CORE = ("eventbus.model", "eventbus.settings", "eventbus.clock", "eventbus.store",
        "eventbus.processor", "eventbus.guard", "eventbus.correlation", "eventbus.http",
        "eventbus.telemetry", "eventbus.outbox", "eventbus.pubsub", "eventbus.contracts")
"""The core: what a feature may build on and never the other way round. The edges
(``assembly``, ``web``, ``workers``, ``ops``, ``testing``) put the two together."""
KNOWN_CORE_IMPORTS_OF_FEATURES: dict[tuple[str, str], str] = {
}
"""Known breaks of the core's rule, each with why; the test fails once one is fixed, so the
entry goes with the fix."""


def mongo_role(module: str) -> bool:
    """A module whose role is MongoDB: ``store/mongo*.py``, ``roundtrips``, a feature's mongo."""
    parts = module.removesuffix(".py").split("/")
    in_store = parts[:2] == ["eventbus", "store"] and (
        parts[-1].startswith("mongo") or parts[-1] == "roundtrips")
    return in_store or (parts[-1] == "mongo" and under(".".join(parts[:2]), *FEATURES))


def command_role(module: str) -> bool:
    """A module whose role is a command line: a ``command`` or ``cli`` module, ``ops/commands/``."""
    stem = module.removesuffix(".py").split("/")[-1]
    return stem in ("command", "cli") or module.startswith("eventbus/ops/commands/")


def storage_role(module: str) -> bool:
    """A module that may touch a collection: ``store/``, a feature's ``mongo`` or ``memory``."""
    parts = module.removesuffix(".py").split("/")
    return module.startswith("eventbus/store/") or (
        parts[-1] in ("mongo", "memory") and under(".".join(parts[:2]), *FEATURES))


def is_stub(path: Path) -> bool:
    """A moved module's old path: it imports ``eventbus._moved`` and nothing else."""
    return {found.statement for found in imports(path)
            if not is_stdlib(found.module)} == {"eventbus._moved"}
FLASK = ("flask", "werkzeug")
MODEL_MAY_IMPORT = ("eventbus.model", "eventbus.settings", "eventbus._moved")
WORKERS_MAY_IMPORT = ("eventbus.model", "eventbus.settings", "eventbus.store.base",
                      "eventbus.clock",
                      "eventbus.partners",
                      "eventbus.store.documents", "eventbus.processor", "eventbus.outbox",
                      "eventbus.pubsub.message", "eventbus.telemetry", "eventbus.workers",
                      "eventbus.assembly", "eventbus.correlation", "eventbus._moved")
PROCESSOR_MAY_IMPORT = ("eventbus.model", "eventbus.settings", "eventbus.store.base",
                        "eventbus.clock", "eventbus.store.documents", "eventbus.store",
                        "eventbus.guard", "eventbus.correlation", "eventbus.processor",
                        "eventbus._moved")
TELEMETRY_MAY_IMPORT = ("eventbus.settings", "eventbus.correlation", "eventbus.model",
                        "eventbus.processor", "eventbus.telemetry", "opentelemetry",
                        "prometheus_client", "eventbus._moved", "eventbus.clock")
GOOGLE_CLIENT = ("google",)
GOOGLE_CLIENT_MODULES = {"eventbus/workers/subscriber.py", "eventbus/workers/deadletter.py"}
COLLECTION_METHODS = frozenset({
    "collection", "find", "find_one", "find_one_and_update", "find_one_and_replace",
    "find_one_and_delete", "insert_one", "insert_many", "update_one", "update_many",
    "replace_one", "delete_one", "delete_many", "count_documents", "estimated_document_count",
    "aggregate", "bulk_write", "distinct", "create_index", "create_indexes", "drop_index",
    "index_information", "list_collection_names", "drop_collection", "watch",
})

# Known breaks of a rule, each with why; the test below fails once one is fixed,
# so the entry is removed with the fix instead of hiding the next break.
KNOWN_PYMONGO_IMPORTS: dict[tuple[str, str], str] = {}


@dataclasses.dataclass(frozen=True)
class Import:
    module: str
    """The absolute name imported (``from a import b`` gives ``a.b`` and ``a``)."""
    line: int
    type_checking: bool
    """True under ``if TYPE_CHECKING:``: a type-only import that never runs."""
    statement: str
    """The module the statement names (``a`` in ``from a import b``)."""


def relative(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def package_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts if path.name == "__init__.py" else parts[:-1])


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


@functools.cache  # each test walks every module: parsed once per process, not once a test
def imports(path: Path) -> tuple[Import, ...]:
    """Every import statement of a module, wherever it is (module level or in a function)."""
    found: list[Import] = []
    package = package_of(path).split(".")
    if path.name == "__init__.py":
        package = package[:-1] if False else package

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, type_checking, alias.name)
                         for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append(Import(base, node.lineno, type_checking, base))
            found.extend(Import(f"{base}.{alias.name}", node.lineno, type_checking, base)
                         for alias in node.names if alias.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(ast.parse(path.read_text(), str(path)), False)
    return tuple(found)


def under(name: str, *roots: str) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in roots)


def is_stdlib(name: str) -> bool:
    top = name.split(".")[0]
    return top == "__future__" or top in sys.stdlib_module_names


def all_imports() -> Iterator[tuple[str, Import]]:
    for path in MODULES:
        for found in imports(path):
            yield relative(path), found


def named(path: Path) -> list[Import]:
    """The names a module's imports bring in: ``a.b`` for ``from a import b``, not ``a`` too."""
    found = imports(path)
    lists = {(item.line, item.statement) for item in found if item.module != item.statement}
    return [item for item in found
            if item.module != item.statement or (item.line, item.statement) not in lists]


def test_the_rules_see_every_layer() -> None:
    names = {relative(path) for path in MODULES}
    assert {"eventbus/__init__.py", "eventbus/model/event.py", "eventbus/store/mongo.py",
            "eventbus/web/app.py", "eventbus/processor/pipeline.py", "eventbus/testing.py",
            "eventbus/workers/redrive.py", "eventbus/processor/middleware.py",
            "eventbus/telemetry/stages.py", "eventbus/assembly.py",
            "eventbus/workers/pull.py"} <= names
    redrive = {found.module for found in named(PACKAGE / "workers" / "redrive.py")}
    assert "eventbus.workers.original.build" in redrive
    assert "eventbus.workers.original" not in redrive
    mongo = {found.module for found in imports(PACKAGE / "store" / "mongo.py")}
    assert "pymongo" in mongo and "eventbus.model.errors" in mongo
    context = imports(PACKAGE / "model" / "context.py")
    assert [found.type_checking for found in context if found.module == "eventbus.guard"] == [
        True]


def test_the_model_imports_only_the_stdlib_itself_and_settings() -> None:
    bad = [f"{module}:{found.line} imports {found.module}" for module, found in all_imports()
           if module.startswith("eventbus/model/") and not found.type_checking
           and not is_stdlib(found.module) and not under(found.module, *MODEL_MAY_IMPORT)]
    assert bad == []


def test_the_contracts_package_imports_only_the_stdlib_and_the_model() -> None:
    bad = [f"{module}:{found.line} imports {found.module}" for module, found in all_imports()
           if module.startswith("eventbus/contracts/") and not found.type_checking
           and not is_stdlib(found.module)
           and not under(found.module, "eventbus.model", "eventbus.contracts")]
    assert bad == []


def test_the_workers_import_only_the_layers_below_them() -> None:
    bad = []
    for path in MODULES:
        module = relative(path)
        if not module.startswith("eventbus/workers/"):
            continue
        for found in named(path):
            allowed = under(found.module, *WORKERS_MAY_IMPORT) or (
                under(found.module, *GOOGLE_CLIENT) and module in GOOGLE_CLIENT_MODULES)
            if not found.type_checking and not is_stdlib(found.module) and not allowed:
                bad.append(f"{module}:{found.line} imports {found.module}")
    assert bad == []


@pytest.mark.parametrize(("folder", "allowed"), [
    ("eventbus/processor/", PROCESSOR_MAY_IMPORT),
    ("eventbus/telemetry/", TELEMETRY_MAY_IMPORT),
])
def test_the_processor_and_telemetry_import_only_what_they_may(
        folder: str, allowed: tuple[str, ...]) -> None:
    bad = [f"{module}:{found.line} imports {found.module}" for module, found in all_imports()
           if module.startswith(folder) and not found.type_checking
           and not is_stdlib(found.module) and not under(found.module, *allowed)]
    assert bad == []


def test_the_processor_never_names_telemetry() -> None:
    # Telemetry wraps the stages as middleware; the stages call nothing of it.
    for path in (PACKAGE / "processor").glob("*.py"):
        assert "telemetry" not in {part for found in imports(path)
                                   for part in found.module.split(".")}, path.name


def test_only_a_mongo_module_imports_pymongo() -> None:
    found = {(module, item.statement) for module, item in all_imports()
             if under(item.module, *PYMONGO) and not mongo_role(module)}
    unexpected = sorted(found - set(KNOWN_PYMONGO_IMPORTS))
    assert unexpected == []
    fixed = sorted(set(KNOWN_PYMONGO_IMPORTS) - found)
    assert fixed == [], "fixed: remove these from KNOWN_PYMONGO_IMPORTS"


def test_only_the_web_layer_imports_flask() -> None:
    bad = [f"{module}:{found.line} imports {found.module}" for module, found in all_imports()
           if under(found.module, *FLASK) and not module.startswith("eventbus/web/")]
    assert bad == []


def test_only_a_command_module_imports_argparse() -> None:
    bad = [f"{module}:{found.line}" for module, found in all_imports()
           if found.module == "argparse" and not command_role(module)]
    assert bad == []


def test_the_role_rules_see_the_roles() -> None:
    assert mongo_role("eventbus/partners/mongo.py") and mongo_role("eventbus/store/mongo_ops.py")
    assert not mongo_role("eventbus/partners/memory.py") and not mongo_role("eventbus/ops/cli.py")
    assert command_role("eventbus/rebuild/verify/command.py")
    assert command_role("eventbus/ops/cli.py")
    assert not command_role("eventbus/rebuild/runner.py")
    assert storage_role("eventbus/rebuild/memory.py")
    assert not storage_role("eventbus/rebuild/mode.py")
    assert is_stub(PACKAGE / "bulkhead.py") and not is_stub(PACKAGE / "partners" / "bulkhead.py")


def test_the_core_never_imports_a_feature() -> None:
    found = {(module, item.statement) for module, item in all_imports()
             if under(module.removesuffix(".py").replace("/", "."), *CORE)
             and not item.type_checking and under(item.module, *FEATURES)}
    unexpected = sorted(found - set(KNOWN_CORE_IMPORTS_OF_FEATURES))
    assert unexpected == []
    fixed = sorted(set(KNOWN_CORE_IMPORTS_OF_FEATURES) - found)
    assert fixed == [], "fixed: remove these from KNOWN_CORE_IMPORTS_OF_FEATURES"


def test_every_old_path_is_a_stub_of_a_module_that_exists() -> None:
    import importlib.util

    stubs = [path for path in MODULES if "from eventbus._moved import moved" in path.read_text()]
    assert len(stubs) >= 12
    for path in stubs:
        assert is_stub(path), relative(path)
        target = path.read_text().split('moved(__name__, "')[1].split('"')[0]
        assert importlib.util.find_spec(target) is not None, (relative(path), target)


def test_only_the_store_touches_collections() -> None:
    bad = []
    for path in MODULES:
        module = relative(path)
        if storage_role(module):
            continue
        for node in ast.walk(ast.parse(path.read_text(), module)):
            if isinstance(node, ast.Attribute) and node.attr in COLLECTION_METHODS:
                bad.append(f"{module}:{node.lineno} uses .{node.attr}")
    assert bad == []


def test_the_collection_check_would_see_a_use() -> None:
    tree = ast.parse("store.collection.find_one({})\nevents.update_one({}, {})\n")
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert {"collection", "find_one", "update_one"} <= COLLECTION_METHODS & used


BLOCKED = "import sys; sys.modules['flask'] = None; sys.modules['pymongo'] = None; "


@pytest.mark.parametrize("statement", [
    "from eventbus import publish, Router, Context, Settings, PermanentError, TransientError",
    "from eventbus.testing import LocalBus, FakeClock, CapturingPublisher",
    "from eventbus.store import MemoryEventStore, EventStore",
    "from eventbus.processor import Processor",
])
def test_the_library_imports_without_flask_or_pymongo(statement: str) -> None:
    check = (f"{BLOCKED}{statement}; "
             "assert 'flask' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]; "
             "assert sys.modules['pymongo'] is None")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=SRC.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


PYDANTIC = ("pydantic", "pydantic_core", "pydantic_settings")
BLOCKED_PYDANTIC = "".join(f"sys.modules[{name!r}] = None; " for name in PYDANTIC)
NO_PYDANTIC_LOADED = ("assert not [m for m in sys.modules if m.split('.')[0] in "
                      f"{PYDANTIC!r} and sys.modules[m]]")


@pytest.mark.parametrize("statement", [
    "import eventbus",
    "from eventbus import publish, Publisher, Router, Context, PermanentError, TransientError",
    "from eventbus.settings_base import SettingsError, publish_target",
])
def test_the_publisher_imports_without_pydantic(statement: str) -> None:
    check = f"{BLOCKED}{BLOCKED_PYDANTIC}{statement}; {NO_PYDANTIC_LOADED}"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=SRC.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


PUBLISH_WITHOUT_PYDANTIC = """
from eventbus.pubsub import publisher

class Sent:
    def result(self, timeout=None):
        return "m-1"

class Client:  # google-cloud-pubsub's client, without a server
    def __init__(self, **options):
        pass

    def topic_path(self, project, topic):
        return f"projects/{project}/topics/{topic}"

    def publish(self, path, data, ordering_key="", **attributes):
        print(path)
        return Sent()

    def stop(self):
        pass

publisher.pubsub_v1.PublisherClient = Client
from eventbus import publish
print(publish("OR_MGMT", {"orderId": 1},
              entity={"partnerId": "p1", "entity_id": "o-1", "entity_type": "Order"}))
"""


def test_publish_reads_its_two_variables_without_pydantic() -> None:
    # GOOGLE_CLOUD_PROJECT and PUBSUB_TOPIC, read directly; empty keeps the default, and a
    # variable only the service reads is not looked at (no Settings without pydantic).
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": "proj", "PUBSUB_TOPIC": "",
           "EVENTBUS_LEASE_SECONDS": "not a number"}
    done = subprocess.run([sys.executable, "-c", f"import sys; {BLOCKED}{BLOCKED_PYDANTIC}\n"
                           f"{PUBLISH_WITHOUT_PYDANTIC}\n{NO_PYDANTIC_LOADED}"],
                          capture_output=True, text=True, cwd=SRC.parent, timeout=120,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["projects/proj/topics/partner-events", "m-1"]


def test_the_settings_need_pydantic() -> None:
    # The other half of the checks above: blocking pydantic really blocks.
    done = subprocess.run([sys.executable, "-c",
                           f"import sys; {BLOCKED_PYDANTIC}from eventbus import Settings"],
                          capture_output=True, text=True, cwd=SRC.parent, timeout=120,
                          check=False)
    assert done.returncode != 0 and "pydantic" in done.stderr


def test_the_web_layer_needs_flask() -> None:
    # The other half of the check above: blocking really blocks.
    done = subprocess.run([sys.executable, "-c", f"{BLOCKED}from eventbus import create_app"],
                          capture_output=True, text=True, cwd=SRC.parent, timeout=120,
                          check=False)
    assert done.returncode != 0 and "flask" in done.stderr


def module_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports at run time (type-only imports left out)."""
    modules = {relative(path).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for path in (SRC / "eventbus").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in (SRC / "eventbus").rglob("*.py"):
        name = relative(path).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        graph[name] = {found.module for found in imports(path)
                       if not found.type_checking and found.module in modules
                       and found.module != name and not under(name, found.module)}
    return graph


def test_no_module_imports_itself_back_through_others() -> None:
    """No import cycle between modules (late imports inside functions count too)."""
    graph = module_graph()
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert cycles == []


def test_no_dotted_path_is_used_twice() -> None:
    """Each module has one dotted path: no module beside a package of its name."""
    paths: dict[str, list[str]] = {}
    for path in (SRC / "eventbus").rglob("*.py"):
        name = relative(path).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        paths.setdefault(name, []).append(relative(path))
    assert {name: found for name, found in paths.items() if len(found) > 1} == {}


SYNONYMS = ("replay_mode", "replaying", "rebuilder", "rebuilding", "rebuilds", "partner_ops",
            "partner_commands", "partner_documents", "partner_gauges")
"""The names that stood in for a feature's home before it had one (issue 41)."""


def test_no_module_outside_a_stub_has_a_synonym_name() -> None:
    bad = [relative(path) for path in MODULES
           if path.stem in SYNONYMS and not is_stub(path)]
    assert bad == []


def test_the_package_map_names_every_package_and_top_level_module() -> None:
    import eventbus

    doc = eventbus.__doc__ or ""
    parts = {path.parent.name for path in (SRC / "eventbus").glob("*/__init__.py")}
    parts |= {path.stem for path in (SRC / "eventbus").glob("*.py")
              if path.stem not in ("__init__", "__main__", "_moved")}
    assert sorted(name for name in parts if f"``eventbus.{name}``" not in doc) == []


def package_maps() -> dict[str, tuple[list[str], list[str]]]:
    """Each package (stubs aside) → (its modules and packages its docstring never names,
    the bullet names of its docstring that are no module of it)."""
    found = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if package == PACKAGE or is_stub(init):
            continue
        dotted = ".".join(package.relative_to(SRC).parts)
        children = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
        children |= {path.parent.name for path in package.glob("*/__init__.py")}
        unnamed = sorted(child for child in children if not child.startswith("_")
                         and f"``{child}``" not in doc and f"``{child}/``" not in doc
                         and f"``{dotted}.{child}``" not in doc)
        gone = sorted(name for name in re.findall(r"^\* ``([a-z_]+)``", doc, re.MULTILINE)
                      if name not in children)
        found[dotted] = (unnamed, gone)
    return found


def test_every_package_docstring_names_its_modules_and_only_those() -> None:
    maps = package_maps()
    assert {"eventbus.partners", "eventbus.rebuild.verify", "eventbus.store.documents"} <= set(
        maps)
    assert {package: where for package, where in maps.items() if where != ([], [])} == {}


def test_the_app_uses_no_cli_internals() -> None:
    app = Path(__file__).resolve().parents[2] / "handlers"
    found = []
    for path in app.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {name}" for name in names
                      if under(name, "eventbus.ops.cli", "eventbus.ops.commands")]
    assert found == []
