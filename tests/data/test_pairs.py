"""data/pairs.py's keys: a list at a time, against hashlib called once a row (the definition)."""

import hashlib

from openalign.data.pairs import blake, pair_uid, pair_uids, url_keys

URLS = ["https://a.example/x.jpg", "http://b.example/caf\u00e9 \u6771\u4eac.png", "http://c.example/\ud800?half", ""]


def test_url_keys_are_the_blake2b_of_each_url_s_utf8_a_lone_surrogate_kept_as_its_bytes():
    expected = [hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest() for url in URLS]
    assert url_keys(URLS) == expected == [blake(url.encode("utf-8", "surrogatepass")) for url in URLS]
    assert url_keys(URLS[:1]) == expected[:1] and url_keys([]) == []
    assert len(set(expected)) == len(URLS)


def test_pair_uids_are_the_blake2b_of_key_tab_text():
    keys, texts = url_keys(URLS[:3]), ["a dog", "caf\u00e9", "a dog"]
    expected = [hashlib.blake2b(f"{k}\t{t}".encode(), digest_size=16).hexdigest() for k, t in zip(keys, texts)]
    assert pair_uids(keys, texts) == expected == [pair_uid(k, t) for k, t in zip(keys, texts)]
    assert pair_uids(iter(keys), iter(texts)) == expected  # any iterables, as the stages hand them
