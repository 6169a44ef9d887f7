"""Typed stubs of the C++ extension module (python/src); import ``dufu`` instead."""

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

class DufuError(RuntimeError):
    """dufu's error (bad input, IO), with dufu's one-line message."""

class IndexedDataset:
    """A tokenized shard PREFIX.bin/.idx; items are numpy arrays of the stored dtype
    (read-only views into the mapped .bin with impl "mmap")."""

    def __init__(self, prefix: str, impl: str = "mmap") -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> npt.NDArray[np.integer]: ...
    def get(self, index: int, offset: int = 0, length: Optional[int] = None) -> npt.NDArray[np.integer]: ...
    @property
    def sequence_lengths(self) -> npt.NDArray[np.int64]: ...
    @property
    def document_indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_sequences(self) -> int: ...
    @property
    def num_documents(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def impl(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def bin_buffer(self) -> Optional[npt.NDArray[np.uint8]]: ...

class TokenDataset:
    """Random-access samples of seq_length + 1 int32 tokens."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> npt.NDArray[np.int32]: ...
    def get_batch(self, indices: Sequence[int]) -> npt.NDArray[np.int32]: ...
    @property
    def sample_length(self) -> int: ...
    def describe(self) -> str: ...

class CausalLMDataset(TokenDataset):
    """Megatron's GPTDataset over one shard, indices cached like `dataprep build-index`."""

    def __init__(
        self,
        shard: IndexedDataset,
        seq_length: int,
        num_samples: Optional[int] = None,
        seed: int = 1234,
        split: Optional[str] = None,
        split_part: str = "train",
        split_range: Tuple[float, float] = (0.0, 1.0),
        cache_dir: str = "",
        use_cache: bool = True,
    ) -> None: ...
    @property
    def num_epochs(self) -> int: ...
    @property
    def cache_path(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def document_index(self) -> npt.NDArray[np.int32]: ...
    @property
    def sample_index(self) -> npt.NDArray[np.int64]: ...
    @property
    def shuffle_index(self) -> npt.NDArray[np.int64]: ...

class BlendedDataset(TokenDataset):
    """Megatron's BlendedDataset: a weighted mix of datasets."""

    def __init__(
        self,
        datasets: Sequence[TokenDataset],
        weights: Sequence[float],
        size: Optional[int] = None,
        cache_dir: str = "",
        use_cache: bool = True,
    ) -> None: ...
    def source_of(self, index: int) -> Tuple[int, int]: ...
    @property
    def weights(self) -> List[float]: ...
    @property
    def num_datasets(self) -> int: ...
    @property
    def cache_path(self) -> str: ...
    @property
    def indices(self) -> Tuple[npt.NDArray[np.int16], npt.NDArray[np.int64]]: ...

class Blend:
    """What build_blend returns."""

    @property
    def dataset(self) -> TokenDataset: ...
    @property
    def parts(self) -> List[CausalLMDataset]: ...
    @property
    def weights(self) -> List[float]: ...
    @property
    def cache_paths(self) -> List[str]: ...

def build_blend(
    data_path: Union[str, Sequence[Tuple[float, str]]],
    *,
    impl: str = "mmap",
    seq_length: int = 2048,
    num_samples: Optional[int] = None,
    seed: int = 1234,
    split: Optional[str] = "969,30,1",
    split_part: str = "train",
    cache_dir: str = "",
    use_cache: bool = True,
) -> Blend: ...
def parse_blend_spec(spec: str) -> List[Tuple[float, str]]: ...

class Sampler:
    """Which dataset indices a rank reads, epoch by epoch."""

    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    @property
    def epoch(self) -> int: ...
    def at(self, position: int) -> int: ...
    def __iter__(self) -> Iterator[int]: ...

def SequentialSampler(dataset_size: int) -> Sampler: ...
def RandomSampler(dataset_size: int, seed: int = 0) -> Sampler: ...
def MegatronPretrainingSampler(
    dataset_size: int, micro_batch: int, data_parallel_rank: int, data_parallel_size: int
) -> Sampler: ...
def DistributedProxySampler(
    sampler: Sampler, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> Sampler: ...

class _Loader:
    def __init__(
        self,
        dataset: TokenDataset,
        sampler: Sampler,
        micro_batch: int,
        workers: int = 2,
        prefetch_batches: int = 4,
        state: Optional[Dict[str, int]] = None,
        eod_id: Optional[int] = None,
    ) -> None: ...
    def next(
        self,
    ) -> Tuple[
        npt.NDArray[np.int32],
        npt.NDArray[np.int64],
        Optional[npt.NDArray[np.int32]],
        Optional[npt.NDArray[np.int32]],
    ]: ...
    def state_dict(self) -> Dict[str, int]: ...
    def load_state_dict(self, state: Dict[str, int]) -> None: ...

def preprocess(
    inputs: Sequence[str],
    output_prefix: str,
    tokenizer_model: str,
    *,
    tokenizer_merges: str = "",
    tokenizer_pattern: str = "",
    json_keys: Sequence[str] = ("text",),
    impl: str = "mmap",
    layout: str = "megatron",
    append_eod: bool = False,
    eod_id: Optional[int] = None,
    dtype: Optional[str] = None,
    workers: int = 0,
    batch_bytes: int = 1048576,
    max_document_bytes: int = 16777216,
    on_error: str = "fail",
    txt_document: str = "line",
    stdin_format: str = "jsonl",
    shard: Optional[str] = None,
    progress: Union[bool, None, Callable[[Dict[str, float]], object]] = False,
    progress_interval: float = 0.5,
) -> Dict[str, object]: ...
