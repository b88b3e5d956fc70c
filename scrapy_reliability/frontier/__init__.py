"""The frontier storage layer.

It knows nothing of Scrapy objects: it stores JSON payloads and plain fields, and
every state transition is one transaction guarded by the row's claim token.
"""

from scrapy_reliability.frontier.errors import (
    FrontierError,
    FrontierLocked,
    FrontierUnavailable,
    JobFinished,
    JobMismatch,
    LeaseLost,
    SchemaError,
    SchemaOutdated,
    SchemaTooNew,
    StorageLost,
)
from scrapy_reliability.frontier.store import (
    Claimed,
    ClaimResult,
    ClaimSpec,
    DeadItem,
    DomainUpdate,
    Frontier,
    Job,
    NewRequest,
    Outcome,
    Refusal,
    Transition,
    WriteBatch,
    WriteResult,
)

__all__ = [
    "ClaimResult",
    "ClaimSpec",
    "Claimed",
    "DeadItem",
    "DomainUpdate",
    "Frontier",
    "FrontierError",
    "FrontierLocked",
    "FrontierUnavailable",
    "Job",
    "JobFinished",
    "JobMismatch",
    "LeaseLost",
    "NewRequest",
    "Outcome",
    "Refusal",
    "SchemaError",
    "SchemaOutdated",
    "SchemaTooNew",
    "StorageLost",
    "Transition",
    "WriteBatch",
    "WriteResult",
]
