"""MModel's reads, by area (`mmodel.selectors.registry`, …), always scoped to the caller."""
