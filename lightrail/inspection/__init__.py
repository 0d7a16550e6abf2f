"""Reading what runs did, from a store: runs derived from rollout metadata, pages of rollouts, one rollout's
attempts and spans, and the failure digest (failed attempts grouped by cause).

Used by ``lightrail runs | rollouts | show | failures`` (`lightrail.inspection.cli`), the dashboard, the trainer's
``dev`` report and the algorithms' failure digest after each validation. It reads through the `Store` protocol
only, so it sits just above the store: everything that shows a run imports it, and it imports none of them.
"""
