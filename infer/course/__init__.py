"""How the course runs: check questions and their keys, lab exercises, the lab generator, the
notebook runner, the syllabus, the setup check and the lecture widgets. The inference library
that the course teaches is the rest of `infer/`."""
