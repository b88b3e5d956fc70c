"""One owner per state of the scheduling core: the claim buffer's fields are
written only in ``scheduling/claims.py``, the write pipeline's batch only in
``scheduling/writes.py``; the other parts call their methods. Read from the
source (an assignment or an append anywhere else fails here)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import PACKAGE
from tests.test_layers import _modules as _by_name

CLAIMS = PACKAGE / "scheduling" / "claims.py"
WRITES = PACKAGE / "scheduling" / "writes.py"
#: How the other parts name the claim buffer and the write pipeline.
CLAIMS_NAMES = {"claims", "_claims"}
WRITES_NAMES = {"writes", "_writes"}
#: Methods that change a container in place.
MUTATORS = {"append", "appendleft", "extend", "clear", "pop", "popleft", "remove", "update"}


def _fields(path: Path, cls: str) -> set[str]:
    """The instance attributes class ``cls`` of ``path`` assigns (``self.x = ...``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fields = set()
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = [t for target in sub.targets for t in _flat(target)]
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                fields |= {t.attr} if t.value.id == "self" else set()
    return fields


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _flat(e)]
    return [target]


def _owner_name(node: ast.expr) -> str | None:
    """``claims`` of ``claims.x``, ``self.claims.x`` and ``self._claims.x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _others(owner: Path) -> list[Path]:
    return [path for path in _by_name().values() if path != owner]


def _writes_outside(paths: list[Path], names: set[str], fields: set[str]) -> list[str]:
    """Where one of ``paths`` assigns one of ``fields`` of an object it calls one of
    ``names``, or changes one in place."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _flat(target)]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                targets = [node.func.value]
            for target in targets:
                # The field itself, or a part of it (claims.x.y = ..., writes.batch.z.append)
                t = target
                while isinstance(t, ast.Attribute | ast.Subscript):
                    inner = t.value
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr in fields
                        and _owner_name(inner) in names
                    ):
                        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
                        break
                    t = inner
    return found


def test_the_claim_buffers_fields_are_written_only_by_the_claim_buffer() -> None:
    fields = _fields(CLAIMS, "ClaimBuffer")
    assert {"ready", "wanted", "in_flight", "starved", "steered_limits"} <= fields
    assert _writes_outside(_others(CLAIMS), CLAIMS_NAMES, fields) == []


def test_the_write_pipelines_batch_is_written_only_by_the_pipeline() -> None:
    fields = _fields(WRITES, "WritePipeline")
    assert {"batch", "split", "in_flight", "requests", "claims"} <= fields
    assert _writes_outside(_others(WRITES), WRITES_NAMES, fields) == []


def test_the_check_finds_a_write_from_outside(tmp_path: Path) -> None:
    """The check above fails on the writes it exists to forbid."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(claims, self):\n"
        "    claims.wanted = True\n"
        "    self._claims.ready.append(1)\n"
        "    self.writes.batch.transitions.append(2)\n"
        "    claims.claim()\n"
        "    self.writes.transition(3)\n",
        encoding="utf-8",
    )
    claims = _writes_outside([probe], CLAIMS_NAMES, {"wanted", "ready"})
    writes = _writes_outside([probe], WRITES_NAMES, {"batch"})
    assert [f.split(":")[1] for f in claims] == ["2", "3"]
    assert [f.split(":")[1] for f in writes] == ["4"]


#: Private names read outside ``scheduling/engine.py`` that are no Scrapy internal.
NOT_SCRAPY = {
    ("_executor.py", "_handle"): "the database thread's own call objects",
    ("_executor.py", "_run"): "the database thread's own call objects",
    ("job_copy.py", "_mapping"): "SQLAlchemy's Row._mapping, its documented API",
    ("text_encodings.py", "_is_text_encoding"): "the standard library's codecs registry",
    ("scrapy_hooks.py", "_Slot"): "the check, before a crawl, that engine.py's internals exist",
}


def _private_uses(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of each private attribute ``path`` reads or writes on an object
    other than ``self``, ``cls``, ``super()`` or a module of this package, directly or
    through ``getattr``/``setattr``/``hasattr``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = {"self", "cls"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scrapy_reliab"):
            own |= {alias.asname or alias.name for alias in node.names}
    found = []
    for node in ast.walk(tree):
        base: ast.expr | None = None
        name = ""
        if isinstance(node, ast.Attribute):
            base, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base, name = node.args[0], node.args[1].value
        if base is None or not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(base, ast.Name) and base.id in own:
            continue
        if isinstance(base, ast.Call) and ast.unparse(base.func) == "super":
            continue
        if name.startswith("_reliability"):
            continue  # this package's own marks on a crawler or a handler
        found.append((node.lineno, name))
    return found


def test_scrapys_internals_are_touched_only_in_engine_py() -> None:
    engine = PACKAGE / "scheduling" / "engine.py"
    used = {
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for path in _others(engine)
        for line, name in _private_uses(path)
        if (path.name, name) not in NOT_SCRAPY
    }
    assert sorted(used) == []
    # engine.py itself does touch them (the check would pass on an empty package).
    assert {name for _, name in _private_uses(engine)} >= {"_get_exporter", "_fileloaded"}
