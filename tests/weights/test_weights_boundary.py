"""The weights app sits on the serving runtime, never under it: `weights` may import inference's runtime, services,
models and contract, but inference and pantheon_site never import `weights`, and `weights` never imports the HTTP
edge of inference (inference.api) or the UI above both. An arrow the other way would make a circle between the
apps. Read from the source (every import statement, type-only ones too), since django.setup() imports every app
anyway."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def imports_of(package: str) -> list[tuple[str, str]]:
    """(file:line, module) of every import statement in `package`'s modules."""
    found = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [(f"{path.relative_to(REPO_ROOT)}:{node.lineno}", name) for name in names]
    return found


def below(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_inference_and_the_site_never_import_the_weights_app():
    for package in ("inference", "pantheon_site"):
        upward = [(where, m) for where, m in imports_of(package) if below(m, ("weights", "admin_ui"))]
        assert upward == [], upward


def test_the_weights_app_imports_neither_the_http_edge_nor_the_ui():
    upward = [(where, m) for where, m in imports_of("weights") if below(m, ("inference.api", "admin_ui"))]
    assert upward == [], upward
