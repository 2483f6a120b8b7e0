import transformers

from openalign.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_tokenizer

TEXTS = ["grinning face with big eyes", "palm down hand: light skin tone", "Café au lait, à la carte"] * 20


def test_trained_vocabulary_is_bert_style_and_reloads_as_bert_tokenizer(tmp_path):
    tok = train_tokenizer(TEXTS, vocab_size=120, max_length=16)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    ids = tok("Grinning FACE")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.convert_ids_to_tokens(ids[1:-1]) == ["grinning", "face"]  # lowercased BERT normalization
    assert tok.tokenize("cafe") == tok.tokenize("Café")  # accents stripped
    tok.save_pretrained(tmp_path)
    again = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    assert again("palm down hand")["input_ids"] == tok("palm down hand")["input_ids"]
    assert load_tokenizer(tmp_path)("shoo")["input_ids"] == tok("shoo")["input_ids"]


def test_padding_and_truncation_to_max_length():
    tok = train_tokenizer(TEXTS, vocab_size=120, max_length=8)
    batch = tok(["face", "palm down hand light skin tone grinning face big eyes"], padding="longest",
                truncation=True, max_length=8)
    assert [len(x) for x in batch["input_ids"]] == [8, 8]
    assert batch["input_ids"][0][3:] == [0] * 5 and batch["attention_mask"][0][:3] == [1, 1, 1]


def test_training_is_deterministic_and_pieces_stay_ordinary_tokens():
    # tokenizers' trainer alone gives a different vocabulary almost every time on these texts
    # (huggingface/tokenizers#1794: ties broken by hash-map order); ours gives one
    texts = ["grinning face with big eyes", "palm down hand: light skin tone", "Café au lait, à la carte",
             "purple hexagon icon", "brown heart drawing"] * 3
    vocabularies = {tuple(sorted(train_tokenizer(texts, vocab_size=90).get_vocab().items())) for _ in range(20)}
    assert len(vocabularies) == 1
    tok = train_tokenizer(texts, vocab_size=90)
    assert sorted(tok.all_special_tokens) == sorted(SPECIAL_TOKENS)  # the ## pieces are not special
    ids = tok("purplish hexagons")["input_ids"]
    assert any(t.startswith("##") for t in tok.convert_ids_to_tokens(ids))
    assert tok.decode(ids, skip_special_tokens=True) == "purplish hexagons"
