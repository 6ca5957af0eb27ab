"""What the benches and the tests both run: stand-in models, real-dump generators, drivers, ``hardware()``.

Why here and not in ``tests/``: a bench measures the product, and the tests prove it, with the same
stand-ins (the tiny random Qwen2s, a vLLM-named Qwen2 step, verl's FSDP engine driven on CPU). The
ladder runs ``tests → bench → entrypoints``: the tests may import this package, and nothing in
``bench/`` imports ``tests`` (``tests/test_layers.py``).
"""
