"""`Request`: one sequence's state inside the engine (prompt, output so far, blocks, progress)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvpool.engine_adapter.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    arrival_time: float
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()                    # model's end-of-turn ids (ignored with ignore_eos)
    token_ids: list[int] = field(default_factory=list)       # prompt + output; the KV of [0, num_computed) is cached
    block_ids: list[int] = field(default_factory=list)       # block table
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None                         # "stop" | "length" | "abort"
    first_token_time: float | None = None
    num_local_cached_tokens: int = 0                         # at first admission (a preemption does not reset it)
    num_external_tokens: int = 0                             # loaded through the connector at first admission
    num_preemptions: int = 0
    block_keys: list[bytes] = field(default_factory=list)    # keys of the full blocks of token_ids, cached
    admitted: bool = False
    kv_transfer_params: dict | None = None                   # per-request connector options (kvpool/hooks.py)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
