"""CPU checks of the documentation: docs/api.md matches the docstrings, the
public ops' docstrings state shapes and errors, and every relative link in
docs/ and the README points at a file that exists."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "tools" / "gen_api_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_md_is_up_to_date():
    gen = _load_generator()
    expected = gen.render()
    current = (ROOT / "docs" / "api.md").read_text()
    assert current == expected, (
        "docs/api.md differs from the docstrings: run `python tools/gen_api_docs.py` and commit "
        "docs/api.md")


def test_generator_is_deterministic():
    gen = _load_generator()
    assert gen.render() == gen.render()


def test_api_md_covers_every_export():
    import cugemm8
    gen = _load_generator()
    exported = {name for _, name in gen.init_exports()}
    public = {n for n, v in vars(cugemm8).items()
              if not n.startswith("_") and (callable(v)) and not isinstance(v, type(cugemm8))}
    assert public <= exported, f"exported by cugemm8 but not documented: {sorted(public - exported)}"
    text = (ROOT / "docs" / "api.md").read_text()
    for name in exported:
        assert f"### `cugemm8.{name}`" in text


# ----------------------------------------------------------------------------
# Docstrings of the GEMM ops and quantisers: shapes ("[") and errors ("Raises")
# ----------------------------------------------------------------------------

OPS = (
    "cugemm8.gemm_fp8_fp8_bf16_nt",
    "cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "cugemm8.gemm_fp8",
    "cugemm8.per_token_cast_to_fp8",
    "cugemm8.per_block_cast_to_fp8",
    "cugemm8.interop.gemm_fp8_fp8_bf16_nt_jax",
    "cugemm8.interop.per_token_cast_to_fp8_jax",
    "cugemm8.interop.per_block_cast_to_fp8_jax",
)

#: Docstrings that miss a required part today (owned by other files; listed
#: here instead of edited).  strict: once a docstring is fixed, the XPASS
#: fails and the entry must be removed.
KNOWN_GAPS: dict = {}      # qualname -> reason, for docstrings not yet up to the rule


def _resolve(qualname: str):
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("qualname", [
    pytest.param(q, marks=pytest.mark.xfail(reason=KNOWN_GAPS[q], strict=True)) if q in KNOWN_GAPS else q
    for q in OPS])
def test_op_docstring_states_shapes_and_errors(qualname):
    import inspect
    doc = inspect.getdoc(_resolve(qualname)) or ""
    missing = [what for what, ok in (("shapes ('[')", "[" in doc), ("'Raises'", "Raises" in doc)) if not ok]
    assert not missing, f"{qualname}: docstring lacks {', '.join(missing)}"


# ----------------------------------------------------------------------------
# Links
# ----------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _doc_files():
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


@pytest.mark.parametrize("path", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    broken = []
    for target in _LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0]
        if file_part and not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{path.name}: broken links {broken}"


def test_design_figures_exist():
    text = (ROOT / "docs" / "design.md").read_text()
    figures = re.findall(r"\]\((figures/[^)]+\.png)\)", text)
    assert len(figures) >= 3
    for fig in figures:
        assert (ROOT / "docs" / fig).is_file(), fig
