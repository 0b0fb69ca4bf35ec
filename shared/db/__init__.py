"""SQLAlchemy models, sessions and Alembic migrations."""

from shared.db.models import (
    AssignmentRow,
    AttemptRow,
    Base,
    CampaignProblemRow,
    CampaignRow,
    ProblemRow,
    SolutionRow,
    TraceRow,
    utcnow,
)
from shared.db.session import Database, migrate

__all__ = [
    "AssignmentRow", "AttemptRow", "Base", "CampaignProblemRow", "CampaignRow", "Database",
    "ProblemRow", "SolutionRow", "TraceRow", "migrate", "utcnow",
]
