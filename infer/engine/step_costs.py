"""What one engine step costs, as a function of what it computes: the simulator's clock.

A step's time depends on its shape (infer.engine.step_record.StepShape), not on token values:
prefill tokens, decode sequences, the KV tokens the decodes read, and the query-key pairs of the
prefill chunks, plus the step itself, a fixed overhead.

Two cost models read a shape: `LinearStepCost`, fitted to step times measured on this machine
(non-negative least squares: no feature may make a step cheaper), and `RooflineStepCost`, from a
device's datasheet numbers (the step takes as long as the slower of its FLOPs at peak and its
bytes at full bandwidth, plus an overhead), for a machine we cannot run on.
"""

import itertools
from dataclasses import asdict, dataclass

import numpy as np

from infer.engine.step_record import StepShape
from infer.memory import kv_token_bytes
from infer.model import Arch
from infer.roofline import linear_parameters

FEATURES = ("steps", "prefill_tokens", "decode_seqs", "decode_kv_tokens", "prefill_attention_pairs")


def features(shape: StepShape) -> np.ndarray:
    """The shape as the linear model's inputs, in FEATURES order (1 for the step's fixed overhead)."""
    return np.array(
        [1.0, shape.prefill_tokens, shape.decode_seqs, shape.decode_kv_tokens, shape.prefill_attention_pairs]
    )


@dataclass(frozen=True)
class FixedStepCost:
    """Every step costs the same: a clock that counts steps (for comparing schedules, not times)."""

    ms: float = 1.0

    def step_ms(self, shape: StepShape) -> float:
        return self.ms


@dataclass(frozen=True)
class LinearStepCost:
    """step ms = overhead + sum of (cost per unit x units) over the shape's features."""

    ms_per_unit: dict[str, float]  # keyed by FEATURES

    def step_ms(self, shape: StepShape) -> float:
        return float(np.dot([self.ms_per_unit[f] for f in FEATURES], features(shape)))

    @classmethod
    def fit(cls, shapes: list[StepShape], step_ms: list[float]) -> "LinearStepCost":
        """Least squares with every coefficient >= 0, weighting each step by 1/time so that short
        decode steps count as much as long prefills (relative, not absolute, errors).

        With five features, the non-negative fit is found exactly by trying every subset of
        features and keeping the best fit whose coefficients are all >= 0."""
        if len(shapes) != len(step_ms) or len(shapes) < len(FEATURES):
            raise ValueError(
                f"need at least {len(FEATURES)} measured steps with one time each, "
                f"got {len(shapes)} shapes and {len(step_ms)} times"
            )
        y = np.asarray(step_ms, dtype=float)
        if not np.all(y > 0):
            raise ValueError("step times must be positive milliseconds")
        x = np.stack([features(s) for s in shapes]) / y[:, None]
        target = np.ones_like(y)  # (x . c) / y should be 1
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # columns of similar size for lstsq
        best, best_error = None, np.inf
        for size in range(1, len(FEATURES) + 1):
            for subset in itertools.combinations(range(len(FEATURES)), size):
                columns = list(subset)
                coef, *_ = np.linalg.lstsq(x[:, columns] / scale[columns], target, rcond=None)
                if np.any(coef < 0):
                    continue
                error = float(np.sum((x[:, columns] / scale[columns] @ coef - target) ** 2))
                if error < best_error:
                    best, best_error = dict(zip(columns, coef / scale[columns])), error
        return cls({name: float(best.get(i, 0.0)) for i, name in enumerate(FEATURES)})

    def relative_errors(self, shapes: list[StepShape], step_ms: list[float]) -> np.ndarray:
        predicted = np.array([self.step_ms(s) for s in shapes])
        return predicted / np.asarray(step_ms) - 1


@dataclass(frozen=True)
class RooflineStepCost:
    """A step costs overhead + max(FLOPs / peak FLOP/s, bytes / bandwidth): datasheet numbers,
    a model of an ideal device (every kernel at its roof, nothing overlapping badly)."""

    device: str  # e.g. "H100 SXM"
    peak_flops: float  # FLOP/s at the dtype
    bandwidth: float  # bytes/s of device memory
    overhead_ms: float  # per step: kernel launches, scheduling, sampling on the host
    layer_parameters: int  # weights every token multiplies, all layers
    head_parameters: int  # the output head, for sampled rows only
    attention_flops_per_pair: float  # QK^T and PV over all layers and heads, per query-key pair
    kv_bytes_per_token: float
    bytes_per_element: int

    @classmethod
    def for_model(
        cls, config, bytes_per_element: int, *, device: str, peak_flops: float, bandwidth: float, overhead_ms: float
    ) -> "RooflineStepCost":
        a = Arch.from_config(config)
        head = a.hidden_size * a.vocab_size
        return cls(
            device,
            peak_flops,
            bandwidth,
            overhead_ms,
            linear_parameters(config) - head,
            head,
            4 * a.num_layers * a.num_heads * a.head_dim,
            kv_token_bytes(a.num_layers, a.num_kv_heads, a.head_dim, bytes_per_element),
            bytes_per_element,
        )

    def step_ms(self, shape: StepShape) -> float:
        rows = shape.prefill_tokens + shape.decode_seqs
        pairs = shape.decode_kv_tokens + shape.prefill_attention_pairs
        flops = (
            2 * self.layer_parameters * rows
            + 2 * self.head_parameters * shape.sampled_rows
            + self.attention_flops_per_pair * pairs
        )
        # weights once; the decodes' caches once; each prefill token's K/V written, and its chunk's
        # earlier keys read once per chunk (a fused kernel keeps the chunk's own tile on chip)
        weight_bytes = (self.layer_parameters + self.head_parameters) * self.bytes_per_element
        kv_bytes = self.kv_bytes_per_token * (shape.decode_kv_tokens + 2 * shape.prefill_tokens)
        return self.overhead_ms + 1e3 * max(flops / self.peak_flops, (weight_bytes + kv_bytes) / self.bandwidth)

    def assumptions(self) -> str:
        return (
            f"roofline of {self.device}: {self.peak_flops / 1e12:.0f} TFLOP/s peak, "
            f"{self.bandwidth / 1e12:.2f} TB/s, {self.overhead_ms:g} ms per step, every kernel at its roof"
        )

    def as_dict(self) -> dict:
        return asdict(self)
