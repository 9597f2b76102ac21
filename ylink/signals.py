"""What YLink tells the layers above it (they connect receivers; YLink imports none of them)."""

from django.dispatch import Signal

# Sent after the commit that records a training run's result; `run` is the TrainingRun.
training_run_succeeded = Signal()
