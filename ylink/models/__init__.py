from ylink.models.datasets import Dataset, DatasetVersion
from ylink.models.pipelines import PipelineRun
from ylink.models.training import Checkpoint, TrainingMetric, TrainingRun

__all__ = [
    "Checkpoint", "Dataset", "DatasetVersion", "PipelineRun", "TrainingMetric", "TrainingRun",
]
