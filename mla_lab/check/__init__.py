"""The trust suite (``mla-lab check``): fuzzing, compute-sanitizer, long graph soaks and concurrency,
every kind of bad input, and extreme values, each against the fp32 reference or the CPU models.
"""
