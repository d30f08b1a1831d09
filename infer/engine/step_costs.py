"""What one engine step costs, as a function of what it computes: the simulator's clock.

A step's time depends on its shape (infer.engine.step_record.StepShape), not on token values:
prefill tokens, decode sequences, the keys the decodes' attention computes over, and the
query-key pairs of the prefill chunks, plus the step itself, a fixed overhead. The course engine
runs all decodes in one attention call over a rectangle as wide as the longest decode's keys
(the others masked), so the linear model counts that rectangle (decodes x longest), not the sum of
their keys: fitted on the sum, it charged a batch of short contexts what its calibration's long
ones cost. A GPU's paged kernel reads only each sequence's own keys, so the roofline model counts
the sum. The engine's model also pays per prompt
chunk, apart from its tokens: each chunk is its own gather and attention call in every layer
(infer.paged_attention), and each chunk that ends a prompt samples a token. A step holds at most
one chunk that does not end its prompt, so "does the step run prompt tokens?" and "how many
prompts end in it?" count those costs.

Two cost models read a shape: `LinearStepCost`, fitted to step times measured on this machine
(non-negative least squares: no feature may make a step cheaper), and `RooflineStepCost`, from a
device's datasheet numbers (the step takes as long as the slower of its FLOPs at peak and its
bytes at full bandwidth, plus an overhead), for a machine we cannot run on.

Both charge every step of one shape the same time; the engine's steps vary around it.
`SpreadStepCost` puts that variation back: each step costs what a model says times a ratio drawn
from the calibration's measured / modelled ratios. Means hardly move, but where many requests
wait through alike steps a fixed cost gives them the same TTFT, so the simulated distribution
comes in groups with jumps between them, and a median next to a jump is off by much of it.
"""

import itertools
import random
from dataclasses import asdict, dataclass, field

import numpy as np

from infer.engine.step_record import StepShape
from infer.memory import kv_token_bytes
from infer.model import Arch
from infer.roofline import linear_parameters

FEATURES = (
    "steps",
    "prefill_steps",
    "prefill_tokens",
    "prefill_ends",
    "decode_seqs",
    "decode_padded_kv_tokens",
    "prefill_attention_pairs",
)


def features(shape: StepShape) -> np.ndarray:
    """The shape as the linear model's inputs, in FEATURES order: 1 for the step's fixed overhead,
    1 more if it runs prompt tokens (a chunk's own attention path), the prompts that end in it
    (each one more chunk, and a sampled row), then the tokens, sequences and pairs."""
    return np.array(
        [
            1.0,
            1.0 if shape.prefill_tokens else 0.0,
            shape.prefill_tokens,
            shape.sampled_rows - shape.decode_seqs,
            shape.decode_seqs,
            shape.decode_padded_kv_tokens,
            shape.prefill_attention_pairs,
        ]
    )


def step_kind(shape: StepShape) -> str:
    """ "decode" (decodes only), "prefill" (prompt tokens only) or "mixed": the step-cost errors are
    reported by kind, since TTFT is decided by the steps that run prompt tokens."""
    if not shape.prefill_tokens:
        return "decode"
    return "mixed" if shape.decode_seqs else "prefill"


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
        """Least squares with every coefficient >= 0 on relative errors, so that short decode
        steps count as much as long prefills, with the steps that run prompt tokens weighted as
        much, all together, as the decode-only ones: decode steps outnumber them in a run, yet
        they decide TTFT.

        Each error is relative to the step's modelled time, not its measured one: dividing by a
        noisy measurement favours the steps that happened to run fast, and every simulated sum
        (a TTFT, a run) comes out short. So the fit runs twice: relative to the measured times,
        then relative to what that first fit predicts."""
        if len(shapes) != len(step_ms) or len(shapes) < len(FEATURES):
            raise ValueError(
                f"need at least {len(FEATURES)} measured steps with one time each, "
                f"got {len(shapes)} shapes and {len(step_ms)} times"
            )
        y = np.asarray(step_ms, dtype=float)
        if not np.all(y > 0):
            raise ValueError("step times must be positive milliseconds")
        x = np.stack([features(s) for s in shapes])
        with_prompt = np.array([step_kind(s) != "decode" for s in shapes])
        group_weight = 1 / np.where(with_prompt, with_prompt.sum(), (~with_prompt).sum())
        first = _nonnegative_least_squares(x, y, group_weight / y**2)
        modelled = np.maximum(x @ first, 1e-3 * y.min())
        return cls(dict(zip(FEATURES, map(float, _nonnegative_least_squares(x, y, group_weight / modelled**2)))))

    def relative_errors(self, shapes: list[StepShape], step_ms: list[float]) -> np.ndarray:
        predicted = np.array([self.step_ms(s) for s in shapes])
        return predicted / np.asarray(step_ms) - 1

    def spread(self, shapes: list[StepShape], step_ms: list[float], quantiles: int = 100) -> tuple[float, ...]:
        """The measured / modelled ratios of these steps at `quantiles` evenly spaced quantiles, scaled
        to a mean of 1, so that drawing from them leaves the model's mean step time unchanged."""
        ratios = np.asarray(step_ms) / np.array([self.step_ms(s) for s in shapes])
        points = np.quantile(ratios, (np.arange(quantiles) + 0.5) / quantiles)
        return tuple(float(r) for r in points / points.mean())


def _nonnegative_least_squares(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The c >= 0 that minimizes sum(weights * (x @ c - y)^2). With seven features it is found
    exactly by trying every subset of them and keeping the best fit whose coefficients are all >= 0."""
    rows = np.sqrt(weights)[:, None]
    a, b = x * rows, y * rows[:, 0]
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)  # columns of similar size for lstsq
    best, best_error = np.zeros(x.shape[1]), np.inf
    for size in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(range(x.shape[1]), size):
            columns = list(subset)
            coef, *_ = np.linalg.lstsq(a[:, columns] / scale[columns], b, rcond=None)
            if np.any(coef < 0):
                continue
            error = float(np.sum((a[:, columns] / scale[columns] @ coef - b) ** 2))
            if error < best_error:
                best, best_error = np.zeros(x.shape[1]), error
                best[columns] = coef / scale[columns]
    return best


@dataclass
class SpreadStepCost:
    """`cost`'s time for each step, times a ratio drawn from `ratios` (LinearStepCost.spread): the
    step-to-step variation of the engine a fixed cost leaves out. Seeded, so a run repeats."""

    cost: LinearStepCost
    ratios: tuple[float, ...]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        if not self.ratios or min(self.ratios) <= 0:
            raise ValueError("the spread needs positive measured / modelled ratios (LinearStepCost.spread)")
        self._rng = random.Random(self.seed)

    def step_ms(self, shape: StepShape) -> float:
        return self.cost.step_ms(shape) * self._rng.choice(self.ratios)


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
