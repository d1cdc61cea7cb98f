"""Serving: the verify step captured in CUDA graphs (``VerifyStep``), a whole MLA decoder layer stack
(``ModelStep``), speculative decoding's accept/rollback loop, and chapter 7's measurements of them.
"""
