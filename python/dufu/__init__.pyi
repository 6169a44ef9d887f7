"""Typed stubs of the dufu package."""

from typing import Any, Dict, Optional

from ._dufu import (
    Blend as Blend,
    BlendedDataset as BlendedDataset,
    CausalLMDataset as CausalLMDataset,
    DistributedProxySampler as DistributedProxySampler,
    DufuError as DufuError,
    IndexedDataset as IndexedDataset,
    MegatronPretrainingSampler as MegatronPretrainingSampler,
    RandomSampler as RandomSampler,
    Sampler as Sampler,
    SequentialSampler as SequentialSampler,
    TokenDataset as TokenDataset,
    build_blend as build_blend,
    parse_blend_spec as parse_blend_spec,
    preprocess as preprocess,
)

class DataLoader:
    """The infinite prefetching loader; yields numpy arrays or torch tensors."""

    def __init__(
        self,
        dataset: TokenDataset,
        sampler: Sampler,
        micro_batch: int,
        *,
        workers: int = 2,
        prefetch_batches: int = 4,
        output: str = "numpy",
        with_indices: bool = False,
        state: Optional[Dict[str, int]] = None,
        eod_id: Optional[int] = None,
    ) -> None: ...
    def __iter__(self) -> "DataLoader": ...
    def __next__(self) -> Any: ...
    def state_dict(self) -> Dict[str, int]: ...
    def load_state_dict(self, state: Dict[str, int]) -> None: ...
