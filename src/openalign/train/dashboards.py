"""The run's numbers on a dashboard (`train.report_to=tensorboard,wandb`, any subset; default none), beside
metrics.jsonl, which stays the record: the same rows go to each, on rank 0 only.

- tensorboard: event files in RUN/tensorboard, written by torch's `SummaryWriter` (the `tensorboard` package). The
  training rows' scalars under their metrics.jsonl names (loss, temperature, lr, pairs_per_s, ...), the held-out
  metrics under eval/NAME; the plots openalign draws (training.png) as images. A resumed run purges the events past
  the step it resumes from, as metrics.jsonl drops its rows past the checkpoint.
- wandb: the same, through `wandb.log`. It runs offline (files in RUN/wandb, `wandb sync` uploads them) unless the
  user has configured W&B: WANDB_MODE, WANDB_API_KEY, or a login in ~/.netrc.

Neither package is imported unless asked for; one that is missing is one sentence with the pip command, said before
any work (`check`).
"""

from __future__ import annotations

import math
import netrc
import os
from pathlib import Path

from openalign.config import Config, to_dict

def check(targets: tuple[str, ...]) -> None:
    """Each asked-for dashboard's package is installed (else one sentence with the pip command of the extra)."""
    from openalign.host import require_extra

    if targets:
        require_extra("dashboards", f"train.report_to={','.join(targets)}", tuple(targets))


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a metrics.jsonl row by name (nested ones as a/b), its step and flags left out."""
    out = {}
    for key, value in row.items():
        if key in ("step", "final"):
            continue
        if isinstance(value, dict):
            out |= scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[prefix + key] = float(value)
    return out


def wandb_configured() -> bool:
    """Whether the user has set W&B up (a mode, a key or a login); otherwise openalign's runs stay offline."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Dashboards:
    """The dashboards of `cfg.train.report_to` for the run in `out`, from `step` on (a resume's step)."""

    def __init__(self, cfg: Config, out: Path, step: int = 0):
        self.writer = self.wandb = None
        targets = cfg.train.report_to
        if "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=step or None)
        if "wandb" in targets:
            import wandb

            self.wandb = wandb.init(project="openalign", name=Path(out).name, dir=str(out), config=to_dict(cfg),
                                    id=_run_id(out), resume="allow",
                                    mode=None if wandb_configured() else "offline")

    def log(self, row: dict) -> None:
        """One metrics.jsonl row: a training row's scalars, or an evaluation's under eval/."""
        values = scalars(row)
        if not values:
            return
        step = int(row["step"])
        if self.writer:
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()
        if self.wandb:
            self.wandb.log(values, step=step)

    def image(self, name: str, path: Path, step: int) -> None:
        """A plot openalign drew (a PNG), at `step`."""
        if not Path(path).is_file():
            return
        if self.writer:
            import numpy as np
            from PIL import Image

            with Image.open(path) as picture:
                pixels = np.asarray(picture.convert("RGB"))
            self.writer.add_image(name, pixels, step, dataformats="HWC")
            self.writer.flush()
        if self.wandb:
            import wandb

            self.wandb.log({name: wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        if self.writer:
            self.writer.close()
        if self.wandb:
            self.wandb.finish()


def _run_id(out: Path) -> str:
    """One W&B run per run directory, so that a resumed run continues its own (kept in RUN/wandb_id)."""
    path = Path(out) / "wandb_id"
    if not path.is_file():
        path.write_text(os.urandom(8).hex() + "\n")
    return path.read_text().strip()
