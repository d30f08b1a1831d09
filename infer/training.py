"""Training the course's tiny models on text every machine has: the Python standard library.

Random weights make every timing meaningful and every generated text gibberish. Week 10 needs
weights with structure (how often a draft's guess is accepted depends on what the model has
learned), and no download: so the course trains its own. The text is the source of the running
interpreter's standard library, read byte by byte (`infer.tokenizer`'s byte-level ids 0-255), and
split into training and held-out files by a hash of each file's path, so that the split is the same
on every machine with the same Python.

`train` is a plain loop: random windows of the text, next-byte cross-entropy, AdamW with a linear
warm-up and a cosine decay, gradients clipped at 1. `bits_per_byte` scores held-out text: the
model's cross-entropy in bits, per byte predicted (8 would be a model that knows nothing of bytes,
and a good compressor of Python source reaches about 1.5)."""

import hashlib
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

SKIPPED_FOLDERS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
HELD_OUT_ONE_IN = 20  # files whose path hashes to 0 modulo this are held out


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, every training file's bytes, one after another
    held_out: torch.Tensor
    files: int
    sha256: str  # of both parts: the same text on another machine gives the same digest


def stdlib_corpus(root: Path | None = None) -> Corpus:
    """The `.py` files under the interpreter's standard library (tests and vendored packages left
    out), sorted by path, as bytes; about one file in 20 held out."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if not SKIPPED_FOLDERS.intersection(p.relative_to(root).parts[:-1]))
    if not paths:
        raise FileNotFoundError(f"no Python sources under {root}")
    parts: dict[bool, list[bytes]] = {True: [], False: []}
    for path in paths:
        relative = path.relative_to(root).as_posix()
        held = int(hashlib.sha1(relative.encode()).hexdigest(), 16) % HELD_OUT_ONE_IN == 0
        parts[held].append(path.read_bytes())
    train, held_out = b"".join(parts[False]), b"".join(parts[True])
    return Corpus(
        train=torch.frombuffer(bytearray(train), dtype=torch.uint8),
        held_out=torch.frombuffer(bytearray(held_out), dtype=torch.uint8),
        files=len(paths),
        sha256=hashlib.sha256(train + b"\0" + held_out).hexdigest(),
    )


def windows(
    data: torch.Tensor, batch: int, length: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of `length` + 1 bytes: (inputs, next-byte targets), [batch, length] each."""
    starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
    rows = torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def next_byte_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of the model's next-byte predictions."""
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then a cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model,
    data: torch.Tensor,
    steps: int,
    batch: int = 16,
    length: int = 256,
    peak_lr: float = 3e-3,
    warmup: int = 50,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train `model` (a transformers causal LM) in place on `data`; the loss of every step."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    losses = []
    for step in tqdm(range(steps), desc="training", unit="step", disable=not progress):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr, warmup)
        loss = next_byte_loss(model, *windows(data, batch, length, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def bits_per_byte(
    model, data: torch.Tensor, batches: int = 8, batch: int = 16, length: int = 256, seed: int = 1
) -> float:
    """Held-out cross-entropy in bits per byte, over `batches` x `batch` seeded windows."""
    generator = torch.Generator().manual_seed(seed)
    nats = [next_byte_loss(model, *windows(data, batch, length, generator)).item() for _ in range(batches)]
    return sum(nats) / len(nats) / math.log(2)
