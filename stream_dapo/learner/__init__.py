"""The DeepSpeed learner: packing of groups into micro-batches, the training step, the service."""
