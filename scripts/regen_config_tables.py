"""Rewrite the config-key tables of docs/training.md and docs/distillation.md from the config dataclasses (the
docs tests tests/train/config/test_train_config.py::test_docs_config_tables_are_current and tests/train/test_distill.py fail until
this is run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.config import config_markdown  # noqa: E402
from rlvr.train.config import DistillConfig, EvalConfig, SFTConfig, TrainConfig  # noqa: E402
from rlvr.train.demo import DemoConfig  # noqa: E402


def main() -> None:
    path = ROOT / "docs" / "training.md"
    text = path.read_text()
    for cls in (TrainConfig, SFTConfig, EvalConfig, DemoConfig):
        # the table right under the heading that names the class
        pat = re.compile(rf"(### `[^`]+` \({cls.__name__}\)\n\n)(\|.*?\n)(?=\n|\Z)", re.S)
        text, n = pat.subn(lambda m, cls=cls: m.group(1) + config_markdown(cls), text)
        if n != 1:
            raise SystemExit(f"no table under a '({cls.__name__})' heading in {path}")
    path.write_text(text)
    print(f"rewrote 4 tables in {path}")
    path = ROOT / "docs" / "distillation.md"
    text = path.read_text()
    pat = re.compile(r"(## `rlvr distill` keys\n\n)(\|.*?\n)(?=\n|\Z)", re.S)
    text, n = pat.subn(lambda m: m.group(1) + config_markdown(DistillConfig), text)
    if n != 1:
        raise SystemExit(f"no table under the '`rlvr distill` keys' heading in {path}")
    path.write_text(text)
    print(f"rewrote the DistillConfig table in {path}")


if __name__ == "__main__":
    main()
