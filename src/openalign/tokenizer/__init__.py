"""WordPiece vocabulary trained on the corpus's own alt-texts (paper: 100k English, 250k multilingual).

Trained with Hugging Face `tokenizers` (BERT normalization and pre-tokenization), wrapped and saved as
a `transformers.BertTokenizerFast`, so a model directory loads with `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0 = AlignTextConfig.pad_token_id


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int = 64,
                    lowercase: bool = True) -> transformers.PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # BERT normalization: clean control chars, split CJK characters, lowercase and strip accents.
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1,
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    return transformers.BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=max_length, do_lower_case=lowercase,
    )


def load_tokenizer(path: Path) -> transformers.PreTrainedTokenizerFast:
    return transformers.AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
