"""Training's data, made ready before a model exists: `prepare(cfg) -> Data` (train/prepared.py).

    openalign train ...   ->   prepare(cfg)   ->   train.trainer.train(data)

`prepare` checks what can be checked before any work (`check_before_work`: the run directory, the config, the
tokenizer, the checkpoint to resume), starts the run directory afresh unless the run resumes, and resolves the
config's data: the built-in corpora built where missing and their shards listed, Karpathy layouts sharded, the
keep index of data.keep (or data.dedup_heldout's) built, the tokenizer loaded (data.tokenizer, or the one this run
trained before) or trained on the training texts into RUN/tokenizer; the text tower's vocabulary is sized to it.
Under torchrun rank 0 builds what is missing and the others then read it (`distributed.main_first`). It is the
only caller of the corpora's resolution (`shards`: the web demo asks it too); the training loop imports none of
this.

`train(cfg)` here is both steps under the run directory's lock: what `openalign train` runs, and `openalign.train`.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import torch

from openalign import config as config_lib
from openalign import distributed
from openalign.config import Config, ConfigError
from openalign.corpora import heldout_keep, resolve_data, source_eval_shards
from openalign.data import tars
from openalign.data.loader import templated
from openalign.data.pairs import build_keep_index
from openalign.data.seeds import stable_seed
from openalign.eval.tasks import HELD_OUT_TASKS
from openalign.tokenizer import check_tokenizer_dir, load_tokenizer, train_tokenizer
from openalign.train import dashboards, trainer
from openalign.train.prepared import Data

__all__ = ["Data", "check_before_work", "prepare", "shards", "train"]


def train(cfg: Config, resume: bool = False, progress: bool = True, overwrite: bool = False) -> trainer.TrainResult:
    """Prepare `cfg`'s data, then train it into cfg.out (rank 0 owns it for both: a second run there refuses in one
    sentence)."""
    with trainer.run_lock(cfg.out):
        data = prepare(cfg, resume, progress, overwrite)
        return trainer.train(data, resume, progress)


def prepare(cfg: Config, resume: bool = False, progress: bool = True, overwrite: bool = False) -> Data:
    """The run's data, ready to train on (the module's docstring says what it does)."""
    with trainer.run_lock(cfg.out):
        check_before_work(cfg, resume, overwrite)
        out = Path(cfg.out)
        layout = distributed.init(distributed.resolve_device(cfg.train.device, distributed.from_env().local_rank).type)
        if layout.main:
            out.mkdir(parents=True, exist_ok=True)
            for name in trainer.RUN_FILES if not resume else ():  # what an earlier run left: its tokenizer, trained on
                if (out / name).is_dir():                           # other data perhaps; its log
                    shutil.rmtree(out / name)
                else:
                    (out / name).unlink(missing_ok=True)
        progress = progress and layout.main
        # rank 0 builds what is missing (a built-in corpus, Karpathy shards, the tokenizer); the others then read it
        train_shards, eval_shards = shards(cfg, progress, layout)
        keep = distributed.main_first(layout, lambda main: training_keep(cfg, progress and main))
        tokenizer = distributed.main_first(layout, lambda main: prepare_tokenizer(cfg, train_shards, out, keep))
        # The trained vocabulary may be smaller than asked for (small corpora): size the embedding to it.
        # A model we start from keeps its own embedding table (it may be padded beyond its tokenizer).
        if not cfg.model.init_from:
            text = dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, text=text))
        return Data(cfg, train_shards, eval_shards, tokenizer, source_eval_shards(cfg.data), keep)


def shards(cfg: Config, progress: bool = True, layout: distributed.Dist = distributed.Dist()
           ) -> tuple[list[str], list[str]]:
    """The config's training and held-out shards: a built-in corpus built where it is missing (or outdated), a
    Karpathy layout sharded, shards as given (corpora.resolve_data); rank 0 first, then the others read them."""
    return distributed.main_first(layout, lambda main: resolve_data(cfg.data, progress and main))


def check_before_work(cfg: Config, resume: bool, overwrite: bool = False) -> None:
    """Everything a run needs that can be checked before any work (building a corpus, training a tokenizer)."""
    earlier = [name for name in (trainer.CHECKPOINT, trainer.METRICS) if (Path(cfg.out) / name).exists()]
    if earlier and not resume and not overwrite:
        raise ConfigError(f"{cfg.out} holds a run already ({', '.join(earlier)}); continue it with --resume, start it "
                          "again with --overwrite (its checkpoint, log, tokenizer and model are replaced), or choose "
                          "another --out")
    world = distributed.from_env().world
    config_lib.check(cfg, world=world)
    dashboards.check(cfg.train.report_to)
    unknown = [t for t in cfg.eval.tasks if t not in HELD_OUT_TASKS]
    if unknown:
        raise ConfigError(f"eval.tasks: {unknown[0]!r} is not a held-out task; choose from {', '.join(HELD_OUT_TASKS)} "
                          "(the others run on a saved model: `openalign eval`)")
    if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={cfg.train.device} but this machine has no CUDA device PyTorch can use; "
                          "use train.device=auto or cpu")
    if cfg.data.tokenizer:
        check_tokenizer_dir(cfg.data.tokenizer)
    if resume:
        trainer.read_checkpoint(Path(cfg.out) / trainer.CHECKPOINT, check_only=True)


def training_keep(cfg: Config, progress: bool) -> str:
    """The keep index the training samples are read through: data.keep's, or data.dedup_heldout's ('' for
    neither); built once into data.data_dir, then reused."""
    if cfg.data.keep:
        return build_keep_index(list(cfg.data.keep), Path(cfg.data.data_dir))
    return heldout_keep(cfg.data, progress)


def prepare_tokenizer(cfg: Config, train_shards: list[str], out: Path, keep: str = ""):
    """data.tokenizer's, else the one this run trained before (RUN/tokenizer), else one trained now on the training
    texts (data.fraction, the keep index, the text templates as training will see them) and saved there."""
    saved = out / "tokenizer"
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    if (saved / "tokenizer.json").is_file():
        return load_tokenizer(saved)
    counter: dict = {}
    texts = tars.all_texts(train_shards, cfg.data.fraction, counter, keep=keep)
    if cfg.data.text_templates:  # the texts as training will see them, so the templates' words are whole pieces
        rng = random.Random(stable_seed(cfg.seed, "tokenizer templates"))
        texts = (templated(text, cfg.data.text_templates, rng) for text in texts)
    tokenizer = train_tokenizer(texts, cfg.model.text.vocab_size, cfg.model.text.max_length)
    tokenizer.save_pretrained(saved)
    if counter.get("skipped"):
        print(f"tokenizer: skipped {tars.skip_summary(counter)} unusable training samples")
    return tokenizer
