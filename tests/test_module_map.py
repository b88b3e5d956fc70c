"""docs/architecture.md names every module of the package in its module map, and
names none that is gone; no two modules share a basename."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.test_layers import PACKAGE
from tests.test_layers import _modules as _by_name

REPO = PACKAGE.parent


def _modules() -> set[str]:
    """The package's modules as paths (no ``__init__.py``, no Alembic revision)."""
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in _by_name().values()
        if p.name != "__init__.py" and "versions" not in p.parts
    }


def _mapped() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w/]+\.py)` \|", section, flags=re.MULTILINE)


def test_the_module_map_names_every_module_once() -> None:
    mapped = _mapped()
    assert [m for m, n in Counter(mapped).items() if n > 1] == []
    assert sorted(_modules() - set(mapped)) == [], "modules missing from the module map"
    assert sorted(set(mapped) - _modules()) == [], "the module map names modules that are gone"


def test_no_two_modules_share_a_basename() -> None:
    names = Counter(Path(m).name for m in _modules())
    assert sorted(name for name, n in names.items() if n > 1) == []


def test_every_word_of_the_glossary_is_defined_once() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Words used in the code", 1)[1].split("\n## ", 1)[0]
    words = [w for w in re.findall(r"^\| ([^|]+?) \| ", section, flags=re.MULTILINE) if w != "Word"]
    assert len(words) >= 20
    assert len(words) == len(set(words))


def test_no_word_of_the_old_names_is_left_in_the_package() -> None:
    """ "alone" named one-statement writes (now single writes); ``rate_factor`` was a dead
    column (dropped by migration 0014, which with 0003 is where the name stays)."""
    left = [
        f"{path}:{n}"
        for path in _modules()
        for n, line in enumerate((PACKAGE / path).read_text(encoding="utf-8").splitlines(), 1)
        if "alone" in line.lower() or "rate_factor" in line
    ]
    assert left == []
