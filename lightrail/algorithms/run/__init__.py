"""The core a training stage composes (`GRPO`, `SFT`, `APO`, the continuous-learning gate) instead of writing its own
run loop: `folder` (the run folder: resume, checkpoints, metrics, report), `loop` (the step cadence), `progress` (the
step bar) and `policy` (serving the policy, validating it, reading rollouts' spans)."""
