"""Tokenizer and chat template from GGUF metadata only (nothing is downloaded).

The GGUF "gpt2" tokenizer model is byte-level BPE: `tokenizer.ggml.tokens` is the vocabulary in id order,
`tokenizer.ggml.merges` the merge list ("a b" per entry), `tokenizer.ggml.token_type` marks control tokens (3),
which become special tokens. SmolLM's pre-tokenizer ("smollm") splits digits one by one before the byte-level
GPT-2 split, like the original tokenizer.json.
"""

from __future__ import annotations

from typing import Sequence

_CONTROL = 3
_USER_DEFINED = 4


class Tokenizer:
    def __init__(self, metadata: dict[str, object]) -> None:
        from tokenizers import AddedToken, Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"model: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        tokens = list(metadata["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
        types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False)
        tok = HFTokenizer(bpe)
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if metadata.get("tokenizer.ggml.pre") == "smollm":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                    if ty in (_CONTROL, _USER_DEFINED)]
        tok.add_special_tokens(specials)
        self._tok = tok
        self.vocab_size = len(tokens)
        self.bos_token_id = _opt_int(metadata.get("tokenizer.ggml.bos_token_id"))
        self.eos_token_id = _opt_int(metadata.get("tokenizer.ggml.eos_token_id"))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template = metadata.get("tokenizer.chat_template")
        self.tokens = tokens
        # Chat models end a turn with <|im_end|> / <|eot_id|> rather than the file's eos; stop on those too.
        self.stop_token_ids = sorted({i for i in (self.eos_token_id, *(self._id(t) for t in
                                      ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>"))) if i is not None})

    def _id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render OpenAI-style messages with the GGUF's Jinja template (ValueError naming `messages`)."""
        if not self.chat_template:
            raise ValueError("messages: this model has no chat template; use /v1/completions")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}]: must be an object with string 'role' and 'content'")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        template = env.from_string(str(self.chat_template))
        bos = self.tokens[self.bos_token_id] if self.bos_token_id is not None else ""
        eos = self.tokens[self.eos_token_id] if self.eos_token_id is not None else ""
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos, eos_token=eos)


def _opt_int(value) -> int | None:
    return None if value is None else int(value)
