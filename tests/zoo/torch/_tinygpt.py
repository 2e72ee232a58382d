"""A character-level GPT and its training loop, in the style of nanoGPT's ``train.py``.

AdamW with decoupled weight decay on the matrices only, linear warm-up then cosine decay of the
learning rate, gradient accumulation over micro-batches (the loss divided by the number of
micro-steps), ``clip_grad_norm_`` before the step, ``set_to_none`` zeroing. Tiny dims so a zoo
case finishes in seconds on one CPU thread. The cases call :func:`train` with their own config.
"""

import math
import os

from _corpus import text, vocab
from torch.nn import functional as F

import torch
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size=32, n_layer=2, n_head=2, n_embd=32) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def train(
    learning_rate=1e-3,
    max_iters=200,
    warmup_iters=20,
    min_lr_ratio=0.1,
    gradient_accumulation_steps=2,
    batch_size=8,
    block_size=32,
    grad_clip=1.0,
    weight_decay=0.1,
    seed=None,
    compile=False,
):
    seed = int(os.environ.get("ZOO_SEED", "1337")) if seed is None else seed
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(seed)
    data_text = text()
    chars, stoi = vocab(data_text)
    data = torch.tensor([stoi[c] for c in data_text], dtype=torch.long)
    n = int(0.9 * len(data))
    train_data = data[:n]
    model = GPT(len(chars), block_size=block_size)
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (0.9, 0.95))
    if compile:
        # as nanoGPT does, after the optimizer; aot_eager traces as the default backend does
        # without building C++ (the machine's compiler is not what is tested)
        model = torch.compile(model, backend="aot_eager")
    min_lr = learning_rate * min_lr_ratio

    def get_batch():
        ix = torch.randint(len(train_data) - block_size, (batch_size,))
        x = torch.stack([train_data[i : i + block_size] for i in ix])
        y = torch.stack([train_data[i + 1 : i + 1 + block_size] for i in ix])
        return x, y

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * min(ratio, 1.0)))
        return min_lr + coeff * (learning_rate - min_lr)

    X, Y = get_batch()
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for _micro_step in range(gradient_accumulation_steps):
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % 50 == 0 or iter_num == max_iters - 1:
            lossf = loss.item() * gradient_accumulation_steps
            print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}")
    return model
