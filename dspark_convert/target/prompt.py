"""What a prompt must be for a target: the rules `dspark smoke` and `dspark eval` share.

- token ids inside the target's vocabulary, at least one;
- text encoded by the target's tokenizer only when it can fit the context: a text longer
  than the context times the tokenizer's longest token (in characters) cannot, and is
  refused before the tokenizer sees it (a 50 MB prompt line took minutes to encode, only to
  be refused for its length afterwards);
- prompt plus new tokens within the target's context (``max_position_embeddings``):
  beyond it the target was never trained, and the caches and the run grow with the count.

Each command refuses with its own error class (``error``: SmokeInputError for smoke's
options, PromptSetError for a line of eval's prompt set), naming where the prompt came
from (``where``); the wording is the same.
"""

from __future__ import annotations

from pathlib import Path

from dspark_convert.target.tokenizer import TokenizerFingerprint
from dspark_convert.util.text import shown_int


def check_ids(ids, vocab_size: int, *, where: str, error, path: str | None = None,
              field: str = "prompt") -> None:
    if not ids:
        raise error(f"{where}: empty prompt", path=path, field=field,
                    expected="at least one token", found=0)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise error(f"{where}: token id {shown_int(bad)} is outside the vocabulary "
                    f"0..{vocab_size - 1}", path=path, field=field,
                    expected=f"0..{vocab_size - 1}", found=shown_int(bad))


def encode_text(tokenizer: TokenizerFingerprint, text: str, *, context: int, where: str,
                error, path: str | None = None, field: str = "prompt") -> list[int]:
    """``text``'s ids, or a refusal: text that cannot fit ``context`` tokens, text the
    tokenizer cannot encode, text that encodes to no token."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A command-line argument that is not UTF-8 arrives with its bytes as lone
        # surrogates (Python's surrogateescape): name the byte, not the tokenizer's complaint.
        bad = text[exc.start]
        byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
        what = f"byte 0x{byte:02x}" if byte is not None else f"a lone surrogate U+{ord(bad):04X}"
        raise error(f"{where}: not UTF-8 text ({what} at character {exc.start}); expected "
                    "UTF-8 text", path=path, field=field, expected="UTF-8 text",
                    found=what) from None
    limit = context * tokenizer.longest_token
    if len(text) > limit:
        raise error(f"{where}: {len(text)} characters of text; expected at most {limit} (the "
                    f"target's context of {context} tokens, each at most "
                    f"{tokenizer.longest_token} characters)", path=path, field=field,
                    expected=f"<= {limit} characters", found=len(text))
    try:
        ids = tokenizer.encode(text)
    except Exception as exc:  # the tokenizers library raises its own exception types
        raise error(f"{where}: cannot tokenize: {' '.join(str(exc).split())}", path=path,
                    field=field) from None
    if not ids:
        raise error(f"{where}: the text encodes to no token", path=path, field=field,
                    expected="at least one token", found=0)
    return ids


def check_context(prompt_tokens: int, max_new_tokens: int, *, context: int, config: Path | str,
                  where: str, error, path: str | None = None,
                  field: str = "max_new_tokens") -> None:
    need = prompt_tokens + max_new_tokens
    if need > context:
        raise error(
            f"{where}: expected prompt + --max-new-tokens within the target's context of "
            f"{context} positions (max_position_embeddings, {config}), found {prompt_tokens} + "
            f"{shown_int(max_new_tokens)}", path=path, field=field, expected=f"<= {context}",
            found=shown_int(need))
