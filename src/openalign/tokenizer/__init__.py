"""WordPiece vocabulary trained on the corpus's own alt-texts (paper: 100k English, 250k multilingual).

Trained with Hugging Face `tokenizers` (BERT normalization and pre-tokenization), wrapped and saved as
a `transformers.BertTokenizerFast`, so a model directory loads with `AutoTokenizer.from_pretrained`.

Deterministic: the same texts give the same vocabulary and ids in every run. `tokenizers`' trainer alone
does not (huggingface/tokenizers#1794): it numbers the continuing-subword pieces (`##a`) in hash-map
order, and those numbers break ties between equally frequent merges. We number every `##c` the corpus can
need ourselves, in sorted order, before training (as extra special tokens of the trainer), then rebuild
the tokenizer from the trained vocabulary with only BERT's five special tokens.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Iterable

import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from openalign.config import ConfigError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0 = AlignTextConfig.pad_token_id
PREFIX = "##"


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    # BERT normalization: clean control chars, split CJK characters, lowercase and strip accents.
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    return tok


def continuing_pieces(texts: list[str], tok: Tokenizer) -> list[str]:
    """`##c` for every character that follows another inside a pre-tokenized word, sorted."""
    chars: set[str] = set()
    for text in texts:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            chars.update(word[1:])
    return [PREFIX + c for c in sorted(chars)]


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int = 64,
                    lowercase: bool = True) -> transformers.PreTrainedTokenizerFast:
    texts = list(texts)
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                        special_tokens=SPECIAL_TOKENS + continuing_pieces(texts, tok))
    tok.train_from_iterator(texts, trainer)
    # the same vocabulary, without the pieces' special-token status (they must decode and count as text)
    tok = _bert_pipeline(Tokenizer(models.WordPiece(tok.get_vocab(with_added_tokens=False), unk_token="[UNK]")),
                         lowercase)
    tok.add_special_tokens(SPECIAL_TOKENS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return transformers.BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=max_length, do_lower_case=lowercase,
    )


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")  # fast, WordPiece, BPE (CLIP), SentencePiece (SigLIP, XLM-R, Gemma)


def check_tokenizer_dir(path) -> Path:
    """A local tokenizer directory, or one sentence: a path never falls through to a model hub."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"no tokenizer directory at {path}; give a directory with tokenizer.json (a run's "
                          "`tokenizer` or `model` folder, or `openalign tokenizer --out DIR`)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{path} holds no tokenizer ({', '.join(TOKENIZER_FILES[:-1])} or {TOKENIZER_FILES[-1]})")
    return path


def load_tokenizer(path: Path) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer in a local directory; damaged files (a tokenizer.json cut short, a vocabulary that is not text)
    are one sentence, not transformers' or the tokenizers library's traceback."""
    path = check_tokenizer_dir(path)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - json, tokenizers (a bare Exception), sentencepiece, OSError, ValueError
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"{path}'s tokenizer files are damaged ({reason}); copy them again from the model's "
                          "directory, or save the tokenizer again") from None
