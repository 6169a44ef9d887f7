"""Typed stubs of dufu.torch."""

from typing import Any, Dict, Iterator, Optional

import torch
import torch.utils.data

from . import TokenDataset

class DistributedIterableDataset(torch.utils.data.IterableDataset):
    def __init__(
        self,
        dataset: TokenDataset,
        micro_batch: int,
        rank: int,
        world_size: int,
        *,
        sampler: str = "megatron",
        seed: int = 0,
        workers: int = 2,
        prefetch_batches: int = 4,
        eod_id: Optional[int] = None,
    ) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> Dict[str, int]: ...
    def load_state_dict(self, state: Dict[str, Any]) -> None: ...
