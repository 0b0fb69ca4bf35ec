"""SQLAlchemy models, sessions and Alembic migrations."""

from shared.db.models import (
    AssignmentRow,
    AttemptRow,
    Base,
    BaselineRow,
    CalibrationRow,
    CampaignProblemRow,
    CampaignRow,
    ProblemRow,
    SolutionRow,
    TokenFailureRow,
    TraceRow,
    WebKeyRow,
    WebLoginRow,
    utcnow,
)
from shared.db.session import Database, migrate

__all__ = [
    "AssignmentRow", "AttemptRow", "Base", "BaselineRow", "CalibrationRow", "CampaignProblemRow", "CampaignRow", "Database",
    "ProblemRow", "SolutionRow", "TokenFailureRow", "TraceRow", "WebKeyRow", "WebLoginRow", "migrate", "utcnow",
]
