"""The book's helpers: what the chapters call (``from mla_lab.book import chapters as ch``), the article's
claims, the README's and docs' generated tables, and the experiments that swap one piece of a stage.
"""
