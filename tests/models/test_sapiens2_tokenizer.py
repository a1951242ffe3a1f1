"""The 4K window tokenizer: window locality, chunking, and checkpointing in training only."""

import pytest
import torch

import models.tokenizer as tokenizer_module
from models import build_backbone


def _tokenizer(**overrides):
    torch.manual_seed(0)
    return build_backbone("sapiens2_tiny_4k", **overrides).tokenizer


@torch.no_grad()
def test_each_output_token_sees_only_its_window():
    tok = _tokenizer().eval()
    grid = torch.randn(1, 8, 12, 64)  # 2 x 3 windows of 4 x 4 patches
    before = tok(grid)
    changed = grid.clone()
    changed[0, 4:8, 4:8] += 1.0  # the window at row 1, column 1
    after = tok(changed)
    assert before.shape == (1, 2, 3, 64)
    differs = (after - before).abs().amax(dim=-1)[0] > 0
    assert differs.tolist() == [[False, False, False], [False, True, False]]


@torch.no_grad()
def test_chunked_windows_equal_one_pass():
    tok = _tokenizer().eval()
    grid = torch.randn(2, 8, 12, 64)
    tok.chunk_size = 10_000
    whole = tok(grid)
    tok.chunk_size = 5  # 12 windows -> chunks of 5, 5, 2
    torch.testing.assert_close(tok(grid), whole, rtol=0, atol=1e-6)


def test_checkpointing_only_while_training(monkeypatch):
    calls = []
    real = tokenizer_module.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "checkpoint", counting)
    tok = _tokenizer(tokenizer_chunk_size=5)
    grid = torch.randn(2, 8, 12, 64, requires_grad=True)
    tok.train()(grid)
    assert len(calls) == 3  # one per chunk
    with torch.no_grad():
        tok.train()(grid)
    tok.eval()(grid)
    assert len(calls) == 3


def test_checkpointed_gradients_equal_plain_gradients():
    grads = []
    for use_checkpoint in (True, False):
        tok = _tokenizer(tokenizer_chunk_size=4, tokenizer_checkpoint=use_checkpoint).train()
        grid = torch.randn(2, 8, 12, 64, generator=torch.Generator().manual_seed(3), requires_grad=True)
        tok(grid).square().sum().backward()
        grads.append((grid.grad, tok.blocks[0].attn.wq.weight.grad))
    for with_ckpt, without in zip(*grads):
        torch.testing.assert_close(with_ckpt, without, rtol=0, atol=1e-6)


def test_grid_must_split_into_windows():
    model = build_backbone("sapiens2_tiny_4k")
    with pytest.raises(ValueError, match="multiples of patch_size"):
        model(torch.randn(1, 3, 64, 48))  # 4 x 3 patches: not whole 4 x 4 windows
