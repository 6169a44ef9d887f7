"""dufu from Python: shards, causal-LM datasets, blends, samplers and the infinite
prefetching loader of dufu's C++ dataprep library, and ``preprocess``.

The heavy work (index building, reading samples, tokenizing) runs in C++ without the
GIL; indices are cached under the same keys as ``dataprep build-index`` uses, so the
tool can build them ahead of training. Errors arrive as :class:`DufuError` with
dufu's one-line message.

    shard = dufu.IndexedDataset("out/corpus_text_document")        # items: numpy views
    blend = dufu.build_blend("0.7 out/a 0.3 out/b", seq_length=2048, num_samples=10**6)
    sampler = dufu.MegatronPretrainingSampler(len(blend.dataset), 8, rank, world_size)
    loader = dufu.DataLoader(blend.dataset, sampler, micro_batch=8, output="torch")
    for tokens in loader:                  # [8, 2049] int32, forever
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
"""

from typing import Any, Dict, Iterator, Optional, Tuple, Union

from ._dufu import (
    BlendedDataset,
    Blend,
    CausalLMDataset,
    DistributedProxySampler,
    DufuError,
    IndexedDataset,
    MegatronPretrainingSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    TokenDataset,
    build_blend,
    parse_blend_spec,
    preprocess,
)
from . import _dufu

__all__ = [
    "Blend",
    "BlendedDataset",
    "CausalLMDataset",
    "DataLoader",
    "DistributedProxySampler",
    "DufuError",
    "IndexedDataset",
    "MegatronPretrainingSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "TokenDataset",
    "build_blend",
    "parse_blend_spec",
    "preprocess",
]

_OUTPUTS = ("numpy", "torch")


class DataLoader:
    """The infinite prefetching loader: batches of ``[micro_batch, seq_length + 1]``
    int32 tokens forever, in the sampler's order whatever the number of workers, the
    epoch advancing (and reshuffling) by itself.

    ``workers`` C++ threads read samples into a queue of ``prefetch_batches`` batches.
    ``output`` is ``"numpy"`` or ``"torch"`` (``torch.from_numpy`` of the same buffer:
    no copy; each batch is a fresh buffer Python owns). With ``with_indices`` each item
    is ``(tokens, dataset_indices)``. ``state_dict()`` is the position of the next
    batch; a loader made with ``state=`` or given ``load_state_dict()`` continues with
    exactly that batch.

    With ``eod_id`` (document masking, as Megatron's ``reset_position_ids`` and
    ``reset_attention_mask``) each item is a dict: ``tokens``; ``position_ids``
    ``[micro_batch, seq_length]``, each input token's position in its document
    (restarting after every ``eod_id``); ``cu_seqlens``, where each document starts in
    the flattened inputs ``tokens[:, :-1]``, then ``micro_batch * seq_length``
    (flash-attention's varlen layout); and ``indices`` with ``with_indices``. An
    end-of-document token belongs to the document it ends, exactly as Megatron's
    ``_get_ltor_masks_and_position_ids``.
    """

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
    ) -> None:
        if output not in _OUTPUTS:
            raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
        self._to_torch = None
        if output == "torch":
            import torch  # only when asked for: numpy users need not have torch

            self._to_torch = torch.from_numpy
        self._with_indices = with_indices
        self._documents = eod_id is not None
        self._loader = _dufu._Loader(dataset, sampler, micro_batch, workers, prefetch_batches, state, eod_id)

    def __iter__(self) -> "DataLoader":
        return self

    def __next__(self) -> Any:
        arrays = self._loader.next()
        if self._to_torch is not None:
            arrays = tuple(None if array is None else self._to_torch(array) for array in arrays)
        tokens, indices, position_ids, cu_seqlens = arrays
        if self._documents:
            item = {"tokens": tokens, "position_ids": position_ids, "cu_seqlens": cu_seqlens}
            if self._with_indices:
                item["indices"] = indices
            return item
        return (tokens, indices) if self._with_indices else tokens

    def state_dict(self) -> Dict[str, int]:
        """Where the next batch comes from: ``{"epoch", "position", "batches_served"}``."""
        return self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Drops the prefetched batches and continues from ``state``."""
        self._loader.load_state_dict(state)
