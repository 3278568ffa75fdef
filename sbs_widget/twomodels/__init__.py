"""Two ONNX models of one program: ``a`` (the export) and ``b`` (it simplified, optimized, converted to
float16, quantized, or run on another provider), both measured against the torch program in one run.
``compare_models`` (``compare.py``) is the entry point."""
