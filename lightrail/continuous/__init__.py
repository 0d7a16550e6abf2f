"""Continuous learning from production traffic: served sessions rewarded by feedback (`lightrail.store.sessions`)
become training rows (`learn`), a gated candidate becomes the served policy (`policies`).

    lightrail gateway serve --store prod.db --policies policies/ --record     # serve the current policy, record
    lightrail learn learn.yaml                                                  # rounds: learn, gate, promote
    lightrail rollback policies/                                                # serve the previous policy again
"""

from lightrail.continuous.policies import PolicyRegistry, PolicyVersion, PolicyWatcher

__all__ = ["PolicyRegistry", "PolicyVersion", "PolicyWatcher"]
