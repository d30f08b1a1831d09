"""Lectures teach, labs make: no lecture prints the source of what a lab asks students to write.

A lecture may call these functions (to show what they do) and explain them with math and prose;
it may not show their code, whether by `inspect.getsource` or pasted into a cell."""

import nbformat
import pytest

from tests.notebook_files import REPO_ROOT, committed_notebooks

# What the labs ask students to write, by the name the library gives it.
LAB_EXERCISES = {
    "01": ("naive_greedy_generate", "ttft_and_tpot_ms", "matmul_arithmetic_intensity"),
    "02": ("KVCache", "cached_greedy_generate", "kv_token_bytes", "sequences_that_fit"),
    "03": ("request_latencies_ms", "calculate_metrics", "request_goodput"),
    "04": ("merge_states", "block_state", "tiled_attention", "score_matrix_bytes"),
    "05": ("admit_continuous", "flatten"),
    "06": ("chunked_token_counts", "best_budget"),
    "07": ("stream_timing",),
    "08": (
        "PagedKVStore",
        "BlockAllocator",
        "block_name",
        "full_block_names",
        "cached_prefix",
        "_cached_prefix",
        "_prefix_hash",
        "make_room",
    ),
}
EXERCISES = [name for names in LAB_EXERCISES.values() for name in names]


def _shown_text(notebook) -> str:
    """Everything a reader sees: cell sources and every text an output carries."""
    parts = []
    for cell in notebook.cells:
        parts.append(cell.source)
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            for value in output.get("data", {}).values():
                parts.append(value if isinstance(value, str) else "")
    return "\n".join(parts)


@pytest.mark.parametrize("path", committed_notebooks("weeks"), ids=lambda p: p.name)
def test_no_lecture_prints_a_lab_exercise(path):
    notebook = nbformat.read(path, as_version=4)
    shown = _shown_text(notebook)
    for name in EXERCISES:
        for definition in (f"def {name}(", f"class {name}:", f"class {name}("):
            assert definition not in shown, (
                f"{path.relative_to(REPO_ROOT)} shows `{definition}`: a lab asks students to write {name}; "
                "explain it with math, prose and calls into the library instead"
            )
        assert f"getsource({name}" not in shown, f"{path.relative_to(REPO_ROOT)} prints the source of {name}"
