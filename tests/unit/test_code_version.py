"""code_version_closure: a stage's code version covers every project module it imports, however indirectly."""

import textwrap

import pytest

from infra.artifacts import code_version_closure, import_closure


def test_the_sources_stage_closure_holds_its_indirect_imports():
    closure = import_closure("tasks.sources.stage")
    # tasks.sources.stage -> tasks.sources.deb -> infra.archives: outside the package the stage lists
    assert "infra.archives" in closure
    assert {"tasks", "tasks.sources", "tasks.sources.stage", "tasks.sources.deb"} <= set(closure)
    assert closure == sorted(closure)
    assert not any(m.startswith("flows") for m in closure)
    assert set(import_closure("tasks.sources")) >= set(closure)  # a package counts with all its modules


def _tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


def test_a_one_line_change_in_an_indirect_helper_changes_only_its_importers(tmp_path):
    _tree(tmp_path, {
        "cvpkg/__init__.py": "",
        "cvpkg/a.py": """
            def run():
                from cvpkg.b import helper  # imported lazily, inside the function
                return helper()
            """,
        "cvpkg/b.py": """
            from cvpkg.util import base

            def helper():
                return base() + 1
            """,
        "cvpkg/c.py": "X = 1\n",
        "cvpkg/util/__init__.py": "from cvpkg.util.core import base\n",
        "cvpkg/util/core.py": "def base():\n    return 1\n",
        "cvpkg/typed.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from cvpkg import c
            """,
    })
    scope = dict(packages=("cvpkg",), search_path=(tmp_path,))
    assert import_closure("cvpkg.a", **scope) == ["cvpkg", "cvpkg.a", "cvpkg.b", "cvpkg.util", "cvpkg.util.core"]
    assert import_closure("cvpkg.typed", **scope) == ["cvpkg", "cvpkg.typed"]  # TYPE_CHECKING imports never run
    before = {m: code_version_closure(m, **scope) for m in ("cvpkg.a", "cvpkg.c", "cvpkg.typed")}
    assert before == {m: code_version_closure(m, **scope) for m in before}  # deterministic

    b = tmp_path / "cvpkg/b.py"
    b.write_text(b.read_text().replace("base() + 1", "base() + 2"))  # one line of the lazily imported helper
    after_b = {m: code_version_closure(m, **scope) for m in before}
    assert after_b["cvpkg.a"] != before["cvpkg.a"]
    assert after_b["cvpkg.c"] == before["cvpkg.c"] and after_b["cvpkg.typed"] == before["cvpkg.typed"]

    (tmp_path / "cvpkg/util/core.py").write_text("def base():\n    return 2\n")  # two imports away, via a package
    after_core = {m: code_version_closure(m, **scope) for m in before}
    assert after_core["cvpkg.a"] != after_b["cvpkg.a"]
    assert after_core["cvpkg.c"] == before["cvpkg.c"]


def test_a_module_outside_the_packages_is_refused():
    with pytest.raises(ValueError, match="not in the import graph"):
        import_closure("tasks.no_such_module")
    with pytest.raises(ValueError, match="at least one"):
        code_version_closure()

