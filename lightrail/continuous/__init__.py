"""Continuous learning from production traffic: served sessions rewarded by feedback (`lightrail.store.sessions`)
become training rows (`learn`), a gated candidate becomes the served policy (the policies folder and its watcher
live with the engine that serves them: `lightrail.engine.promotions`).

    lightrail gateway serve --store prod.db --policies policies/ --record     # serve the current policy, record
    lightrail learn learn.yaml                                                  # rounds: learn, gate, promote
    lightrail rollback policies/                                                # serve the previous policy again
"""

from lightrail.engine.promotions import PolicyRegistry, PolicyVersion, PolicyWatcher

__all__ = ["PolicyRegistry", "PolicyVersion", "PolicyWatcher"]
