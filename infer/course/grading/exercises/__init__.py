"""The code checks of each lab, one module per week: each builds fresh random inputs, runs the
student's function and the library's reference on them, and prints one verdict line."""
