"""The linger rules' view of a write pipeline (``batches.Moment``): each value read
from the pipeline and its claim buffer when a rule asks for it. One per pipeline,
built once: the rules are asked on every change buffered while a write lingers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_reliability.scheduling.batches import claim_inputs

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.writes import WritePipeline


class PipelineMoment:
    """``batches.Moment`` of ``writes``, now."""

    __slots__ = ("_writes",)

    def __init__(self, writes: WritePipeline) -> None:
        self._writes = writes

    @property
    def now(self) -> float:
        return self._writes.ctx.clock.seconds()

    @property
    def write_linger(self) -> float:
        return self._writes.ctx.config.write_linger

    @property
    def split(self) -> bool:
        return bool(self._writes.split)

    @property
    def has_work(self) -> bool:
        return bool(self._writes.claims.ready)

    @property
    def next_claim_at(self) -> float:
        return self._writes.claims.next_claim_at()

    @property
    def max_transitions(self) -> int:
        return self._writes.urgent_transitions

    def paced(self) -> bool:
        return self._writes.claims.holds_for_later()

    def claim_after(self) -> float:
        writes = self._writes
        return writes.claims.claim_after(*claim_inputs(writes.batch, writes.lease_domain))
