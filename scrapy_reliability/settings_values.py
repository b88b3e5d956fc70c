"""How one setting's value is read and checked: numbers within bounds, booleans,
dicts, lists of strings, and Scrapy's own lists (status codes, exception classes).

Each parser takes the setting's name and raises :class:`SettingError` naming it and
what it accepts, never a bare Python error. :mod:`scrapy_reliability.config` and
:mod:`scrapy_reliability.domain_limits` build on the underscore names; other modules
use the public ones.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

from scrapy.settings import BaseSettings

#: Upper bounds, far beyond any useful value and low enough that the arithmetic
#: done with them (timestamps, timers, SQL LIMITs) never overflows.
MAX_SECONDS = 86_400.0
MAX_AGE_SECONDS = 100 * 365 * 86_400.0
MAX_CLAIM_BATCH = 10_000
MAX_COUNT = 1_000_000
MAX_RATE = 1_000_000.0
MAX_DEDUP_CACHE = 100_000_000


class SettingError(ValueError):
    """A setting has a value that cannot work; the message names the setting."""


# -- one parser per kind of value; each failure names the setting and what it accepts --------


def nonnegative_float(
    settings: BaseSettings, name: str, default: float, *, maximum: float | None = None
) -> float:
    """A finite number, 0 or more (and at most ``maximum``)."""
    return _float_in(name, _raw(settings, name, default), "a number", 0.0, maximum)


def _positive_float(
    settings: BaseSettings, name: str, default: float, *, maximum: float | None = None
) -> float:
    """A finite number of seconds greater than 0 (and at most ``maximum``)."""
    raw = _raw(settings, name, default)
    accepts = _range("a number of seconds greater than 0", None, maximum)
    try:
        value = _float_in(name, raw, "a number of seconds", 0.0, maximum)
    except SettingError:
        raise _error(name, accepts, raw) from None  # one range, whatever was wrong
    if value == 0:
        raise _error(name, accepts, raw)
    return value


def positive_int(
    settings: BaseSettings, name: str, default: int, *, maximum: int | None = None
) -> int:
    """A whole number, 1 or more (and at most ``maximum``)."""
    return _int_in(name, _raw(settings, name, default), "a whole number", 1, maximum)


def whole_number(settings: BaseSettings, name: str, default: int, accepts: str) -> int:
    """A whole number of either sign (an int, an integral float, a string of digits)."""
    raw = _raw(settings, name, default)
    value = _whole_or_none(raw)
    if value is None:
        raise _error(name, accepts, raw)
    return value


def _nonnegative_int(
    settings: BaseSettings, name: str, default: int, *, maximum: int | None = None
) -> int:
    return _int_in(name, _raw(settings, name, default), "a whole number", 0, maximum)


def _raw(settings: BaseSettings, name: str, default: Any) -> Any:
    value = settings.get(name)
    return default if value is None else value


def _float_in(name: str, raw: Any, what: str, minimum: float, maximum: float | None) -> float:
    accepts = _range(what, minimum, maximum)
    value: float | None = None
    # bool is an int to Python, but True seconds is a mistake, not a number.
    if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        try:
            value = float(raw)
        except (OverflowError, ValueError):
            value = None
    elif isinstance(raw, str) and len(raw) <= 100:
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value) or value < minimum:
        raise _error(name, accepts, raw)
    if maximum is not None and value > maximum:
        raise _error(name, accepts, raw)
    return value


def _int_in(name: str, raw: Any, what: str, minimum: int, maximum: int | None) -> int:
    value = _whole_or_none(raw)
    if value is None or value < minimum or (maximum is not None and value > maximum):
        raise _error(name, _range(what, minimum, maximum), raw)
    return value


def _whole_or_none(raw: Any) -> int | None:
    """An int from an int, an integral float or a string of digits; else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, numbers.Integral):
        return int(raw)
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() else None  # False for nan and inf
    if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", raw):
        return int(raw)
    return None


def _range(what: str, minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f"{what}, {minimum:g} or more"
    if maximum is not None:
        return f"{what}, at most {maximum:g}"
    return what


#: What a boolean setting may be (Scrapy's getbool accepts these too).
_TRUE = frozenset({"1", "true"})
_FALSE = frozenset({"0", "false"})


def _bool(settings: BaseSettings, name: str, default: bool) -> bool:
    raw = settings.get(name)
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise _error(name, "True or False (or 1/0, 'true'/'false')", raw)


def _mapping(settings: BaseSettings, name: str, accepts: str) -> Mapping[Any, Any]:
    """A dict, or a JSON object in a string (as ``-s NAME='{...}'`` gives it)."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return {}
    if isinstance(raw, BaseSettings):
        return raw.copy_to_dict()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise _error(name, f"{accepts} (or the same as a JSON object)", raw) from None
    if not isinstance(raw, Mapping):
        raise _error(name, accepts, raw)
    return raw


def mapping_setting(settings: BaseSettings, name: str, accepts: str) -> Mapping[Any, Any]:
    """A dict setting (or a JSON object string); SettingError naming ``name`` otherwise."""
    return _mapping(settings, name, accepts)


def _str_list(raw: Any, name: str, accepts: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(isinstance(v, str) for v in raw):
        raise _error(name, accepts, raw)
    return tuple(raw)


def _shown(raw: Any, width: int = 80) -> str:
    try:
        text = repr(raw)
    except Exception:  # a value whose repr raises is still a wrong value
        text = f"<{type(raw).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def _error(name: str, accepts: str, raw: Any) -> SettingError:
    return SettingError(f"{name} must be {accepts} (got {_shown(raw)}).")


def bool_setting(settings: BaseSettings, name: str, default: bool) -> bool:
    """A boolean setting: True/False, 1/0 or 'true'/'false'; SettingError otherwise."""
    return _bool(settings, name, default)


def missing_extra(
    needs: str, package: str, extra: str, error: ImportError, instead: str
) -> SettingError:
    """The one line for an optional package that cannot be imported: what ``needs`` it
    (a setting, named), the import error, the extra that installs it and ``instead``,
    the other way out (e.g. "unset RELIABILITY_PROMETHEUS_PORT")."""
    return SettingError(
        f"{needs}, but {package} is not installed ({error}): "
        f"pip install 'scrapy-reliability[{extra}]', or {instead}."
    )


# -- Scrapy's own list settings, read as Scrapy reads them ------------------------------------


def listed(settings: BaseSettings, name: str, default: list[Any]) -> list[Any]:
    """A list setting as Scrapy's ``getlist`` reads it (``-s`` gives 'a,b'; '' is none)."""
    value = settings.get(name)
    if value is None:
        return list(default)
    if not value:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    raise _error(name, "a list", value)


def status_codes(settings: BaseSettings, name: str, default: list[int]) -> frozenset[int]:
    """HTTP status codes: a list, or ``'500,503'`` as ``-s`` gives it ('' for none)."""
    codes = set()
    for value in listed(settings, name, default):
        code = _whole_or_none(value)
        if code is None or not 100 <= code <= 599:
            raise _error(
                name,
                f"a list of HTTP status codes from 100 to 599, e.g. [500, 503] "
                f"(-s {name}=500,503; empty for none); one is {_shown(value)}",
                settings.get(name),
            )
        codes.add(code)
    return frozenset(codes)


def exception_classes(name: str, values: Iterable[Any]) -> tuple[type[BaseException], ...]:
    """Exception classes from classes or their import paths, as Scrapy loads them."""
    from scrapy.utils.misc import load_object

    loaded = []
    for value in values:
        try:
            obj = load_object(value) if isinstance(value, str) else value
        except (ImportError, ValueError, NameError, AttributeError) as exc:
            raise SettingError(
                f"{name} names {_shown(value)}, which cannot be imported ({exc}); give "
                "exception classes or their import paths, e.g. "
                "'twisted.internet.error.ConnectionLost'."
            ) from None
        if not (isinstance(obj, type) and issubclass(obj, BaseException)):
            raise _error(name, "a list of exception classes or their import paths", value)
        loaded.append(obj)
    return tuple(loaded)
