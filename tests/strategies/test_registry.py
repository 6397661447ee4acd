"""The one Registry type: decorator, direct and lazy entries, package discovery, errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from strategies.wire.errors import ConfigError
from strategies.wire.registry import Registry, import_path


class ToyError(ConfigError):
    """The branch of the toy registry."""


def test_entries_join_by_decorator_directly_and_by_dotted_path():
    toys: Registry[object] = Registry("toy", "toy.kind", error=ToyError)

    @toys.register("b")
    class B:
        pass

    toys.add("a", 1)
    toys.add_path("c", "textwrap:dedent")
    assert toys.names() == ["a", "b", "c"] and "c" in toys and "d" not in toys
    assert toys.get("b") is B and toys.get("c") is textwrap.dedent
    assert toys.entries() == {"a": 1, "b": B, "c": textwrap.dedent}
    assert toys.find("d") is None


def test_an_unknown_name_names_the_key_and_the_known_names():
    toys: Registry[int] = Registry("toy", "toy.kind", error=ToyError)
    toys.add("one", 1)
    with pytest.raises(ToyError, match=r"run config key 'toy.kind' must be one of \['one'\] "
                                       r"\(a toy\), got 'two'"):
        toys.get("two")


def test_a_name_registered_twice_is_refused():
    toys: Registry[int] = Registry("toy", "toy.kind", error=ToyError)
    toys.add("one", 1)
    with pytest.raises(ToyError, match="toy 'one' registered twice"):
        toys.add_path("one", "textwrap:dedent")


def test_create_calls_the_entry_and_names_it_on_bad_options():
    toys: Registry[type] = Registry("toy", "toy.kind", error=ToyError)

    @toys.register("pair")
    class Pair:
        def __init__(self, a: int, b: int = 0) -> None:
            self.total = a + b

    assert toys.create("pair", a=1, b=2).total == 3
    with pytest.raises(ToyError, match="toy 'pair': .*unexpected keyword argument 'c'"):
        toys.create("pair", a=1, c=3)


def test_a_dotted_path_is_imported_only_when_looked_up():
    script = textwrap.dedent("""
        import sys
        from strategies.wire.registry import Registry
        toys = Registry("toy", "toy.kind")
        toys.add_path("sax", "xml.sax.saxutils:escape")
        assert toys.names() == ["sax"] and "xml.sax.saxutils" not in sys.modules
        assert toys.get("sax")("<") == "&lt;" and "xml.sax.saxutils" in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True)


def test_a_package_registry_imports_every_module_dropped_into_it(tmp_path, monkeypatch):
    package = tmp_path / "dropins"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from strategies.wire.registry import Registry\n"
        "TOYS = Registry('toy', 'toy.kind', package='dropins')\n")
    for name in ("first", "second"):
        (package / f"{name}.py").write_text(f"from dropins import TOYS\nTOYS.add('{name}', 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from dropins import TOYS  # noqa: PLC0415 - written by this test

    assert TOYS.names() == ["first", "second"]
    for module in ("dropins", "dropins.first", "dropins.second"):
        monkeypatch.delitem(sys.modules, module)


def test_a_dotted_path_must_name_module_and_attribute():
    with pytest.raises(ConfigError, match="'textwrap' must read 'package.module:attribute'"):
        import_path("textwrap")


def test_a_path_that_fails_to_import_stays_registered_and_fails_again():
    toys: Registry[object] = Registry("toy", "toy.kind")
    toys.add_path("gone", "strategies.no_such_module:THING")
    for _ in range(2):
        with pytest.raises(ModuleNotFoundError):
            toys.get("gone")
    assert toys.names() == ["gone"]
