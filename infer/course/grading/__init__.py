"""Grading: the labs' checks, the grader that runs them on submissions, and the boundary between them.

checks.py, exercises/, answer_keys/   what a check computes (at home in the student's notebook; at
                                      grading in the checker's process, never the student's)
grader.py                             grades a folder of submissions (the checker's side)
sandbox.py                            the kernel each submission runs in
labgen.py                             makes the labs from the solutions
"""
