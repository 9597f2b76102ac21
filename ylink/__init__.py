"""L3, the model toolchain: datasets, data pipelines, pretraining and fine-tuning runs."""
