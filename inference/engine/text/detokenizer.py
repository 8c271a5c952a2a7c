"""Streaming decode: turn generated token ids into text pieces as they arrive.

Decoding token by token is wrong in three ways: a character can be split across byte tokens (an emoji is four
`<0xNN>` tokens in a SentencePiece vocabulary, or two halves of a byte-level BPE token), SentencePiece strips the
leading space of the first piece only, and a decoder can rewrite a whole run of byte tokens (one U+FFFD per byte
when the run is not valid UTF-8). So each step decodes a short window of recent tokens with the tokenizer itself and
emits what the new token added to that window's text, and holds back text that a later token could still change.
"""

from __future__ import annotations

from inference.engine.text.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Streams one sequence's text; `"".join(push(t) for t in ids) + flush() == tokenizer.decode(ids)`.

    The window holds the tokens of the last emitted piece (context, so the decoder sees what precedes the new
    tokens; their text is `_context_text`) followed by tokens not yet emitted. It moves on only where text is
    final, so it stays a few tokens long and each push costs O(1).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._window: list[int] = []
        self._context_len = 0
        self._context_text = ""
        # In a byte-fallback vocabulary the decoder judges a run of `<0xNN>` tokens as a whole, so text ending in
        # one is not final until a token that is not a byte (or the end of the stream) closes the run.
        self._in_byte_run = False

    def push(self, token_id: int) -> str:
        """Adds one generated token; returns the text it completed (possibly "", never half a character)."""
        self._window.append(token_id)
        if self.tokenizer.is_byte_piece(token_id):
            self._in_byte_run = True
        elif not (self.skip_special_tokens and self.tokenizer.is_special(token_id)):
            self._in_byte_run = False
        if self._in_byte_run:
            return ""
        text = self.tokenizer.decode(self._window, self.skip_special_tokens)
        if len(text) <= len(self._context_text) or text.endswith(_REPLACEMENT):
            # Nothing new yet, or a character still waits for its remaining bytes.
            return ""
        piece = text[len(self._context_text) :]
        # The tokens just emitted become the context of the next window.
        del self._window[: self._context_len]
        self._context_len = len(self._window)
        if self._context_len == 1:  # the common case: one token made the piece
            self._context_text = self.tokenizer.decode_alone(self._window[0], self.skip_special_tokens)
        else:
            self._context_text = self.tokenizer.decode(self._window, self.skip_special_tokens)
        return piece

    def flush(self) -> str:
        """The text still held back at the end of the stream (e.g. a dangling partial character, as U+FFFD)."""
        text = self.tokenizer.decode(self._window, self.skip_special_tokens)
        piece, self._context_text = text[len(self._context_text) :], text
        return piece
