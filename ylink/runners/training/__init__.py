"""The pieces `python -m ylink.runners.train` is made of: one module per kind of training, and the
parts they share (process group and device, checkpoints, data, the optimisation loop)."""
