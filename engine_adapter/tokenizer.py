"""Tokenizer and chat template from the model's own files (nothing is downloaded).

GGUF: the "gpt2" tokenizer model is byte-level BPE: `tokenizer.ggml.tokens` is the vocabulary in id order,
`tokenizer.ggml.merges` the merge list ("a b" per entry), `tokenizer.ggml.token_type` marks control tokens (3),
which become special tokens. SmolLM's pre-tokenizer ("smollm") splits digits one by one before the byte-level
GPT-2 split, like the original tokenizer.json. A Hugging Face directory brings tokenizer.json and
tokenizer_config.json (chat template, bos/eos) instead.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

_CONTROL = 3
_USER_DEFINED = 4
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>")


class Tokenizer:
    def __init__(self, tok, *, bos_token_id: int | None, eos_token_id: int | None, add_bos: bool,
                 chat_template: str | None) -> None:
        self._tok = tok  # a `tokenizers.Tokenizer`
        self.vocab_size = tok.get_vocab_size()
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        # Chat models end a turn with <|im_end|> / <|eot_id|> rather than the file's eos; stop on those too.
        self.stop_token_ids = sorted({i for i in (eos_token_id, *(tok.token_to_id(t) for t in _END_OF_TURN))
                                      if i is not None})

    @classmethod
    def from_loaded(cls, loaded) -> "Tokenizer":
        hf_dir = loaded.metadata.get("hf_dir")
        return cls.from_hf_dir(hf_dir) if hf_dir else cls.from_gguf_metadata(loaded.metadata)

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, object]) -> "Tokenizer":
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"model: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        tokens = list(metadata["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
        types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        tok = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if metadata.get("tokenizer.ggml.pre") == "smollm":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                                if ty in (_CONTROL, _USER_DEFINED)])
        return cls(tok, bos_token_id=_opt_int(metadata.get("tokenizer.ggml.bos_token_id")),
                   eos_token_id=_opt_int(metadata.get("tokenizer.ggml.eos_token_id")),
                   add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=metadata.get("tokenizer.chat_template"))

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTokenizer

        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tok_file):
            raise FileNotFoundError(f"model directory {path!r} has no tokenizer.json")
        tok = HFTokenizer.from_file(tok_file)
        cfg: dict = {}
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            with open(cfg_file) as f:
                cfg = json.load(f)
        template = cfg.get("chat_template")
        template_file = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(template_file):
            with open(template_file) as f:
                template = f.read()

        def token_id(name: str) -> int | None:
            value = cfg.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            return tok.token_to_id(value) if isinstance(value, str) else None

        # a tokenizer.json post-processor may already add bos; encode() below disables it and adds bos itself
        return cls(tok, bos_token_id=token_id("bos_token"), eos_token_id=token_id("eos_token"),
                   add_bos=bool(cfg.get("add_bos_token", False)), chat_template=template)

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render OpenAI-style messages with the model's Jinja template (ValueError naming `messages`)."""
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
        bos = self._tok.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self._tok.id_to_token(self.eos_token_id) if self.eos_token_id is not None else ""
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos or "", eos_token=eos or "")


def _opt_int(value) -> int | None:
    return None if value is None else int(value)
