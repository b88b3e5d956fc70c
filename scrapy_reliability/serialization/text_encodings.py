"""Which text encodings a stored request may name: those of Python's standard
library, found without importing anything a name could point to."""

from __future__ import annotations

import codecs
import encodings
import encodings.aliases
import functools
import pkgutil


@functools.lru_cache(maxsize=1)
def _text_codec_modules() -> frozenset[str]:
    # Listed, not imported. Codecs that are not text encodings (base64, zlib, ...)
    # and Windows-only ones are left out.
    modules = {info.name for info in pkgutil.iter_modules(encodings.__path__)}
    modules |= set(encodings.aliases.aliases.values())
    return frozenset(modules) - {
        "aliases",
        "base64_codec",
        "bz2_codec",
        "hex_codec",
        "quopri_codec",
        "uu_codec",
        "zlib_codec",
        "rot_13",
        "undefined",
        "mbcs",
        "oem",
    }


@functools.lru_cache(maxsize=256)
def _is_standard_text_codec(name: str) -> bool:
    """Whether ``name`` is a text codec of the standard library: only then is it
    looked up (which imports that codec's module of the ``encodings`` package)."""
    if not name.isascii() or len(name) > 64:
        return False
    # As codecs.lookup and encodings.search_function resolve a name.
    key = encodings.normalize_encoding(name.lower())
    aliases = encodings.aliases.aliases
    module = aliases.get(key) or aliases.get(key.replace(".", "_")) or key
    if module not in _text_codec_modules():
        return False
    try:
        info = codecs.lookup(name)
    except LookupError:
        return False
    return getattr(info, "_is_text_encoding", True) is not False
