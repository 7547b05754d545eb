"""The project's benchmarks: one script per question, each run from the repository root as
``python -m benchmarks.NAME`` (``python -m benchmarks.NAME --help`` lists its options). ``harness`` holds what
they share: the argument parser, the output folder, machine facts, timing and JSON / Markdown output.
"""
