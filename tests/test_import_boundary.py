"""The boundary between the torch engine and the Django control plane, checked where it breaks: in a fresh
interpreter. A worker process imports the engine and must start without Django or its settings; the control plane
imports Django and must not pay for torch (seconds of import, a large share of memory, a CUDA context if anything
touches a GPU before the workers start). One stray top-level import on either side breaks that, and nothing else
notices: both sides still work, only slower or heavier."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Runs in the fresh interpreter. Records the import stack of the first forbidden module (the chain of repository
# lines that led to it), then imports the given modules and every module under the given packages, one by one
# (not descending into `skip`), and prints what was found as JSON.
PROBE = """
import importlib, json, os, pkgutil, sys, traceback

spec = json.loads(sys.argv[1])
root = os.getcwd() + os.sep

def forbidden(name):
    if name.partition(".")[0] in spec["forbidden"]:
        return True
    return name.startswith("inference.") and not name.startswith(tuple(spec["inference_allowed"]))

first = {}

class Tripwire:
    def find_spec(self, name, path=None, target=None):
        if forbidden(name) and not first:
            stack = traceback.extract_stack()[:-1]
            first["module"] = name
            first["chain"] = [f"{f.filename.removeprefix(root)}:{f.lineno}: {f.line}"
                              for f in stack if f.filename.startswith(root)]
        return None

sys.meta_path.insert(0, Tripwire())
if spec["django_setup"]:
    import django
    django.setup()

def walk(name):
    module = importlib.import_module(name)
    yield name
    for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
        if info.name not in spec["skip"]:
            yield from walk(info.name)

imported = []
for name in spec["modules"]:
    imported.append(importlib.import_module(name).__name__)
for package in spec["packages"]:
    imported += walk(package)
loaded = sorted({m if m.startswith("inference.") else m.partition(".")[0] for m in sys.modules if forbidden(m)})
print(json.dumps({"imported": imported, "loaded": loaded, "first": first}))
"""


def probe(env: dict[str, str], **spec) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(spec)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def explain(found: dict) -> str:
    first = found["first"]
    return f"loaded {found['loaded']}; {first.get('module')} was first imported via:\n" + "\n".join(
        first.get("chain", [])
    )


def test_the_engine_imports_no_django_and_nothing_else_of_inference():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}  # a worker has no settings
    found = probe(
        env,
        modules=["inference.engine.worker", "inference.engine.scheduler", "inference.engine.loaders.loading"],
        packages=["inference.engine"],  # every module of it, __main__ (the engine's command line) included
        skip=[],
        forbidden=["django", "rest_framework", "channels", "pantheon_site", "admin_ui", "weights"],
        inference_allowed=["inference.engine"],
        django_setup=False,
    )
    assert {"inference.engine.__main__", "inference.engine.text.tokenizer"} <= set(found["imported"])
    assert found["loaded"] == [], explain(found)


def test_the_control_plane_imports_no_torch(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pantheon_site.settings", "PANTHEON_DATA_DIR": str(tmp_path)}
    found = probe(
        env,
        modules=[
            "pantheon_site.urls",
            "pantheon_site.asgi",
            "inference.urls",
            "inference.runtime.control_plane",
            "inference.runtime.supervisor",
            "inference.runtime.engine_client",
            "inference.services.model_lifecycle",
            "inference.api.openai",
            "inference.api.admin",
            "fleet.urls",
        ],
        # Every other control-plane module too (the management commands among them); of the engine, only the
        # torch-free contract the control plane speaks to the workers with (the trainer's library, pantheon_trainer,
        # is imported by a training process, never by the control plane).
        packages=["pantheon_site", "inference", "inference.engine.contract", "admin_ui", "weights", "fleet"],
        skip=["inference.engine"],
        forbidden=["torch"],
        inference_allowed=["inference."],
        django_setup=True,
    )
    assert {"inference.management.commands.serve", "fleet.management.commands.router"} <= set(found["imported"])
    assert found["loaded"] == [], explain(found)


def test_a_worker_that_does_not_compile_loads_no_compiler():
    """torch.compile's stack (dynamo, inductor, sympy) costs a worker ~120 MB resident and seconds of start-up; only
    a load with `compile` (or on CUDA) needs it, and it is imported then. Any module importing a helper built with
    `@torch.compile` at its top level (llguidance's torch module is one) pulls it into every worker."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    found = probe(
        env,
        modules=["inference.engine.worker_process"],
        packages=["inference.engine"],
        skip=[],
        forbidden=["sympy"],
        inference_allowed=["inference.engine"],
        django_setup=False,
    )
    assert found["loaded"] == [], explain(found)


# -- the floors of the house, read from the source ------------------------------------------------------------------
#
# edge (inference.api, admin_ui, the management commands) -> services (inference.services) -> runtime
# (inference.runtime) -> engine (inference.engine): an import runs down a floor or stays on its own, never up. Every
# import statement counts, at the top of a module or inside a function, under `if TYPE_CHECKING:` too: a circle made
# only by type hints is mended by moving the shared type down, not by hiding the import.

HOUSE = ("inference", "weights", "pantheon_site", "admin_ui", "fleet")
EDGE = ("inference.api", "admin_ui", "inference.management")

# (importer, what it must not import, the exceptions): a module under `importer` imports no module under `forbidden`
# unless it is under one of the exceptions.
FLOORS = [
    ("inference.engine", ("inference", "weights", "pantheon_site", "admin_ui"), ("inference.engine",)),
    ("inference.runtime", ("inference.services", "weights", *EDGE), ()),
    ("inference.services", EDGE, ()),
    ("weights", EDGE, ()),
    # The UI reads and acts through the services, never through the HTTP edge or the runtime's router.
    ("admin_ui", ("inference.api", "inference.runtime"), ()),
    # The commands likewise (the local credential they present is pantheon_site's, below both).
    ("inference.management", ("inference.api", "inference.runtime.router"), ()),
    # The router (fleet) runs none of an instance's code: of inference, only the torch-free contract.
    ("fleet", ("inference", "weights", "admin_ui"), ("inference.engine.contract",)),
]


def _house_modules() -> dict[str, Path]:
    """Every module of the house by dotted name (a package by its __init__.py)."""
    modules = {}
    for package in HOUSE:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _under(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def _import_graph() -> dict[str, set[str]]:
    """Each house module's imports of other house modules (`from package import module` names the module)."""
    modules = _house_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets |= {resolve(f"{base}.{alias.name}") for alias in node.names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def test_no_import_runs_up_a_floor():
    graph = _import_graph()
    upward = [
        f"{module} imports {target}"
        for importer, forbidden, allowed in FLOORS
        for module, targets in sorted(graph.items())
        if _under(module, [importer])
        for target in sorted(targets)
        if _under(target, forbidden) and not _under(target, allowed) and not _under(target, [importer])
    ]
    assert upward == [], "\n".join(upward)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_circle_between_files():
    circles = _circles(_import_graph())
    assert circles == [], "\n".join(" <-> ".join(circle) for circle in circles)
