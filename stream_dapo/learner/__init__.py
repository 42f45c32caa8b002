"""The DeepSpeed learner.

- `stream_dapo.learner.packing`: groups -> length-sorted, padded micro-batches under a token budget.
- `stream_dapo.learner.trainer`: `Learner`, one DAPO optimizer step per mini-batch on a DeepSpeed
  engine; checkpoints, weight gathering, HF export.
- `stream_dapo.learner.service`: the `stream-dapo learner` service (`LearnerService`).

Nothing is imported here, so `stream-dapo learner --help` does not load torch or DeepSpeed.
"""
