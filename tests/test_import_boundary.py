"""The boundary between the torch engine and the Django control plane, checked where it breaks: in a fresh
interpreter. A worker process imports the engine and must start without Django or its settings; the control plane
imports Django and must not pay for torch (seconds of import, a large share of memory, a CUDA context if anything
touches a GPU before the workers start). One stray top-level import on either side breaks that, and nothing else
notices: both sides still work, only slower or heavier."""

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
        ],
        # Every other control-plane module too (the management commands among them); of the engine, only the
        # torch-free contract the control plane speaks to the workers with (the trainer's library, pantheon_trainer,
        # is imported by a training process, never by the control plane).
        packages=["pantheon_site", "inference", "inference.engine.contract", "admin_ui", "weights"],
        skip=["inference.engine"],
        forbidden=["torch"],
        inference_allowed=["inference."],
        django_setup=True,
    )
    assert {"inference.management.commands.serve", "inference.management.commands.devices"} <= set(found["imported"])
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
