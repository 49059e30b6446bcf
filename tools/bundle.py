#!/usr/bin/env python3
"""Generate the single file users copy, rl_batch_demo.py, from the package src/rl_batch_demo/.

    python3 tools/bundle.py            # write rl_batch_demo.py
    python3 tools/bundle.py --check    # exit 1 if the committed rl_batch_demo.py is stale

The package is what we edit; the file is what ships (SQLite's amalgamation, at our size). The
file holds the package's modules in the order its __init__ docstring lists them, lowest layer
first, each part opening with a line naming its source path. Their standard-library imports are
gathered once at the top; their imports of each other are dropped (one namespace holds every
name, and two modules defining one name is an error here). Programs the package ships as files
(`NAME = embedded_text("worker.py")`) are inlined as string literals. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import collections
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "rl_batch_demo"
TARGET = ROOT / "rl_batch_demo.py"
# A line of the __init__ docstring's map: "    name: what the module holds."
MAP_LINE = re.compile(r"^    (\w+): ", re.M)
EMBEDDED = re.compile(r'^(\w+) = embedded_text\("([\w.]+)"\)$', re.M)
BANNER = "# " + "-" * 74
# Programs the package ships as text to the pods (embedded_text), listed in the map but no parts.


class BundleError(Exception):
    """The package cannot be made into one file; the message says why."""


class Module:
    """One module's source, split into its docstring, its imports and the rest."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.path = f"src/rl_batch_demo/{name}.py"
        tree = ast.parse(text, self.path)
        lines = text.split("\n")
        body = list(tree.body)
        self.docstring = ast.get_docstring(tree) or ""
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body.pop(0)
        self.imports: list[ast.stmt] = []
        self.local_imports: set[str] = set()
        while body and is_import(body[0]):
            statement = body.pop(0)
            if isinstance(statement, ast.ImportFrom) and statement.level:
                self.local_imports.add(statement.module or "")
            else:
                self.imports.append(statement)
        start = body[0].lineno if body else len(lines) + 1
        if body and getattr(body[0], "decorator_list", None):
            start = min(d.lineno for d in body[0].decorator_list)  # type: ignore[attr-defined]
        while start > 1 and lines[start - 2].startswith("#"):
            start -= 1  # the comment above the first statement belongs to it
        self.prologue_text = {ast.unparse(s): s for s in self.imports}
        self.body = "\n".join(lines[start - 1 :]).strip("\n")
        self.defined = top_level_names(body)


def is_import(statement: ast.stmt) -> bool:
    """An import, or a `try: import x / except ImportError:` block (an optional module)."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return True
    return isinstance(statement, ast.Try) and all(
        isinstance(s, (ast.Import, ast.ImportFrom)) for s in statement.body
    )


def top_level_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def module_order(init_docstring: str) -> list[str]:
    """The modules in the order the package's map lists them."""
    order = MAP_LINE.findall(init_docstring)
    if not order:
        raise BundleError("src/rl_batch_demo/__init__.py's docstring lists no modules")
    return order


def merged_imports(modules: list[Module]) -> list[str]:
    """Every module's standard-library imports, once each: `import x` lines, then `from` lines."""
    plain: set[str] = set()
    froms: dict[str, set[str]] = collections.defaultdict(set)
    blocks: list[str] = []
    for module in modules:
        for statement in module.imports:
            if isinstance(statement, ast.Import):
                plain.update(ast.unparse(ast.Import(names=[a])) for a in statement.names)
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
                    froms[statement.module or ""].add(spelled)
            else:
                block = ast.unparse(statement)
                if block not in blocks:
                    blocks.append(block)
    future = froms.pop("__future__", set())
    lines = [f"from __future__ import {', '.join(sorted(future))}", ""] if future else []
    lines += sorted(plain, key=lambda line: line.split()[1])
    for source in sorted(froms):
        names = sorted(froms[source])
        joined = f"from {source} import {', '.join(names)}"
        if len(joined) <= 100:
            lines.append(joined)
        else:
            lines += [f"from {source} import (", *(f"    {n}," for n in names), ")"]
    for block in blocks:
        lines += ["", block]
    return lines


def shipped_programs() -> set[str]:
    """The modules the package ships as programs (`NAME = embedded_text("worker.py")`): held in
    the file as text, not as code."""
    return {
        match.group(2).removesuffix(".py")
        for path in sorted(PACKAGE.glob("*.py"))
        for match in EMBEDDED.finditer(path.read_text(encoding="utf-8"))
    }


def inline_embedded(body: str) -> str:
    """`NAME = embedded_text("file")` -> NAME = the file's text as a raw string literal."""

    def literal(match: re.Match[str]) -> str:
        text = (PACKAGE / match.group(2)).read_text(encoding="utf-8")
        if "'''" in text or text.endswith("\\"):
            return f"{match.group(1)} = {text!r}"
        return f"{match.group(1)} = r'''{text}'''"

    return EMBEDDED.sub(literal, body)


def without_function(body: str, name: str) -> str:
    """The body less a top-level function (and the blank lines after it)."""
    return re.sub(rf"^def {name}\(.*?(?=^\S)", "", body, count=1, flags=re.M | re.S)


def bundle() -> str:
    """The text of rl_batch_demo.py, made from the package."""
    init_text = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    init = Module("__init__", init_text)
    order = module_order(init.docstring)
    programs = shipped_programs()
    modules = [
        Module(name, (PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        for name in order
        if name not in programs
    ]
    seen: dict[str, str] = {}
    for position, module in enumerate(modules):
        earlier = {m.name for m in modules[:position]}
        for imported in module.local_imports - earlier:
            raise BundleError(
                f"{module.path} imports .{imported}, which the map in __init__.py does not list "
                "before it: a module imports only the modules listed above it"
            )
        for name in module.defined:
            if name in seen:
                raise BundleError(f"{name} is defined in both {seen[name]} and {module.path}")
            seen[name] = module.path
    parts = [
        "#!/usr/bin/env python3",
        f'"""{init.docstring}\n\nThis file is generated from the package src/rl_batch_demo/ by tools/bundle.py;'
        ' edit the package, not this file.\n"""',
        "# SPDX-License-Identifier: MIT",
        "",
        *merged_imports(modules),
    ]
    for module in modules:
        body = module.body
        if module.name == "constants":
            body = without_function(body, "embedded_text")
        summary = module.docstring.split("\n")[0]
        parts += ["", "", BANNER, f"# {module.path}: {summary}", "", inline_embedded(body)]
    parts += ["", "", 'if __name__ == "__main__":', "    cli()", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if rl_batch_demo.py differs from what is made"
    )
    args = parser.parse_args(argv)
    try:
        text = bundle()
    except (BundleError, SyntaxError, OSError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if current == text:
            print(f"{TARGET.name} is up to date")
            return 0
        diff = difflib.unified_diff(
            current.splitlines(), text.splitlines(), "committed", "generated", lineterm="", n=1
        )
        shown = list(diff)[:40]
        print("\n".join(shown), file=sys.stderr)
        print(
            f"Error: {TARGET.name} is stale: run `python3 tools/bundle.py` and commit it",
            file=sys.stderr,
        )
        return 1
    if current != text:
        TARGET.write_text(text, encoding="utf-8")
        TARGET.chmod(0o755)
    print(f"wrote {TARGET.name} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
