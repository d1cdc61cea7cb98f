"""The public floor: the problem, the paged cache, the fp32 reference, the input checks, the stage
registry, the extension that holds every CUDA stage, and ``attention()`` / ``verify_attention()`` over them.

Everything another program needs to call the kernels lives here; nothing here measures or teaches.
"""
