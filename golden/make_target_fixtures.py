"""Write the golden targets' tokenizer.json files (ours, not DeepSeek's), deterministically.

    python golden/make_target_fixtures.py           # (re)write both targets' tokenizer.json
    python golden/make_target_fixtures.py --check   # rebuild in memory and compare byte for byte

DeepSpec's tiny reference targets (golden/reference/target/, Qwen3, and
golden/reference/gemma4/target/, gemma4_unified) have no tokenizer: their prompts are token
ids. The pairing checks (dspark_convert/pairing.py) fingerprint a target's
tokenizer.json, so this script gives each one: a byte-level BPE made with the ``tokenizers``
library, with 3 special tokens (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, the target config's
pad/bos/eos ids), the 256 byte tokens and merges learnt here from a fixed English text, for
TOKENIZER_SIZE tokens in all. That is fewer than the embedding's 512 rows (a padded
embedding, as real targets have) and keeps the drafter's mask token 500 out of anything
the tokenizer produces. The Gemma4 target's is the same BPE over Gemma's five leading
special tokens (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, ``<mask>`` 4: its
config's pad/eos/bos ids, and the drafters' mask token 4 a special token, as in Gemma's own
vocabulary). The models were never trained with this tokenizer: its ids are
just ids, and text round-trips through it, which is all a ``--prompt TEXT`` needs.

The merges are learnt by this script, not by the library's trainer, so that ties are
broken in one fixed order (most frequent pair, then the smallest pair) and the same code
always writes the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET_DIR = HERE / "reference" / "target"
TOKENIZER_PATH = TARGET_DIR / "tokenizer.json"
GEMMA4_TOKENIZER_PATH = HERE / "reference" / "gemma4" / "target" / "tokenizer.json"

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
GEMMA4_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
TOKENIZER_SIZE = 400
# Each target's tokenizer.json and its special tokens (ids 0, 1, ... in this order).
TOKENIZERS = ((TOKENIZER_PATH, SPECIAL_TOKENS), (GEMMA4_TOKENIZER_PATH, GEMMA4_SPECIAL_TOKENS))

# Plain text to learn merges from. Changing it changes the tokenizer (and its fingerprint).
CORPUS = """\
The quick brown fox jumps over the lazy dog. A speculative decoder drafts a block of
tokens with a small model and lets the large target model verify them in one pass. When
the draft is good, many tokens are accepted at once; when it is bad, the target still
produces the right token, so the output is the same as the target would have written on
its own. The drafter reads the hidden states of the target at a few of its layers, adds
the embedding of the last accepted token, and predicts the next tokens of the block.
Numbers such as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100 and 2026 appear in text, and so
do questions? Answers! Lists: one, two, three. "Quoted words" and (brackets) too.
"""


def _learn_merges(words: Counter, count: int) -> list[tuple[str, str]]:
    """Plain BPE over pre-tokenised words (tuples of symbols): merge the most frequent
    adjacent pair, ties broken by the pair itself, ``count`` times."""
    merges = []
    words = Counter({tuple(w): n for w, n in words.items()})
    for _ in range(count):
        pairs: Counter = Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def build_tokenizer_json(special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte symbols
    words = Counter(piece for piece, _span in byte_level.pre_tokenize_str(CORPUS))
    n_merges = TOKENIZER_SIZE - len(special_tokens) - len(alphabet)
    merges = _learn_merges(words, n_merges)
    if len(merges) != n_merges:
        raise SystemExit(f"the corpus yields only {len(merges)} merges; expected {n_merges}")

    vocab: dict[str, int] = {}
    for token in (*special_tokens, *alphabet, *(a + b for a, b in merges)):
        if token in vocab:
            raise SystemExit(f"token {token!r} would appear twice")
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in special_tokens])
    if tokenizer.get_vocab_size(with_added_tokens=True) != TOKENIZER_SIZE:
        raise SystemExit("unexpected tokenizer size")
    return tokenizer.to_str(pretty=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="rebuild in memory and compare with the checked-in file")
    args = parser.parse_args()
    stale = 0
    for path, special in TOKENIZERS:
        text = build_tokenizer_json(special)
        if args.check:
            current = path.read_text() if path.exists() else None
            if current != text:
                print(f"{path} is stale or missing: run {Path(__file__).name}", file=sys.stderr)
                stale = 1
            else:
                print(f"{path.relative_to(HERE.parent)} is up to date")
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent)} ({TOKENIZER_SIZE} tokens)")
    return stale


if __name__ == "__main__":
    sys.exit(main())
