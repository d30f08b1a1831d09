"""Lab 08: deliberately wrong answers, substituted into the solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 08 (cell id -> replacement solution).
LAB08_MISTAKES = {
    "q1": "answer_q1 = (500 + 37) // 16  # the partly filled block forgotten",
    "q2": "answer_q2 = 4 * 32 / 2  # half a block each, on average: not these lengths",
    "q3": "answer_q3 = 65_536 // 520  # as if slots were only as long as the requests",
    "q4": "answer_q4 = 65_536 // 520  # as if blocks were single positions: no partly filled block",
    "q5": "answer_q5 = 9 * 600 / (10 * 640)  # the shared prompt's partial last block counted as cached",
    "q6": "answer_q6 = 45  # only the output: the prompt's keys and values were freed too",
    "q7": "answer_q7 = 2_512 // 16 - 2_512 // 64  # tables rounded down: the last, partial block of 64 forgotten",
    "block-names": [
        "    return hash(tuple(block_tokens))  # without the parent: the same tokens anywhere get one name",
        """    names, parent = [], None
    for index in range(len(token_ids) // block_size):
        parent = block_name(parent, token_ids[index * block_size : (index + 1) * block_size])
        names.append(parent)
    return names""",
    ],
    "cached-prefix": """    blocks = []
    for name in full_block_names(token_ids, block_size):  # every full block: nothing left to compute
        if name not in cache:
            break
        blocks.append(cache[name])
    return blocks""",
}
# The allocator has four blocks (__init__, allocate, append, free): only free goes wrong, handing
# shared blocks back at once.
LAB08_MISTAKES["allocator"] = [
    """        self.block_size = block_size
        self.free_blocks = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_tables = {}
        self.num_tokens = {}""",
    """        cached_on_free_list = sum(1 for block in cached_blocks if self.ref_counts[block] == 0)
        new_blocks = math.ceil(num_tokens / self.block_size) - len(cached_blocks)
        if new_blocks > len(self.free_blocks) - cached_on_free_list:
            return False
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                self.free_blocks.remove(block)
            self.ref_counts[block] += 1
        self.block_tables[seq_id] = list(cached_blocks)
        self.num_tokens[seq_id] = len(cached_blocks) * self.block_size
        return self.append(seq_id, num_tokens - self.num_tokens[seq_id])""",
    """        table = self.block_tables[seq_id]
        total = self.num_tokens[seq_id] + num_tokens
        new_blocks = math.ceil(total / self.block_size) - len(table)
        if new_blocks > len(self.free_blocks):
            return False
        for _ in range(new_blocks):
            table.append(self.free_blocks.popleft())
            self.ref_counts[table[-1]] = 1
        self.num_tokens[seq_id] = total
        return True""",
    """        for block in reversed(self.block_tables.pop(seq_id)):
            self.ref_counts[block] -= 1
            self.free_blocks.append(block)  # even while another sequence still holds it
        del self.num_tokens[seq_id]""",
]
# The sequence short of blocks steps aside itself, where the newest running sequence should go.
LAB08_MISTAKES["make-room"] = """    granted, preempted = [], []
    for request_id, cached, new in running:
        needed = math.ceil((cached + new) / block_size) - math.ceil(cached / block_size)
        if needed > free_blocks:
            preempted.append(request_id)
            free_blocks += math.ceil(cached / block_size)
            continue
        free_blocks -= needed
        granted.append(request_id)
    return granted, preempted"""
LAB08_CHECK_OF_TASK = {
    "allocator": "check-allocator",
    "block-names": "check-block-names",
    "cached-prefix": "check-cached-prefix",
    "make-room": "check-make-room",
}


def test_lab08_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "08_paged_kv.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB08_MISTAKES, LAB08_CHECK_OF_TASK, tmp_path)
