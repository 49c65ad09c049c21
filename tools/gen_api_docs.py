"""Generate docs/api.md, the API reference, from the docstrings of the public API.

    python tools/gen_api_docs.py            # rewrite docs/api.md
    python tools/gen_api_docs.py --check    # exit 1 if docs/api.md is stale

What is documented:

* every name that ``cugemm8/__init__.py`` imports with ``from .module import
  name`` (read from the file's syntax tree, in file order), grouped by the
  module that defines it;
* the public functions of ``cugemm8.interop`` (defined there, no leading
  underscore);
* the public functions of ``cugemm8.reference`` (those in its ``__all__``, in
  that order: the package re-exports them from its submodules).

For each: the signature (``inspect.signature``, with annotations printed as
written in the source) and the docstring verbatim (``inspect.getdoc``: the
text with its common indentation removed) in a fenced block.  Each group
starts with its module's docstring.

Needs no GPU and no CuPy (nothing is called, only imported and inspected),
and the output depends only on the source: functions come in source order
(``__all__`` order where a list of names is given), nothing depends on the
clock, the platform or dictionary order.
``tests/test_docs.py`` regenerates the text in memory and compares.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
#: Signatures longer than this are written one parameter per line.
WIDTH = 88


def _import_package():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("cugemm8")


# ----------------------------------------------------------------------------
# What to document
# ----------------------------------------------------------------------------

def init_exports() -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from .module import name`` in
    ``cugemm8/__init__.py``, in file order."""
    tree = ast.parse((ROOT / "cugemm8" / "__init__.py").read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                name = alias.asname or alias.name
                if not name.startswith("_"):
                    out.append((f"cugemm8.{node.module}", name))
    return out


def _source_line(obj) -> int:
    try:
        return inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return 0


def module_functions(module, names=None) -> list[str]:
    """Public functions defined in ``module``, in source order, or those of
    ``names`` that are functions, in the order of ``names`` (a package's
    ``__all__``: its functions come from several files, so line numbers do
    not order them)."""
    if names is not None:
        return [n for n in names if inspect.isfunction(getattr(module, n, None))]
    names = [n for n, v in vars(module).items()
             if not n.startswith("_") and inspect.isfunction(v)
             and v.__module__ == module.__name__]
    return sorted(names, key=lambda n: (_source_line(getattr(module, n)), n))


# ----------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------

def _annotation(ann) -> str:
    if isinstance(ann, str):          # postponed annotations: the source text
        return ann
    return inspect.formatannotation(ann)


def _param_text(p: inspect.Parameter) -> str:
    text = p.name
    if p.kind is p.VAR_POSITIONAL:
        text = "*" + text
    elif p.kind is p.VAR_KEYWORD:
        text = "**" + text
    if p.annotation is not p.empty:
        text += ": " + _annotation(p.annotation)
    if p.default is not p.empty:
        text += (" = " if p.annotation is not p.empty else "=") + repr(p.default)
    return text


def signature_text(name: str, obj) -> str:
    """``def name(...) -> ret`` (or ``class name(Base)``), wrapped past WIDTH."""
    if inspect.isclass(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
        return f"class {name}({bases})" if bases else f"class {name}"
    sig = inspect.signature(obj)
    parts = []
    prev = None
    for p in sig.parameters.values():
        if prev is p.POSITIONAL_ONLY and p.kind is not p.POSITIONAL_ONLY:
            parts.append("/")
        if p.kind is p.KEYWORD_ONLY and prev not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            parts.append("*")
        parts.append(_param_text(p))
        prev = p.kind
    if prev is inspect.Parameter.POSITIONAL_ONLY:
        parts.append("/")
    ret = ""
    if sig.return_annotation is not sig.empty:
        ret = " -> " + _annotation(sig.return_annotation)
    one_line = f"def {name}({', '.join(parts)}){ret}"
    if len(one_line) <= WIDTH:
        return one_line
    body = "".join(f"    {p},\n" for p in parts)
    return f"def {name}(\n{body}){ret}"


def _anchor(qualname: str) -> str:
    return qualname.replace(".", "-")


def _module_anchor(module: str) -> str:
    return "module-" + _anchor(module)


def _fenced(text: str, lang: str = "text") -> list[str]:
    if "```" in text:
        raise ValueError("a docstring contains ``` and cannot be fenced")
    return [f"```{lang}", text.rstrip(), "```", ""]


def _doc(obj) -> str:
    return inspect.getdoc(obj) or "(no docstring)"


def _entry(qualname: str, obj) -> list[str]:
    short = qualname.rsplit(".", 1)[1]
    return ([f'<a id="{_anchor(qualname)}"></a>', "", f"### `{qualname}`", ""]
            + _fenced(signature_text(short, obj), "python")
            + _fenced(_doc(obj)))


# ----------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------

def sections() -> list[tuple[str, str, object, list[tuple[str, object]]]]:
    """``(title, module name, module, [(qualified name, object), ...])`` per group."""
    pkg = _import_package()
    groups: dict[str, list[tuple[str, object]]] = {}
    for module, name in init_exports():
        groups.setdefault(module, []).append((f"cugemm8.{name}", getattr(pkg, name)))
    out = []
    for module, entries in groups.items():
        mod = importlib.import_module(module)
        out.append((f"`cugemm8`: names defined in `{module}`", module, mod, entries))
    for module, names in (("cugemm8.interop", None), ("cugemm8.reference", "__all__")):
        mod = importlib.import_module(module)
        selected = module_functions(mod, getattr(mod, names) if names else None)
        out.append((f"`{module}`", module, mod,
                    [(f"{module}.{n}", getattr(mod, n)) for n in selected]))
    return out


def render() -> str:
    """The full text of docs/api.md."""
    pkg = _import_package()
    secs = sections()
    lines = [
        "# cugemm8 API reference",
        "",
        "<!-- Generated by tools/gen_api_docs.py from the docstrings. Do not edit by hand: -->",
        "<!-- change the docstring, then run `python tools/gen_api_docs.py`. -->",
        "",
        "Generated from the docstrings by `tools/gen_api_docs.py`; `tests/test_docs.py` fails "
        "when this page and the docstrings disagree. It covers every function and class "
        "that `cugemm8/__init__.py` exports, and the public functions of `cugemm8.interop` "
        "and `cugemm8.reference`. Each entry gives the signature as `inspect.signature` "
        "reports it (annotations as written in the source), followed by the docstring "
        "verbatim. Each group starts with the docstring of its module. "
        "See [index.md](index.md) for the other pages.",
        "",
        "## Contents",
        "",
    ]
    for title, module, _, entries in secs:
        lines.append(f"- [{title}](#{_module_anchor(module)})")
        for qual, _obj in entries:
            lines.append(f"  - [`{qual.rsplit('.', 1)[1]}`](#{_anchor(qual)})")
    lines += ["", "## Package `cugemm8`", ""] + _fenced(_doc(pkg))
    for title, module, mod, entries in secs:
        lines += [f'<a id="{_module_anchor(module)}"></a>', "", f"## {title}", "",
                  f"Module docstring of `{module}`:", ""] + _fenced(_doc(mod))
        for qual, obj in entries:
            lines += _entry(qual, obj)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if docs/api.md differs from the docstrings")
    ap.add_argument("--output", type=Path, default=OUTPUT, help="where to write (default docs/api.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python tools/gen_api_docs.py", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
