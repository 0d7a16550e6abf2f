"""Training and development runs: `Trainer` (dev and fit), the `Algorithm` protocol, and `DevReport`.

See `lightrail.trainer.trainer` for the processes a session starts and `lightrail.algorithms.protocol` for how
GRPO, APO and SFT plug in.
"""

from lightrail.algorithms.protocol import Algorithm, TrainerContext
from lightrail.inspection.report import DevReport, FailureGroup, RolloutRow, message_pattern
from lightrail.trainer.result import FitResult
from lightrail.trainer.trainer import StoreServerProcess, Trainer, as_tasks

__all__ = [
    "Algorithm",
    "DevReport",
    "FailureGroup",
    "FitResult",
    "RolloutRow",
    "StoreServerProcess",
    "Trainer",
    "TrainerContext",
    "as_tasks",
    "message_pattern",
]
