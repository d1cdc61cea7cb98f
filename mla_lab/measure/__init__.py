"""Measuring: honest timing (CUDA-graph replays, L2 flushed, medians), the recorded results and the code
that produced them, the roofline floors, occupancy, what the compiler says each kernel costs, the probes,
and ``mla-lab bench``.
"""
