"""Megatron-LM's _get_ltor_masks_and_position_ids (megatron/core/datasets/gpt_dataset.py),
written out in torch for one sample as Megatron computes it, and the document
boundaries its attention mask implies: the reference for dufu's packed documents
(dataprep/include/dufu/dataprep/packed_documents.h; tests/python/test_documents.py,
tests/reference/gpt_torch_reference.py)."""

import torch


def ltor_masks_and_position_ids(data, eod_token, reset_position_ids, reset_attention_mask, eod_mask_loss):
    """data: the sample's input tokens [T] (int64). Returns (attention_mask [1, T, T] bool
    with True where a query sees a key, loss_mask [T] float, position_ids [T] int64), the
    meaning of Megatron's function (which returns the mask inverted: True = masked)."""
    seq_length = data.numel()
    attention_mask = torch.tril(torch.ones((seq_length, seq_length), device=data.device)).unsqueeze(0)
    loss_mask = torch.ones(seq_length, dtype=torch.float, device=data.device)
    if eod_mask_loss:
        loss_mask[data == eod_token] = 0.0
    position_ids = torch.arange(seq_length, dtype=torch.long, device=data.device)
    if reset_position_ids:
        position_ids = position_ids.clone()
    if reset_position_ids or reset_attention_mask:
        eod_index = position_ids[data == eod_token]
        if reset_position_ids:
            eod_index = eod_index.clone()
        prev_index = 0
        for j in range(eod_index.numel()):
            i = eod_index[j]
            if reset_attention_mask:
                attention_mask[0, (i + 1):, : (i + 1)] = 0
            if reset_position_ids:
                position_ids[(i + 1):] -= i + 1 - prev_index
                prev_index = i + 1
    return attention_mask > 0.5, loss_mask, position_ids


def document_starts_of_mask(mask):
    """The rows of a [1, T, T] visibility mask that cannot see the row before them: where
    documents start (row 0 always)."""
    T = mask.shape[-1]
    return [0] + [t for t in range(1, T) if not bool(mask[0, t, t - 1])]
