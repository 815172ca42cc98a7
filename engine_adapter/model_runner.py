"""`ModelRunner`: owns the model and the KV cache tensor; turns a scheduled step into one forward pass + sampling.

The cache is reserved once as kv_cache[num_layers, 2, num_blocks, block_tokens, kv_heads, head_dim]
(kernels/kv_transfer.py draws it); each layer holds views of it, and the connector receives the same tensor.
On a CUDA `device` the model, the cache and each step's inputs live there (same code); logits come back to the CPU
for sampling. `before_layer`, when set (the connector's `wait_for_layer_load`), runs before each layer.
"""

from __future__ import annotations

import torch

from kvpool.engine_adapter.loader import LoadedModel
from kvpool.engine_adapter.model import LlamaModel
from kvpool.engine_adapter.sampling import sample
from kvpool.engine_adapter.scheduler import ScheduledRequest
from kvpool.kernels.paged_attention import build_metadata


class ModelRunner:
    def __init__(self, loaded: LoadedModel, *, num_blocks: int, block_tokens: int, max_model_len: int,
                 dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        spec = loaded.spec
        self.block_tokens = block_tokens
        self.device = torch.device(device)
        self.model = LlamaModel(spec, max_model_len)
        self.model.load(loaded.state_dict)
        self.model.eval()
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.kv_cache = torch.zeros(spec.num_layers, 2, num_blocks, block_tokens, spec.num_kv_heads, spec.head_dim,
                                    dtype=dtype, device=self.device)
        self.model.bind_cache(self.kv_cache)
        self.before_layer = None

    @staticmethod
    def block_bytes(loaded: LoadedModel, block_tokens: int, dtype: torch.dtype = torch.float32) -> int:
        s = loaded.spec
        return s.num_layers * 2 * block_tokens * s.num_kv_heads * s.head_dim * dtype.itemsize

    def forward(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """Logits [number of sampling requests, vocab] for one step (requests in scheduled order)."""
        input_ids: list[int] = []
        positions: list[int] = []
        q_lens, ctx_lens, tables, logit_rows = [], [], [], []
        for s in scheduled:
            req, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            input_ids.extend(req.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            q_lens.append(n)
            ctx_lens.append(start + n)
            tables.append(req.block_ids)
            if s.samples:
                logit_rows.append(len(input_ids) - 1)
        device = self.device
        meta = build_metadata(q_lens, ctx_lens, tables, self.block_tokens, device)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        logits = self.model(torch.tensor(input_ids, device=device), torch.tensor(positions, device=device), meta, rows,
                            self.before_layer)
        return logits if device.type == "cpu" else logits.cpu()

    def step(self, scheduled: list[ScheduledRequest]) -> list[int]:
        logits = self.forward(scheduled)
        sampling = [s.request for s in scheduled if s.samples]
        if not sampling:
            return []
        return sample(logits, [r.params for r in sampling], [r.seed for r in sampling],
                      [len(r.output_token_ids) for r in sampling])
