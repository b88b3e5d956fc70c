"""A poor man's sampling profiler (py-spy is not installed): runs ``scrapy.cmdline`` in
this process with a thread that samples every thread's Python stack every ``interval``
seconds and, at exit, writes per-thread counts of (innermost frame) and (innermost frame
inside a chosen package) to ``STACK_SAMPLER_OUT`` (JSON).

    STACK_SAMPLER_OUT=/tmp/s.json python bench/stack_sampler.py crawl queued -a ...

Samples show where each thread *is*, not whether it holds the GIL: a thread waiting in
``epoll``/``queue.get`` is counted at that line.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import threading
import time
from typing import Any

INTERVAL = float(os.environ.get("STACK_SAMPLER_INTERVAL", "0.005"))
FOCUS = tuple(os.environ.get("STACK_SAMPLER_FOCUS", "scrapy_reliability,sqlalchemy").split(","))


def _where(frame: Any) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno}({code.co_name})"


def main() -> None:
    out = os.environ.get("STACK_SAMPLER_OUT", "stack_sampler.json")
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    focus: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stacks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stop = threading.Event()

    def sample() -> None:
        me = threading.get_ident()
        while not stop.wait(INTERVAL):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                name = name.split("_")[0] if name.startswith("reliability-db") else name
                counts[name][_where(frame)] += 1
                chain = []
                f = frame
                hit = None
                while f is not None:
                    fn = f.f_code.co_filename
                    if hit is None and any(p and p in fn for p in FOCUS):
                        hit = _where(f)
                    if "scrapy_reliability" in fn or "/scrapy/" in fn:
                        chain.append(f"{os.path.basename(fn)}:{f.f_lineno}({f.f_code.co_name})")
                    f = f.f_back
                focus[name][hit or "-"] += 1
                stacks[name[:20]][" < ".join(chain[:6])] += 1

    def dump() -> None:
        stop.set()
        data = {
            name: {
                "samples": sum(c.values()),
                "innermost": c.most_common(40),
                "innermost_in_focus": focus[name].most_common(40),
                "scrapy_chains": stacks[name[:20]].most_common(25),
            }
            for name, c in counts.items()
        }
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"interval": INTERVAL, "started": started, "threads": data}, fh, indent=1)

    started = time.time()
    threading.Thread(target=sample, name="stack-sampler", daemon=True).start()
    atexit.register(dump)
    from scrapy.cmdline import execute

    sys.argv = ["scrapy", *sys.argv[1:]]
    execute()


if __name__ == "__main__":
    main()
