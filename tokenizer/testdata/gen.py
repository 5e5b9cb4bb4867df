#!/usr/bin/env python3
"""Makes the tokenizer fixtures: small tokenizer.json files in the shapes of
GPT-2, Llama 3 and Qwen2 (byte-level BPE) and of Llama 2 and Mistral
(SentencePiece-style BPE with byte fallback and the ▁ metaspace), and the
ids an independent reference tokenizer gives for a set of strings.

The reference is written here from the published algorithms, not from
kvmesh's code: OpenAI's GPT-2 encoder (bytes_to_unicode, the regex split,
the bpe() merge loop over ranked pairs) and the Hugging Face tokenizers
pipeline (added tokens matched first, then normalizer, pre-tokenizer, model;
SentencePiece's byte fallback to <0xXX>). Merges are learned by a tiny BPE
trainer on a fixed corpus. Run with Debian's python3 and python3-regex:

    python3 tokenizer/testdata/gen.py tokenizer/testdata
"""
import collections
import json
import os
import sys

import regex

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CORPUS = """The quick brown fox jumps over the lazy dog. It's the dog's bed; they'll say we've seen it.
Hello world! Hello, hello, HELLO. Numbers: 12345 and 2024-11-28, 3.14159.
    Indented code: def main():\n\treturn 0\n\nprint("done")
Über naïve café — déjà vu. 日本語のテキスト。 Привет мир.
The the the there then they their them these those other another mother.
""" * 3

TESTS = [
    "Hello world",
    "hello world, HELLO WORLD",
    " leading space",
    "trailing space ",
    "two  spaces and   three",
    "tabs\tand\nnewlines\n\n\nend",
    "line\r\nbreaks\r\n",
    "It's, I'LL, we've, they'd, DON'T",
    "12345 678 9 0",
    "3.14159 and 2024-11-28",
    "Über naïve café — déjà vu",
    "日本語のテキスト",
    "emoji 🦙 and 🤗!",
    "rare chars ẞ ǅ ₪ 𝔘",
    "def main():\n    return 0\n",
    "   ",
    "\n",
    "a",
    "quick brown fox jumps over the lazy dog",
    "mixed<SPECIAL>inside<SPECIAL>",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def get_pairs(word):
    return set(zip(word, word[1:]))


def bpe(token, ranks):
    """OpenAI's GPT-2 encoder.bpe: merge the lowest-ranked pair until none is left."""
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return list(word)
    while True:
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new_word.extend(word[i:])
                break
            new_word.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)


def train(words, base, n_merges):
    """A tiny BPE trainer: merges the most frequent pair, n_merges times."""
    counts = collections.Counter(tuple(w) for w in words)
    merges, vocab = [], list(base)
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in counts.items():
            for p in zip(w, w[1:]):
                pairs[p] += c
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        vocab.append(best[0] + best[1])
        new = collections.Counter()
        for w, c in counts.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        counts = new
    return merges, vocab


def split_isolated(pat, text):
    """Hugging Face's Split with behavior Isolated: matches and the text between them."""
    out, at = [], 0
    for m in regex.finditer(pat, text):
        if m.start() > at:
            out.append(text[at:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def split_added(text, added):
    """Cuts text at added tokens: the earliest match, the longest at a position."""
    out = []
    while text:
        best = None
        for a in sorted(added, key=len, reverse=True):
            i = text.find(a)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, a)
        if best is None:
            out.append((text, False))
            break
        i, a = best
        if i > 0:
            out.append((text[:i], False))
        out.append((a, True))
        text = text[i + len(a):]
    return out


class ByteLevel:
    def __init__(self, pattern, use_split, corpus, added, n_merges):
        self.pattern, self.use_split = pattern, use_split
        words = [self.map(w) for w in self.pre(corpus)]
        self.merges, vocab = train(words, [B2U[b] for b in range(256)], n_merges)
        self.vocab = {s: i for i, s in enumerate(dict.fromkeys(vocab))}
        self.ranks = {p: i for i, p in enumerate(self.merges)}
        self.added = {}
        for content, special in added:
            self.added[content] = (len(self.vocab) + len(self.added), special)

    def pre(self, text):
        return split_isolated(self.pattern, text)

    @staticmethod
    def map(w):
        return "".join(B2U[b] for b in w.encode("utf-8"))

    def encode(self, text):
        ids = []
        for piece, is_added in split_added(text, list(self.added)):
            if is_added:
                ids.append(self.added[piece][0])
                continue
            for w in self.pre(piece):
                for sym in bpe(self.map(w), self.ranks):
                    ids.append(self.vocab[sym])
        return ids

    def decode(self, ids):
        inv = {i: s for s, i in self.vocab.items()}
        specials = {i for s, (i, sp) in self.added.items() if sp}
        plain = {i: s for s, (i, sp) in self.added.items() if not sp}
        b = bytearray()
        for i in ids:
            if i in specials:
                continue
            if i in plain:
                b += plain[i].encode()
            else:
                b += bytes(U2B[c] for c in inv[i])
        return b.decode("utf-8", errors="replace")

    def tokenizer_json(self, post_bos=None):
        if self.use_split:
            pre = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        else:
            pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
        if post_bos:
            post = {"type": "Sequence", "processors": [post, template(post_bos, self.added[post_bos][0])]}
        return {
            "version": "1.0",
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": sp} for s, (i, sp) in self.added.items()],
            "normalizer": None, "pre_tokenizer": pre, "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [a + " " + b for a, b in self.merges]},
        }


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


class SentencePiece:
    """BPE over Unicode characters with the ▁ metaspace and byte fallback."""

    def __init__(self, legacy, corpus, n_merges):
        self.legacy = legacy
        words = [list(w) for w in self.pre(corpus, True)]
        chars = collections.Counter(c for w in words for c in w)
        base = [c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))][:70]  # rare chars fall back to bytes
        words = [w for w in words if all(c in base for c in w)]
        specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
        self.merges, vocab = train(words, specials + base, n_merges)
        self.vocab = {s: i for i, s in enumerate(dict.fromkeys(vocab))}
        self.ranks = {p: i for i, p in enumerate(self.merges)}
        self.added = {"<unk>": (0, True), "<s>": (1, True), "</s>": (2, True)}
        self.added["[INST]"] = (len(self.vocab), True)
        self.added["[/INST]"] = (len(self.vocab) + 1, True)

    def pre(self, text, first):
        if self.legacy:  # normalizer: Prepend("▁") then Replace(" ", "▁"); no pre-tokenizer
            return ["▁" + text.replace(" ", "▁")] if text else []
        t = text.replace(" ", "▁")  # Metaspace, prepend_scheme "first", split false
        if first and not t.startswith("▁"):
            t = "▁" + t
        return [t]

    def encode(self, text):
        ids = []
        first = True
        for piece, is_added in split_added(text, list(self.added)):
            if is_added:
                ids.append(self.added[piece][0])
                first = False
                continue
            for w in self.pre(piece, first):
                for sym in bpe(list(w), self.ranks):
                    if sym in self.vocab:
                        ids.append(self.vocab[sym])
                    else:
                        ids.extend(self.vocab["<0x%02X>" % b] for b in sym.encode("utf-8"))
            first = False
        return ids

    def decode(self, ids):
        inv = {i: s for s, i in self.vocab.items()}
        specials = {i for s, (i, sp) in self.added.items() if sp}
        b = bytearray()
        for i in ids:
            if i in specials:
                continue
            s = inv[i]
            if len(s) == 6 and s.startswith("<0x"):
                b.append(int(s[3:5], 16))
            else:
                b += s.replace("▁", " ").encode()
        return b.decode("utf-8", errors="replace")

    def tokenizer_json(self):
        if self.legacy:
            norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
            pre = None
        else:
            norm = None
            pre = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        return {
            "version": "1.0",
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": sp} for s, (i, sp) in self.added.items()],
            "normalizer": norm, "pre_tokenizer": pre, "post_processor": template("<s>", 1),
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [[a, b] for a, b in self.merges]},
        }


def write(out, name, tok, doc, bos=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    cases = []
    for t in TESTS:
        t = t.replace("<SPECIAL>", next(iter(a for a in tok.added if a not in ("<unk>",))))
        ids = tok.encode(t)
        cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids)})
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"bos": bos, "cases": cases}, f, ensure_ascii=False, indent=1)


def main(out):
    gpt2 = ByteLevel(GPT2_PAT, False, CORPUS, [("<|endoftext|>", True)], 150)
    write(out, "gpt2", gpt2, gpt2.tokenizer_json())
    llama3 = ByteLevel(LLAMA3_PAT, True, CORPUS, [("<|begin_of_text|>", True), ("<|eot_id|>", True),
                                                 ("<|start_header_id|>", True), ("<|end_header_id|>", True),
                                                 ("<tool>", False)], 200)
    write(out, "llama3", llama3, llama3.tokenizer_json("<|begin_of_text|>"), llama3.added["<|begin_of_text|>"][0])
    qwen2 = ByteLevel(QWEN2_PAT, True, CORPUS, [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)], 200)
    write(out, "qwen2", qwen2, qwen2.tokenizer_json())
    for name, legacy in (("llama2", True), ("mistral", False)):
        sp = SentencePiece(legacy, CORPUS, 200)
        write(out, name, sp, sp.tokenizer_json(), 1)


if __name__ == "__main__":
    main(sys.argv[1])
