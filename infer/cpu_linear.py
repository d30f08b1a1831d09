"""Linear layers on pre-packed weights (week 09): oneDNN's matrix product, as vLLM's CPU backend runs it.

`F.linear` hands the CPU's matrix library each weight as the model stores it, [out, in] row by
row, and the library's kernel does not read that layout: every call it first copies the weight
into the blocked layout its inner loop wants (packing), then multiplies. A decode step calls
every linear layer once, so it repacks every weight of the model, every step. oneDNN can pack a
weight once (`torch.ops.mkldnn._reorder_linear_weight`) and multiply by the packed copy from then
on (`torch.ops.mkldnn._linear_pointwise`), which is what vLLM's CPU backend does at start-up.

`pack_linears(model)` swaps each `nn.Linear` of a float32 CPU model for a `PackedLinear` that
keeps the original weight (the state dict, a tied output head and the small calls use it) and
adds its packed copy. A call of fewer than MIN_PACKED_ROWS rows (a decode of one sequence) takes
`F.linear`: there the packed product measured slower, since oneDNN's per-call setup is then a
large part of a small product (results/09_packed_linear_cpu.json times both).

A packed weight is an opaque oneDNN tensor: it has no storage to pickle or share, so the process
that runs the model packs its own (the server's engine core does it after it starts).
"""

import torch
import torch.nn.functional as F
from torch import nn

MIN_PACKED_ROWS = 8  # below this many rows a call takes F.linear
ROWS_HINT = 32  # the rows oneDNN packs for: a decode step of 32 sequences


class PackedLinear(nn.Module):
    """`linear`'s weight and bias, with a copy of the weight packed once for oneDNN's kernel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[0] < MIN_PACKED_ROWS:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def packing_unavailable_reason(model) -> str | None:
    """None when `model`'s linear layers can be packed here, else why not."""
    weight = model.embed.weight
    if weight.device.type != "cpu":
        return f"packed linears are a CPU path (oneDNN); this model is on {weight.device}"
    if weight.dtype != torch.float32:
        return f"packed linears are built for float32 here; this model is {weight.dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    return None


@torch.no_grad()
def pack_linears(model) -> int:
    """Swap every nn.Linear of `model` for a PackedLinear, in place; how many were swapped."""
    reason = packing_unavailable_reason(model)
    if reason:
        raise ValueError(reason)
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))
                swapped += 1
    return swapped
