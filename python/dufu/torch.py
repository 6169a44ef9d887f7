"""A ``torch.utils.data.IterableDataset`` over dufu's loader for one data-parallel
rank: give it the blend (or any dufu TokenDataset), the rank and the data-parallel
size, and wrap it in ``torch.utils.data.DataLoader(ds, batch_size=None)``. dufu's own
threads prefetch, so torch's DataLoader needs no worker processes.

    ds = dufu.torch.DistributedIterableDataset(blend.dataset, micro_batch=8,
                                               rank=rank, world_size=world_size)
    for tokens in torch.utils.data.DataLoader(ds, batch_size=None):
        ...
    checkpoint["data"] = ds.state_dict()
"""

from typing import Any, Dict, Iterator, Optional

import torch
import torch.utils.data

from . import DataLoader, DistributedProxySampler, MegatronPretrainingSampler, SequentialSampler, TokenDataset

_SAMPLERS = ("megatron", "distributed")


class DistributedIterableDataset(torch.utils.data.IterableDataset):
    """Micro-batches (``[micro_batch, seq_length + 1]`` int32 tensors) of rank ``rank``
    of ``world_size``, forever.

    ``sampler="megatron"``: Megatron's pretraining sampler (the dataset is already
    shuffled; rank r takes the r-th micro-batch slice of each global batch).
    ``sampler="distributed"``: a random order per epoch (seed + epoch) split over the
    ranks like torch's DistributedSampler (dufu's DistributedProxySampler).
    With ``eod_id`` (document masking) each item is a dict of ``tokens``,
    ``position_ids`` and ``cu_seqlens``, as ``dufu.DataLoader(eod_id=...)`` yields.
    """

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
    ) -> None:
        super().__init__()
        if sampler not in _SAMPLERS:
            raise ValueError(f"sampler must be 'megatron' or 'distributed', got {sampler!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if sampler == "megatron":
            self._sampler = MegatronPretrainingSampler(len(dataset), micro_batch, rank, world_size)
        else:
            self._sampler = DistributedProxySampler(SequentialSampler(len(dataset)), world_size, rank, seed=seed)
        self._dataset = dataset
        self._micro_batch = micro_batch
        self._workers = workers
        self._prefetch_batches = prefetch_batches
        self._eod_id = eod_id
        self._state: Optional[Dict[str, int]] = None
        self._loader: Optional[DataLoader] = None

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                "dufu's loader prefetches with its own threads: use torch's DataLoader with num_workers=0 "
                f"(got {info.num_workers})"
            )
        # One loader per dataset object: a new iteration continues where the last stopped.
        if self._loader is None:
            self._loader = DataLoader(
                self._dataset,
                self._sampler,
                self._micro_batch,
                workers=self._workers,
                prefetch_batches=self._prefetch_batches,
                output="torch",
                state=self._state,
                eod_id=self._eod_id,
            )
        return self._loader

    def state_dict(self) -> Dict[str, int]:
        """The position of the next micro-batch this rank yields."""
        if self._loader is not None:
            return self._loader.state_dict()
        return dict(self._state) if self._state is not None else {"epoch": 0, "position": 0, "batches_served": 0}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (a ``state_dict()`` of the same rank and settings)."""
        if self._loader is not None:
            self._loader.load_state_dict(state)
        else:
            self._state = dict(state)
