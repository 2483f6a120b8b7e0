"""Words for the text rules: a segmenter for the languages written without spaces, whitespace elsewhere."""

import importlib.util

import pytest

pytest.importorskip("jieba")

from openalign.config import ConfigError
from openalign.data import words as words_module
from openalign.data.words import check_segmenters, segment, words


def test_languages_without_spaces_are_segmented_into_words():
    assert words("東京タワーの夜景", "ja") == ["東京", "タワー", "の", "夜景"]
    assert words("红色的自行车停在墙边", "zh") == ["红色", "的", "自行车", "停", "在", "墙边"]
    assert words("รถจักรยานสีแดงจอดอยู่ข้างกำแพง", "th") == ["รถจักรยาน", "สีแดง", "จอด", "อยู่", "ข้าง", "กำแพง"]
    # a segmented text's punctuation and spaces are not words; a Latin word inside it is one
    assert words("東京タワー、夜景！ photo", "ja") == ["東京", "タワー", "夜景", "photo"]


def test_other_languages_split_on_whitespace_as_the_rules_always_did():
    assert words("hand,  high 5\tfive", "en") == ["hand,", "high", "5", "five"]
    assert words("un café — crème", "fr") == ["un", "café", "crème"]  # a lone dash is no word
    assert words("東京タワーの夜景", None) == ["東京タワーの夜景"]  # language unknown: one word, as before


def test_segment_gives_words_only_where_the_language_needs_a_segmenter(monkeypatch):
    calls = []
    real = words_module.words
    monkeypatch.setattr(words_module, "words", lambda text, language: calls.append(text) or real(text, language))
    out = segment(["東京タワーの夜景", "a red bicycle", "東京タワーの夜景", "红色的自行车"], ["ja", "en", "ja", "zh"])
    assert out == ["東京 タワー の 夜景", None, "東京 タワー の 夜景", "红色 的 自行车"]
    assert calls == ["東京タワーの夜景", "红色的自行车"]  # each distinct text once


def test_a_missing_segmenter_is_one_sentence(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fugashi" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs fugashi: pip install 'openalign\[words\]' \(or give --no-words"):
        check_segmenters()


def test_jieba_s_dictionary_cache_is_kept_in_the_user_s_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    words_module.segmenter.cache_clear()
    try:
        assert words("自行车", "zh") == ["自行车"]
        assert list((tmp_path / "openalign" / "jieba").iterdir())  # not the shared temporary folder
    finally:
        words_module.segmenter.cache_clear()
